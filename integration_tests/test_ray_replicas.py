"""Two vLLM replicas as actors of a local Ray cluster, the way Ray Serve and KubeRay deployments run them.

Each actor builds a whole ``vllm.LLM`` (vLLM's own Ray executor refuses the CPU platform, and a replica
with one worker does not use it anyway) with freespec's ``recycle`` plugin in ``speculative_config``; the
plugin and its options reach each replica's engine only through the entry point and the config. The
replicas learn from different prompts, then their token-recycling matrices go through Ray's object store
(each actor ``ray.put``s the arrays its engine saved to a node-local ``matrix_path``), are merged in the
driver (newest row wins) and handed back to each actor, which writes them to its node-local
``merge_from`` file; the engine merges the file in at its next check. No filesystem is shared.

Checked: both engines found the plugin and its options (drafts accepted, the matrix saved where the
options say); greedy text is the plain engine's (the session's shared baseline); after the exchange each
replica drafts better on the other's prompts than the other did cold, and, replayed offline on the same
text, the merged matrix predicts the next token more often than the replica's own.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from integration_tests.conftest import K, REPO, spec_bench_prompts
from freespec.testing.lossless import greedy_mismatches

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PROMPTS = spec_bench_prompts()  # the baseline's greedy prompts, in its order
SHARES = (list(range(0, 6)), list(range(6, 12)))  # replica 0 serves the first half, replica 1 the second
TOKENS = 48  # shorter than the baseline's 96: its first 48 tokens are compared
SYNC_S = 0.2  # save_every_s: how often an engine saves its matrix and checks its merge_from file


class Replica:
    """One vLLM engine with freespec inside a Ray actor (a Ray Serve replica, minus the HTTP)."""

    def __init__(self, model: str, workdir: str, core: str) -> None:
        # One core per replica (Ray sets OMP_NUM_THREADS=1 for a one-CPU actor); read by vLLM's CPU worker.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = core
        from vllm import LLM

        self.matrix_path = os.path.join(workdir, "replica.npz")
        self.fleet_path = os.path.join(workdir, "fleet.npz")
        spec = {
            "plugin": "recycle", "num_speculative_tokens": K, "matrix_path": self.matrix_path,
            "merge_from": [self.fleet_path], "save_every_s": SYNC_S,
        }
        started = time.monotonic()
        self.llm = LLM(
            model=model, dtype="float32", speculative_config=spec, max_model_len=2048, enforce_eager=True,
            disable_log_stats=False, seed=0, kv_cache_memory_bytes=256 << 20,
        )
        self.start_seconds = time.monotonic() - started

    def generate(self, prompts: list[str]) -> dict:
        from vllm import SamplingParams

        from freespec.testing.engine_run import spec_counters

        before = spec_counters(self.llm)
        outputs = self.llm.chat(
            [[{"role": "user", "content": p}] for p in prompts],
            SamplingParams(max_tokens=TOKENS, temperature=0.0), use_tqdm=False,
        )
        after = spec_counters(self.llm)
        return {
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "spec": {k: after[k] - before.get(k, 0) for k in after},
            "start_seconds": self.start_seconds,
        }

    def close(self) -> None:
        """Stop the engine (its engine-core process) before Ray kills this actor's process."""
        import gc

        del self.llm
        gc.collect()

    def export_matrix(self):
        """The matrix this replica's engine last saved, as numpy arrays in Ray's object store."""
        import ray

        from freespec.proposers.recycle.matrix import read_matrix

        m = read_matrix(self.matrix_path)
        return [ray.put({"ids": m.ids, "probs": m.probs, "stamps": m.stamps, "tokenizer": m.tokenizer,
                         "model": m.model, "updates": m.updates})]

    def import_matrix(self, refs) -> None:
        """Write the fleet's merged matrix (a Ray object) to this replica's merge_from file."""
        import ray

        from freespec.proposers.recycle.matrix import write_matrix

        write_matrix(self.fleet_path, as_matrix(ray.get(refs[0])))


def as_matrix(arrays: dict):
    from freespec.proposers.recycle.matrix import Matrix

    return Matrix(arrays["ids"], arrays["probs"], arrays["stamps"], arrays["tokenizer"], arrays["model"],
                  arrays["updates"])


def accepted_per_token(result: dict) -> float:
    tokens = sum(len(t) for t in result["token_ids"])
    return result["spec"].get("vllm:spec_decode_num_accepted_tokens", 0) / tokens


def assert_plain_text(baseline, indices, got) -> None:
    base = baseline["greedy"]
    problems = greedy_mismatches(
        [base["token_ids"][i][:TOKENS] for i in indices], [base["top_logprobs"][i][:TOKENS] for i in indices], got
    )
    assert not problems, "\n".join(problems)


def top1_hits(ids: np.ndarray, outputs: list[list[int]]) -> float:
    """Share of output positions whose token is the matrix's top candidate after the token before it."""
    hits = total = 0
    for out in outputs:
        prev, nxt = np.asarray(out[:-1]), np.asarray(out[1:])
        hits += int((ids[prev, 0] == nxt).sum())
        total += len(nxt)
    return hits / total


@pytest.fixture(scope="module")
def cluster():
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing outside this machine is contacted
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=100 << 20, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        yield ray
    finally:
        ray.shutdown()


def test_replicas_learn_from_each_other_through_the_object_store(cluster, baseline, model_path, tmp_path):
    ray = cluster
    started = time.monotonic()
    actor = ray.remote(num_cpus=1)(Replica)
    dirs = [tmp_path / f"node{i}" for i in range(2)]  # node-local storage of each replica
    for d in dirs:
        d.mkdir()
    replicas = [actor.remote(model_path, str(d), str(i)) for i, d in enumerate(dirs)]
    try:
        run_replicas(ray, replicas, dirs, baseline)
    finally:
        ray.get([r.close.remote() for r in replicas], timeout=120)
    print(f"ray replicas: test {time.monotonic() - started:.0f} s")


def run_replicas(ray, replicas, dirs, baseline) -> None:

    # Phase 1: each replica serves its own prompts, cold.
    cold = ray.get([r.generate.remote([PROMPTS[i] for i in share]) for r, share in zip(replicas, SHARES)])
    for i, (result, share) in enumerate(zip(cold, SHARES)):
        assert result["spec"].get("vllm:spec_decode_num_drafts", 0) > 0, f"replica {i} drafted nothing"
        assert result["spec"].get("vllm:spec_decode_num_accepted_tokens", 0) > 0, f"replica {i}: none accepted"
        assert (dirs[i] / "replica.npz").exists(), f"replica {i} did not save its matrix at matrix_path"
        assert_plain_text(baseline, share, result["token_ids"])

    # The exchange: arrays out through the object store, merged in the driver, back to every replica.
    from freespec.proposers.recycle.matrix import Matrix, check_compatible, merge_into

    own = [as_matrix(ray.get(ray.get(r.export_matrix.remote())[0])) for r in replicas]
    fleet = Matrix.empty(own[0].vocab_size, own[0].candidates, own[0].tokenizer, own[0].model)
    for i, m in enumerate(own):
        check_compatible(m, vocab_size=fleet.vocab_size, candidates=fleet.candidates, tokenizer=fleet.tokenizer,
                         what="replica", path=str(i))
        assert merge_into(fleet, m) > 0
    fleet_ref = ray.put({"ids": fleet.ids, "probs": fleet.probs, "stamps": fleet.stamps,
                         "tokenizer": fleet.tokenizer, "model": fleet.model, "updates": fleet.updates})
    ray.get([r.import_matrix.remote([fleet_ref]) for r in replicas])

    # Phase 2: each replica serves the other's prompts, with the fleet's matrix merged in.
    warm = ray.get([r.generate.remote([PROMPTS[i] for i in share])
                    for r, share in zip(replicas, reversed(SHARES))])
    for i, (result, share) in enumerate(zip(warm, reversed(SHARES))):
        assert_plain_text(baseline, share, result["token_ids"])
        other = 1 - i
        before, after = accepted_per_token(cold[other]), accepted_per_token(result)
        assert after > before + 0.05, (
            f"replica {i} on replica {other}'s prompts: {after:.3f} accepted per token with the fleet matrix, "
            f"{before:.3f} for replica {other} cold"
        )
        # The same text replayed offline: the merged matrix predicts it better than the replica's own.
        outputs = cold[other]["token_ids"]
        assert top1_hits(fleet.ids, outputs) > top1_hits(own[i].ids, outputs) + 0.05
    print(f"ray replicas: engine starts {[round(r['start_seconds'], 1) for r in cold]} s; accepted per token cold "
          f"{[round(accepted_per_token(r), 3) for r in cold]}, after the exchange "
          f"{[round(accepted_per_token(r), 3) for r in warm]}")
