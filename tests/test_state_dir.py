"""One state directory (option ``state_dir``): every writer its own files, named so that replicas in separate PID
namespaces, ranks and restarts never collide; readers merge their peers'; files mode 0600; old files go by age
only; a killed writer loses at most its last save interval; a failed final save says so plainly.

Real processes where it matters: writers in separate PID namespaces (``unshare --pid --fork``, as root), a writer
SIGKILLed at a random point, a read-only folder (a read-only bind mount in a private mount namespace).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
from freespec.proposers.learned import state_dir
from freespec.proposers.api import EngineInfo, Row
from freespec.proposers.learned.folder_log import EXT, FolderLog
from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer, available

REPO = Path(__file__).resolve().parents[1]
INFO = EngineInfo(vocab_size=1000, model="m", tokenizer_fingerprint=lambda: "sha256:tok-a")
ROOT = os.geteuid() == 0 and shutil.which("unshare") is not None
needs_root = pytest.mark.skipif(not ROOT, reason="needs root and unshare (separate PID or mount namespaces)")

# A writer process: its own segment in <dir>/suffix, ROUNDS rounds of adding responses, appending them and reading
# its peers' (one file round of the folder log). A response holds its round's number as a token id, so the
# vocabulary is wider than any round a writer reaches (a token id past it is not learned).
WIDE = 1 << 20
WRITER = """
import sys, time
import numpy as np
from freespec.proposers.learned import state_dir
from freespec.proposers.learned.folder_log import FolderLog
WIDE = 1 << 20

folder, index, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
log = FolderLog(folder, fingerprint="sha256:tok-a", vocab_size=WIDE, max_responses=100000, max_tokens=10**7,
                interval_s=0)
for r in range(rounds):
    for i in range(20):
        log.add("", np.array([index, r, i, 7, 8, 9], dtype=np.int32))
    log.sync()
    log.take()
    print("saved", r, flush=True)
log.close()
print("held", len(log.held), flush=True)
print("writer", state_dir.writer_id(), flush=True)
"""


def main(argv: list[str]) -> int:
    """``freespec state ...`` as the command runs it (only its own subcommand: importing every one is slow)."""
    import argparse

    from freespec.cli import state as state_cli

    parser = argparse.ArgumentParser(prog="freespec")
    state_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def run_writer(folder: Path, index: int, rounds: int, pid_namespace: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-c", WRITER, str(folder), str(index), str(rounds)]
    if pid_namespace:
        cmd = ["unshare", "--pid", "--fork", "--kill-child", *cmd]  # the writer dies with unshare
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def responses_in(folder: Path, scope: str = "", vocab_size: int = 1000) -> set[tuple[int, ...]]:
    """Every response of ``scope`` (the shared one: no cache_salt) in every segment of the folder's suffix/ (a fresh
    reader of all of them, checking each record: a damaged one would be refused and counted)."""
    with patch.object(state_dir, "START_FILES", 10_000):
        log = FolderLog(str(folder), fingerprint="sha256:tok-a", vocab_size=vocab_size, max_responses=100000,
                        max_tokens=10**7, interval_s=0, writer="reader.0.0")
    log.close()
    assert log.refused == 0
    return {tuple(int(t) for t in r) for s, r in log.loaded if s == scope}


def segment(folder: Path, writer: str, scope: str = "") -> Path:
    """A writer's first segment of ``scope`` (``folder_log``)."""
    return folder / "suffix" / scope / f"{writer}.1{EXT}"


@needs_root
def test_writers_in_separate_pid_namespaces_on_one_folder_lose_nothing(tmp_path):
    procs = [run_writer(tmp_path, i, 4, pid_namespace=True) for i in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    writers = [o[0].split("writer ")[-1].strip() for o in outs]
    assert len(set(writers)) == 3 and all(w.endswith(".1") for w in writers)  # each is pid 1 in its namespace
    files = sorted((tmp_path / "suffix").glob(f"*{EXT}"))
    assert len(files) == 3 and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert not list((tmp_path / "suffix").glob(".*.tmp"))  # no temporary left, none removed under a writer
    want = {(i, r, k, 7, 8, 9) for i in range(3) for r in range(4) for k in range(20)}
    assert responses_in(tmp_path, vocab_size=WIDE) == want
    held = [int(o[0].split("held ")[-1].split()[0]) for o in outs]
    assert max(held) >= 4 * 20 + 2 * 20  # the last writer to finish read the others' appends too


@needs_root
def test_a_writer_killed_at_a_random_point_loses_at_most_its_last_save_interval(tmp_path):
    rng = random.Random(66)
    for trial in range(3):
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        proc = run_writer(folder, 0, 10_000, pid_namespace=True)
        saved = -1
        deadline = time.monotonic() + rng.uniform(1.5, 4.0)
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("saved"):
                saved = int(line.split()[1])
        proc.send_signal(signal.SIGKILL)  # unshare dies, and --kill-child SIGKILLs the writer
        proc.wait(timeout=30)
        files = sorted((folder / "suffix").glob("*"))
        time.sleep(0.5)
        assert sorted((folder / "suffix").glob("*")) == files and all(  # the writer is gone: nothing changes
            f.stat().st_mtime < time.time() - 0.4 for f in files)
        got = responses_in(folder, vocab_size=WIDE)  # every file loads: none is corrupt
        assert {(0, r, k, 7, 8, 9) for r in range(saved + 1) for k in range(20)} <= got, (trial, saved)


@needs_root
def test_a_failed_final_save_in_a_read_only_folder_is_said_plainly(tmp_path):
    script = (
        "import logging, sys, numpy as np\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from freespec.proposers.learned.response_store import ResponseStore\n"
        "s = ResponseStore(sys.argv[1] + '/r.bin', fingerprint='f', vocab_size=1000)\n"
        "s.add(np.array([1, 2, 3], dtype=np.int32))\n"
        "s.close()\n"
    )
    shell = (f"mount --bind {tmp_path} {tmp_path} && mount -o remount,bind,ro {tmp_path} && "
             f"exec {sys.executable} -c \"$0\" {tmp_path}")
    out = subprocess.run(["unshare", "--mount", "sh", "-c", shell, script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the final save of the response store" in out.stderr and "are lost" in out.stderr, out.stderr[-2000:]
    assert "tries again" not in out.stderr


def test_the_writer_name_is_host_pid_namespace_and_pid():
    host, ns, pid = state_dir.writer_id().rsplit(".", 2)
    assert pid == str(os.getpid()) and ns == os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]") and host


def test_old_files_go_by_age_and_peers_older_than_the_bound_are_not_merged(tmp_path):
    folder = Path(state_dir.source_dir(str(tmp_path), "suffix"))
    old, fresh, own = folder / "a.1.1.bin", folder / "b.1.1.bin", folder / "c.1.1.bin"
    for f in (old, fresh, own):
        f.write_bytes(b"x")
    os.utime(old, (time.time() - 100, time.time() - 100))
    assert state_dir.peer_files(str(own), max_age_s=50) == [str(fresh)]
    assert state_dir.sweep_old(str(folder), max_age_s=50) == 1
    assert not old.exists() and fresh.exists() and own.exists()


def serve(p: SuffixTreeProposer, key: int, seq: np.ndarray) -> None:
    p.propose([Row(key, seq[:4], 1)])
    p.propose([Row(key, seq, len(seq) - 4)])
    p.release(key)


def test_a_replica_drafts_from_what_another_saved_in_the_state_directory(tmp_path, monkeypatch, caplog):
    info = dataclasses.replace(INFO, state_dir=str(tmp_path))
    answer = np.arange(500, 520, dtype=np.int32)
    monkeypatch.setattr(state_dir, "writer_id", lambda: "host-a.1.1")
    first = SuffixTreeProposer(SuffixOptions(min_token_prob=0.0), 4)
    first.bind(info)
    serve(first, 1, np.concatenate([[1, 2, 3], answer]).astype(np.int32))
    first.close()
    saved = segment(tmp_path, "host-a.1.1")
    assert saved.stat().st_mode & 0o777 == 0o600
    monkeypatch.setattr(state_dir, "writer_id", lambda: "host-b.1.1")
    second = SuffixTreeProposer(SuffixOptions(min_token_prob=0.0), 4)
    with caplog.at_level(logging.WARNING, logger="freespec"):
        second.bind(info)
    assert "state_dir replaces" not in caplog.text  # the new option warns of nothing
    context = np.concatenate([[9, 9], answer[:6]]).astype(np.int32)
    assert second.propose([Row(5, context, 1)])[0][:3] == answer[6:9].tolist()


def test_the_old_per_source_options_still_work_with_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(state_dir, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="freespec"):
        for _ in range(2):
            p = SuffixTreeProposer(SuffixOptions(responses_path=str(tmp_path / "r.bin")), 4)
            p.bind(INFO)
            p.close()
    assert caplog.text.count("state_dir replaces") == 1 and (tmp_path / "r.bin").exists()


def test_the_state_dir_option_is_checked_naming_it(tmp_path):
    from freespec.vllm_plugins.frontend import translate

    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4, "state_dir": str(tmp_path)}, None)
    assert json.dumps(extra)  # accepted
    # a missing folder is made at start (mode 0700); one whose parent is missing, or a file, is refused
    translate({"plugin": "copy", "num_speculative_tokens": 4, "state_dir": str(tmp_path / "missing")}, None)
    (tmp_path / "a-file").write_text("")
    for bad in (tmp_path / "no" / "parent", tmp_path / "a-file"):
        with pytest.raises(Exception, match="'state_dir'"):
            translate({"plugin": "copy", "num_speculative_tokens": 4, "state_dir": str(bad)}, None)
    with pytest.raises(Exception, match="'state_max_age_days'"):
        translate({"plugin": "copy", "num_speculative_tokens": 4, "state_max_age_days": 0}, None)


pytestmark = pytest.mark.skipif(not available()[0], reason="needs arctic-inference")


def test_freespec_state_lists_and_purges_by_age_or_writer_and_nothing_outside_the_sources_folders(tmp_path, capsys):
    suffix = Path(state_dir.source_dir(str(tmp_path), "suffix"))
    recycle = Path(state_dir.source_dir(str(tmp_path), "recycle"))
    old, mine, other = suffix / "h.1.10.bin", recycle / "h.1.11.npz", suffix / "h.1.12.bin"
    for f in (old, mine, other):
        f.write_bytes(b"x")
    stray = tmp_path / "notes.txt"
    stray.write_text("the operator's")
    os.utime(old, (time.time() - 3 * 86_400, time.time() - 3 * 86_400))
    assert main(["state", "list", str(tmp_path)]) == 0 and "3 file(s)" in capsys.readouterr().out
    assert main(["state", "purge", str(tmp_path), "--older-than", "2"]) == 0
    assert not old.exists() and mine.exists() and other.exists()
    assert main(["state", "purge", str(tmp_path), "--writer", "h.1.11"]) == 0
    assert not mine.exists() and other.exists()
    assert main(["state", "purge", str(tmp_path)]) == 0
    assert not other.exists() and stray.exists()
    with pytest.raises(ValueError, match="is not a folder"):
        main(["state", "list", str(tmp_path / "missing")])


def test_freespec_serve_puts_the_state_dir_into_the_speculative_config():
    from freespec.cli.serve import with_state_dir

    spec = '{"plugin": "hybrid", "num_speculative_tokens": 8}'
    got = with_state_dir(["m", "--speculative-config", spec, "--state-dir", "/srv/state"])
    assert got[:2] == ["m", "--speculative-config"] and json.loads(got[2])["state_dir"] == "/srv/state"
    assert with_state_dir(["m", "--speculative-config.plugin", "copy", "--state-dir=/s"])[-1] == \
        "--speculative-config.state_dir=/s"
    assert with_state_dir(["m", "--speculative-config", spec]) == ["m", "--speculative-config", spec]
    with pytest.raises(ValueError, match="--state-dir needs a freespec --speculative-config"):
        with_state_dir(["m", "--state-dir", "/s"])


def test_a_bad_peer_file_in_the_state_directory_never_stops_a_start(tmp_path, monkeypatch, caplog):
    info = dataclasses.replace(INFO, state_dir=str(tmp_path))
    (Path(state_dir.source_dir(str(tmp_path), "suffix")) / f"peer.1.1.1{EXT}").write_bytes(b"not a segment")
    with caplog.at_level(logging.WARNING, logger="freespec"):
        SuffixTreeProposer(SuffixOptions(), 4).bind(info)
    assert "a segment refused" in caplog.text and "not a segment" in caplog.text


def test_recycles_matrix_is_shared_through_the_state_directory(tmp_path, monkeypatch):
    from freespec.proposers.api import ScoredPositions
    from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer

    info = dataclasses.replace(INFO, state_dir=str(tmp_path))
    monkeypatch.setattr(state_dir, "writer_id", lambda: "host-a.1.1")
    first = RecycleProposer(RecycleOptions(adaptive=False), 4)
    first.bind(info)
    ids = np.asarray([[421, 422]], dtype=np.int32)
    first.observe(ScoredPositions(np.asarray([5], dtype=np.int32), ids, np.full(ids.shape, 0.9, np.float32)))
    first.close()
    saved = tmp_path / "recycle" / "host-a.1.1.npz"
    assert saved.stat().st_mode & 0o777 == 0o600
    monkeypatch.setattr(state_dir, "writer_id", lambda: "host-b.1.1")
    second = RecycleProposer(RecycleOptions(adaptive=False), 4)
    second.bind(info)
    assert second.propose([Row(1, np.asarray([3, 4, 5], dtype=np.int32), 1)])[0][:1] == [421]
    second.close()


def scoped_source(info, writer: str, monkeypatch, **options) -> SuffixTreeProposer:
    monkeypatch.setattr(state_dir, "writer_id", lambda: writer)
    p = SuffixTreeProposer(SuffixOptions(min_token_prob=0.0, **options), 4)
    p.bind(info)
    return p


def test_a_tenants_responses_persist_in_its_own_scope_and_purge_removes_them_everywhere(tmp_path, monkeypatch):
    from freespec.vllm_plugins.request_ids import scope_of

    info = dataclasses.replace(INFO, state_dir=str(tmp_path))
    x, y = scope_of("tenant-x"), scope_of("tenant-y")
    answer = np.arange(600, 620, dtype=np.int32)
    seq = np.concatenate([[1, 2, 3], answer]).astype(np.int32)
    context = np.concatenate([[9, 9], answer[:6]]).astype(np.int32)
    first = scoped_source(info, "host-a.1.1", monkeypatch)
    first.propose([Row(1, seq[:4], 1, x)])
    first.propose([Row(1, seq, len(seq) - 4, x)])
    first.release(1)
    first.close()
    mine = segment(tmp_path, "host-a.1.1", x)
    assert mine.stat().st_mode & 0o777 == 0o600
    assert responses_in(tmp_path) == set() and responses_in(tmp_path, x)  # nothing of tenant x in the shared scope

    def drafts(p, scope, key):
        out = p.propose([Row(key, context, 1, scope)])[0]
        p.release(key)
        return out

    running = scoped_source(info, "host-b.1.1", monkeypatch, save_every_s=0.01)  # a replica that loaded x
    assert drafts(running, x, 5)[:3] == answer[6:9].tolist()
    assert drafts(running, y, 6) == [] and drafts(running, "", 7) == []  # another tenant, and no salt: cold
    running.learned.add(x, answer[::-1].copy())  # it holds x in memory and on disk
    running.learned.sync()
    assert segment(tmp_path, "host-b.1.1", x).exists()

    assert main(["state", "purge", str(tmp_path), "--scope", "tenant-x"]) == 0
    assert not mine.exists()
    # Its next saves find the tombstone: the replica forgets x and removes its own file of it.
    deadline = time.monotonic() + 10
    while x in running._cached and time.monotonic() < deadline:
        running._last_save = 0.0
        running.candidates([])
        time.sleep(0.05)
    assert not segment(tmp_path, "host-b.1.1", x).exists() and not (tmp_path / "suffix" / x).exists()
    # Checked first: a request of x after the purge is learned afresh, and its segment may be written at once.
    assert x not in running._cached and drafts(running, x, 8) == []
    running.close()
    fresh = scoped_source(info, "host-c.1.1", monkeypatch)  # and a start loads none of it
    assert drafts(fresh, x, 9) == []


@pytest.mark.parametrize("salted", [True, False])
def test_a_running_replica_merges_a_tenants_responses_another_saved_since_it_started(tmp_path, monkeypatch, salted):
    from freespec.vllm_plugins.request_ids import scope_of

    info = dataclasses.replace(INFO, state_dir=str(tmp_path))
    x = scope_of("tenant-x") if salted else ""  # the shared scope's peers are listed in the background too
    answer = np.arange(700, 720, dtype=np.int32)
    context = np.concatenate([[9, 9], answer[:6]]).astype(np.int32)
    # prompt_tail 0: request 5 asks request 6's prompt, and with its tail learned its one-token answer would
    # be the match (the tail's own test: test_suffix_source.py)
    running = scoped_source(info, "host-b.1.1", monkeypatch, save_every_s=0.01, prompt_tail=0)
    assert running.propose([Row(5, context, 1, x)])[0] == []
    running.release(5)
    other = scoped_source(info, "host-a.1.1", monkeypatch)
    seq = np.concatenate([[1, 2, 3], answer]).astype(np.int32)
    other.propose([Row(1, seq[:4], 1, x)])
    other.propose([Row(1, seq, len(seq) - 4, x)])
    other.release(1)
    other.close()
    deadline, got = time.monotonic() + 10, []
    while time.monotonic() < deadline and not got:
        running._last_save = 0.0
        running.candidates([])
        got = running.propose([Row(6, context, 1, x)])[0]
        running.release(6)
        time.sleep(0.05)
    assert got[:3] == answer[6:9].tolist()
    assert running.propose([Row(7, context, 1, scope_of("tenant-y"))])[0] == []  # still only this scope's
    running.close()


SMOLLM2 = Path("~/.cache/freespec/models/smollm2-135m-instruct").expanduser()


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").exists(), reason="needs the SmolLM2 tokenizer")
def test_the_adapter_hands_the_state_dir_to_every_learned_source_of_hybrid(tmp_path):
    from adapter_helpers import adapter_for

    adapter = adapter_for({"plugin": "hybrid", "num_speculative_tokens": 4, "sources": ["suffix", "recycle"],
                           "state_dir": str(tmp_path), "state_max_age_days": 7},
                          tokenizer=str(SMOLLM2), vocab_size=49152)
    suffix = adapter.proposer.sources["suffix"]
    suffix.learned.add("", np.arange(10, 20, dtype=np.int32))
    for source in adapter.proposer.sources.values():
        source.close()
    mine = state_dir.writer_id()
    assert isinstance(suffix.learned, FolderLog) and suffix.learned.root == str(tmp_path)
    assert segment(tmp_path, mine).exists() and (tmp_path / "recycle" / f"{mine}.npz").exists()


def test_hybrids_copy_source_is_filled_from_the_suffix_sources_files_and_forgets_a_purged_scope(
        tmp_path, monkeypatch, caplog):
    from freespec.proposers.hybrid import HybridOptions, HybridProposer
    from freespec.vllm_plugins.request_ids import scope_of

    info = dataclasses.replace(INFO, state_dir=str(tmp_path))
    x = scope_of("tenant-x")
    answer = np.arange(700, 720, dtype=np.int32)
    seq = np.concatenate([[1, 2, 3], answer]).astype(np.int32)
    first = scoped_source(info, "host-a.1.1", monkeypatch)
    for key, scope in ((1, ""), (2, x)):
        first.propose([Row(key, seq[:4], 1, scope)])
        first.propose([Row(key, seq, len(seq) - 4, scope)])
        first.release(key)
    first.close()

    def hybrid(writer):
        monkeypatch.setattr(state_dir, "writer_id", lambda: writer)
        p = HybridProposer(HybridOptions(sources=("suffix", "copy"), suffix={"save_every_s": 0.01}), 4)
        with caplog.at_level(logging.WARNING, logger="freespec"):
            p.bind(info)
        return p

    restarted = hybrid("host-b.1.1")
    assert "copy keeps its pool" not in caplog.text  # its pool is the suffix source's files now
    copy = restarted.sources["copy"]
    context = np.concatenate([[9, 9], answer[:6]]).astype(np.int32)
    for scope in ("", x):  # each scope's responses in its own pool: copy drafts them after a restart
        drafted = copy.propose([Row(3, context, 1, scope)])[0]
        copy.release(3)
        assert drafted and drafted == answer[6:6 + len(drafted)].tolist()
    assert copy.propose([Row(4, context, 1, scope_of("tenant-y"))])[0] == []  # never another tenant's
    copy.release(4)

    assert main(["state", "purge", str(tmp_path), "--scope", "tenant-x"]) == 0
    suffix = restarted.sources["suffix"]
    deadline = time.monotonic() + 10
    while x in suffix._cached and time.monotonic() < deadline:
        suffix._last_save = 0.0
        suffix.candidates([])
        time.sleep(0.05)
    assert copy.propose([Row(5, context, 1, x)])[0] == []  # the purged tenant is forgotten by copy too
    copy.release(5)
    restarted.sources["suffix"].close()


def test_all_writers_files_are_cut_to_the_directory_bound_oldest_first_never_a_live_ones(tmp_path, caplog):
    now = time.time()
    scope = "a" * 32

    def put(rel: str, size: int, age_s: float) -> Path:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        os.utime(path, (now - age_s, now - age_s))
        return path

    oldest = put("suffix/host-a.1.1.bin", 400, 9 * 86_400)  # restarted writers' leftovers
    older = put(f"suffix/{scope}/host-a.1.1.bin", 300, 8 * 86_400)
    old = put("recycle/host-b.1.2.npz", 300, 2 * 86_400)
    live = put("suffix/host-c.1.3.bin", 500, 60)  # written a minute ago: a live writer's
    tombstone = put("suffix/purged/" + scope, 0, 5 * 86_400)
    assert state_dir.cap_total(str(tmp_path), 2_000, now=now) == []  # within the bound: nothing goes
    gone = state_dir.cap_total(str(tmp_path), 900, now=now)
    assert gone == [str(oldest), str(older)]  # oldest first, whoever wrote them, until within it
    assert old.exists() and live.exists() and tombstone.exists()
    with caplog.at_level(logging.WARNING, logger="freespec"):
        gone = state_dir.cap_total(str(tmp_path), 100, now=now)
    assert gone == [str(old)] and live.exists()  # never one written in the last hour
    assert "over state_dir_max_mb" in caplog.text


def test_the_adapter_cuts_the_directory_at_start_and_the_option_is_checked(tmp_path):
    from adapter_helpers import adapter_for

    from freespec.vllm_plugins.adapter_options import adapter_options

    leftover = tmp_path / "suffix" / "gone-host.1.1.bin"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"x" * 2_000_000)
    os.utime(leftover, (time.time() - 7_200, time.time() - 7_200))
    adapter = adapter_for({"plugin": "hybrid", "num_speculative_tokens": 4, "sources": ["suffix"],
                           "state_dir": str(tmp_path), "state_dir_max_mb": 1.0},
                          tokenizer=str(SMOLLM2), vocab_size=49152)
    adapter.proposer.sources["suffix"].close()
    assert not leftover.exists()
    with pytest.raises(ValueError, match=r"'state_dir_max_mb' must be a number in \(0, 1e\+07\], got 0"):
        adapter_options({"state_dir_max_mb": 0.0})
