"""Two vLLM replicas as Ray actors serving through one state directory (``state_dir``, docs/security.md).

Each actor (``ray_replicas.Replica``, one core each) is a whole ``vllm.LLM`` with ``hybrid`` (its default
sources, ``suffix`` and ``recycle``) and the same ``state_dir``, a folder of this node both see. Each engine
process writes its own files there (``suffix/<writer>.<seq>.log``, its log segment, ``recycle/<writer>.npz``; a
``cache_salt``'s responses under ``suffix/<scope>/``) and reads its peer's new records (suffix) or merges its
peer's file (recycle) in the background every ``save_every_s`` while it serves.

The flow: replica 0 answers prompts A and replica 1 prompts B, cold; both keep stepping (short requests of a
tenant of their own) until the shared scope's segments hold every answer, appended by both writers, and the
tick tenant's folder both writers' segments; one more round of stepping lets each replica read and seed its
peer's records. Then each replica answers the other's prompts and accepts clearly
more draft tokens per output token than the other did on its first pass; the same prompts from another tenant
(another ``cache_salt``) do not get that: that pass is nearer the cold pass than the warm one (it drafts from
neither the peer's answers nor ``recycle``'s matrix, which serves the shared scope only). Greedy text is the
plain engine's (the session's baseline) in every pass. The files: one per writer and source, the same two
distinct writers in every folder, mode 0600, none removed while both serve or after both stopped.

The same through one Redis (``state_dir: redis://127.0.0.1:PORT/0``, a real ``redis-server`` the test starts
on a free loopback port; skipped where it is missing): the exchange is over when the shared scope's stream holds
every answer, appended by both writers, and the tick tenant's stream both writers' answers (never the shared
one); one more round of stepping lets each replica apply its peer's records; then the same passes and checks,
and ``recycle``'s stream holds both writers' rows.

What this does not show: replicas on other hosts or in other PID namespaces (same folder, other writer names:
tests/test_state_dir.py runs writers in separate PID namespaces), nor a purge while serving.
"""
from __future__ import annotations

import importlib.util
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from integration_tests.conftest import DRAFT_EVERY_STEP, K, REPO, spec_bench_prompts
from integration_tests.ray_replicas import (
    Replica,
    accepted_per_token,
    assert_plain_text,
    local_cluster,
    start_replicas,
)
from freespec.proposers.suffix_tree import available
from freespec.vllm_plugins.request_ids import scope_of

pytestmark = [pytest.mark.integration, pytest.mark.cluster,
              pytest.mark.skipif(not available()[0], reason="the suffix source needs arctic-inference")]

PROMPTS = spec_bench_prompts()  # the baseline's greedy prompts, in its order
# Replica 0's prompts, then replica 1's: none whose answer copies the prompt (extraction, translation,
# summarizing), where a cold pass already accepts most drafts and a warm one has little to add.
SHARES = ((0, 1, 2, 3), (4, 6, 7, 11))
SAVE_S = 0.5  # save_every_s of both sources: how often each engine saves its files and merges its peer's
ROUND_S = 2.0  # stepping between two looks at the files: a few save intervals
SYNC_TIMEOUT_S = 180.0
# Accepted draft tokens per output token a warm pass must add to the cold one (as in test_hybrid_persistence).
GAIN = 0.2
# The short requests that keep an engine stepping between passes, as a tenant of their own (their answers go
# to that scope's folder, never to the shared file).
TICK = {"prompt": "Count from one to twenty in words:", "salt": "freespec-test-ticks", "tokens": 24}
TENANT = "freespec-test-another-tenant"


def spec(state_dir: str) -> dict:
    # price_sources off: a source paused for its price would not see the requests it should save
    return {"plugin": "hybrid", "num_speculative_tokens": K, "state_dir": state_dir, "price_sources": False,
            "suffix": {"save_every_s": SAVE_S}, "recycle": {"save_every_s": SAVE_S}, **DRAFT_EVERY_STEP}


class StateDirReplica(Replica):
    def __init__(self, model: str, state_dir: str, core: str) -> None:
        super().__init__(model, spec(state_dir), core)

    def identity(self) -> tuple[str, int]:
        """The tokenizer fingerprint and vocabulary size this engine's response files are written for."""
        from freespec.vllm_plugins.adapter import tokenizer_fingerprint

        config = self.llm.model_config
        return tokenizer_fingerprint(config.tokenizer), int(config.get_vocab_size())


@pytest.fixture(scope="module")
def cluster():
    with local_cluster() as ray:
        yield ray


def writer_files(folder: Path, ext: str) -> dict[str, Path]:
    """A source folder's files by writer name (a save's temporaries, dot files, left out); a log segment's
    name, ``<writer>.<seq>.log``, by its writer too."""
    if not folder.is_dir():
        return {}
    return {p.name[: -len(ext) - 1].rsplit(".", 1)[0] if ext == "log" else p.name[: -len(ext) - 1]: p
            for p in folder.iterdir() if p.name.endswith("." + ext) and not p.name.startswith(".") and p.is_file()}


def logged(path: Path, identity: tuple[str, int]) -> list[list[int]]:
    """The responses a log segment holds, every record checked as a replica reads it (``folder_log``)."""
    from freespec.proposers.learned.folder_log import read_segment

    fingerprint, vocab = identity
    found, _, records = read_segment(str(path), vocab_size=vocab, max_tokens=1 << 20, limit=1 << 30)
    assert found == fingerprint, (path, found)
    return [tokens.tolist() for tokens, _ in records]


def holds(responses: list[list[int]], output: list[int]) -> bool:
    """Whether a stored response holds ``output``, but for its last step's tokens (a request's last accepted
    tokens reach the drafter only if it steps again, and it does not: the request is done)."""
    need = output[: max(1, len(output) - (K + 1))]
    n = len(need)
    return any(r[i : i + n] == need for r in responses for i in range(len(r) - n + 1))


def test_replicas_serve_through_one_state_directory(cluster, baseline, model_path, tmp_path):
    ray = cluster
    started = time.monotonic()
    state = tmp_path / "state"
    state.mkdir()
    replicas = start_replicas(ray, StateDirReplica, [(model_path, str(state))] * 2)
    try:
        writers = run_replicas(ray, replicas, state, baseline)
    finally:
        ray.get([r.close.remote() for r in replicas], timeout=120)
    assert_files(state, writers)  # the exit saves removed no peer's file either
    print(f"ray state_dir: test {time.monotonic() - started:.0f} s")


def redis_helpers():
    """``tests/redis_helpers.py`` (a real redis-server on a free loopback port), loaded by its path."""
    spec_ = importlib.util.spec_from_file_location("redis_helpers", REPO / "tests" / "redis_helpers.py")
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    return module


def test_replicas_serve_through_one_redis(cluster, baseline, model_path, tmp_path):
    helpers = redis_helpers()
    if helpers.redis_missing():
        pytest.skip(helpers.redis_missing())
    ray = cluster
    started = time.monotonic()
    server = helpers.RedisServer(tmp_path / "redis").start()
    try:
        replicas = start_replicas(ray, StateDirReplica, [(model_path, server.url)] * 2)
        try:
            cold = serve_cold(ray, replicas, baseline)
            writers = sync_redis(ray, replicas, server.client(), cold)
            serve_warm(ray, replicas, baseline, cold, writers)
        finally:
            ray.get([r.close.remote() for r in replicas], timeout=120)
        assert_redis(server, writers)
    finally:
        server.stop()
    print(f"ray state_dir redis: test {time.monotonic() - started:.0f} s")


def serve_cold(ray, replicas, baseline) -> list[dict]:
    """Phase 1: each replica serves its own prompts, cold."""
    cold = ray.get([r.generate.remote([PROMPTS[i] for i in share]) for r, share in zip(replicas, SHARES)])
    for i, (result, share) in enumerate(zip(cold, SHARES)):
        assert result["spec"].get("vllm:spec_decode_num_drafts", 0) > 0, f"replica {i} drafted nothing"
        assert_plain_text(baseline, share, result["token_ids"])
    return cold


def records(client, key: str) -> list[tuple[str, list[int]]]:
    """A suffix stream's records: (writer, tokens)."""
    return [(f[b"w"].decode(), np.frombuffer(f[b"t"], dtype="<i4").tolist()) for _, f in client.xrange(key)]


def sync_redis(ray, replicas, client, cold: list[dict]) -> set[str]:
    """The exchange through Redis alone: both keep stepping until the shared scope's stream holds every answer
    of both, appended by both writers, and the tick tenant's stream both writers' answers; then one more round,
    in which each replica applies what its peer appended (read within 0.1 s, applied at its next steps)."""
    from freespec.proposers.learned.redis_stream import Keys, namespace

    identity = ray.get(replicas[0].identity.remote())
    keys = Keys(namespace(*identity))
    answers = [out for result in cold for out in result["token_ids"]]
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        ray.get([r.tick.remote(ROUND_S, **TICK) for r in replicas])
        shared = records(client, keys.stream(""))
        writers = {w for w, _ in shared}
        held = sum(holds([t for _, t in shared], a) for a in answers)
        ticked = {w for w, _ in records(client, keys.stream(scope_of(TICK["salt"])))}
        if len(writers) == 2 and held == len(answers) and ticked == writers:
            break
        assert time.monotonic() < deadline, (
            f"after {SYNC_TIMEOUT_S:.0f} s of serving, the shared stream holds {held} of the {len(answers)} answers "
            f"from writers {sorted(writers)}; the tick tenant's stream has writers {sorted(ticked)}")
    ticks = ray.get([r.tick.remote(ROUND_S, **TICK) for r in replicas])
    shared = [t for _, t in records(client, keys.stream(""))]
    for tick in ticks:
        if len(tick) > 2 * (K + 1):  # long enough that holding it is no accident
            assert not holds(shared, tick), "a salted answer is in the shared scope's stream"
    return writers


def assert_redis(server, writers: set[str]) -> None:
    """Both writers appended recycle's rows (the shared scope's learning) to its stream, kept after both stopped."""
    from freespec.proposers.learned.redis_stream import list_state

    client = server.client()
    recycle = client.keys("freespec:v1:*:recycle:shared")
    assert len(recycle) == 1, recycle
    got = {f[b"w"].decode() for _, f in client.xrange(recycle[0]) if f.get(b"k") == b"rows"}
    assert got == writers, f"recycle's rows from writers {sorted(got)}, want {sorted(writers)}"
    assert any(s.name.endswith("/recycle") and s.rows for s in list_state(server.url))


def run_replicas(ray, replicas, state: Path, baseline) -> set[str]:
    cold = serve_cold(ray, replicas, baseline)
    # The exchange, through the folder alone: both keep stepping until the shared scope's segments hold every
    # answer, appended by both writers, and the tick tenant's folder both writers' segments.
    identity = ray.get(replicas[0].identity.remote())
    answers = [out for result in cold for out in result["token_ids"]]
    ticks_scope = state / "suffix" / scope_of(TICK["salt"])
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        ray.get([r.tick.remote(ROUND_S, **TICK) for r in replicas])
        files = writer_files(state / "suffix", "log")
        held = sum(holds([t for p in files.values() for t in logged(p, identity)], a) for a in answers)
        scoped = writer_files(ticks_scope, "log")
        if len(files) == 2 and held == len(answers) and set(scoped) == set(files):
            break
        assert time.monotonic() < deadline, (
            f"after {SYNC_TIMEOUT_S:.0f} s of serving, the shared scope's segments hold {held} of the "
            f"{len(answers)} answers from writers {sorted(files)}; the tick tenant's folder has {sorted(scoped)}")
    ticks = ray.get([r.tick.remote(ROUND_S, **TICK) for r in replicas])  # each reads its peer's records
    writers = set(files)
    # The tick tenant's answers are kept in its scope's folder by both writers, never in the shared segments.
    for w, p in files.items():
        shared = logged(p, identity)
        for tick in ticks:
            if len(tick) > 2 * (K + 1):  # long enough that holding it is no accident
                assert not holds(shared, tick), f"writer {w}: a salted answer is in the shared segment"
        assert any(holds(logged(scoped[w], identity), t) for t in ticks), f"writer {w}: tick tenant's segment"
    serve_warm(ray, replicas, baseline, cold, writers)
    assert_files(state, writers)
    return writers


def serve_warm(ray, replicas, baseline, cold: list[dict], writers: set[str]) -> None:
    # Phase 2: each replica serves the other's prompts, which it knows only from its peer's learning.
    warm = ray.get([r.generate.remote([PROMPTS[i] for i in share])
                    for r, share in zip(replicas, reversed(SHARES))])
    # Phase 3: the same prompts from another tenant: what the first tenant's traffic taught must not serve it.
    probe = ray.get([r.generate.remote([PROMPTS[i] for i in share], TENANT)
                     for r, share in zip(replicas, reversed(SHARES))])
    rates = []
    for i, share in enumerate(reversed(SHARES)):
        other = 1 - i
        assert_plain_text(baseline, share, warm[i]["token_ids"])
        assert_plain_text(baseline, share, probe[i]["token_ids"])
        first, again, tenant = (accepted_per_token(r) for r in (cold[other], warm[i], probe[i]))
        rates.append((round(first, 3), round(again, 3), round(tenant, 3)))
        assert again > first + GAIN, (
            f"replica {i} on replica {other}'s prompts, from its peer: {again:.3f} accepted per output "
            f"token, {first:.3f} for replica {other} cold")
        assert tenant <= (first + again) / 2, (
            f"replica {i}, another cache_salt on the same prompts: {tenant:.3f} accepted per output token, "
            f"nearer the first tenant's warm pass ({again:.3f}) than a cold pass ({first:.3f})")
    print(f"ray state_dir: engine starts {[round(r['start_seconds'], 1) for r in cold]} s; accepted per "
          f"output token (peer cold, warm from its peer, another tenant) {rates}; writers {sorted(writers)}")


def assert_files(state: Path, writers: set[str]) -> None:
    """Each source's folder holds exactly the two writers' files, readable only by the serving user."""
    assert len(writers) == 2, writers
    for source, ext in (("suffix", "log"), ("recycle", "npz")):
        files = writer_files(state / source, ext)
        assert set(files) == writers, f"{source}: writers {sorted(files)}, want {sorted(writers)}"
        for path in files.values():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{path}: mode {path.stat().st_mode:o}"
