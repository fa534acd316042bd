"""Two vLLM replicas as actors of a local Ray cluster, the way Ray Serve and KubeRay deployments run them.

Each actor is a whole ``vllm.LLM`` (``ray_replicas.Replica``) with freespec's ``recycle`` plugin in
``speculative_config``; the plugin and its options reach each replica's engine only through the entry point
and the config. The replicas learn from different prompts, then their token-recycling matrices go through
Ray's object store (each actor ``ray.put``s the arrays its engine saved to a node-local ``matrix_path``), are
merged in the driver (newest row wins) and handed back to each actor, which writes them to its node-local
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

from integration_tests.conftest import DRAFT_EVERY_STEP, K, spec_bench_prompts
from integration_tests.ray_replicas import (
    Replica,
    accepted_per_token,
    assert_plain_text,
    local_cluster,
    start_replicas,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

PROMPTS = spec_bench_prompts()  # the baseline's greedy prompts, in its order
SHARES = (list(range(0, 6)), list(range(6, 12)))  # replica 0 serves the first half, replica 1 the second
SYNC_S = 0.2  # save_every_s: how often an engine saves its matrix and checks its merge_from file


class RecycleReplica(Replica):
    """A ``recycle`` replica: its matrix at a node-local ``matrix_path``, the fleet's in ``merge_from``."""

    def __init__(self, model: str, workdir: str, core: str) -> None:
        self.matrix_path = os.path.join(workdir, "replica.npz")
        self.fleet_path = os.path.join(workdir, "fleet.npz")
        spec = {
            "plugin": "recycle", "num_speculative_tokens": K, "matrix_path": self.matrix_path,
            "merge_from": [self.fleet_path], "save_every_s": SYNC_S,
            **DRAFT_EVERY_STEP,  # what is learned is measured, not how much the machine's timing lets it draft
        }
        super().__init__(model, spec, core)

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
    with local_cluster() as ray:
        yield ray


def test_replicas_learn_from_each_other_through_the_object_store(cluster, baseline, model_path, tmp_path):
    ray = cluster
    started = time.monotonic()
    dirs = [tmp_path / f"node{i}" for i in range(2)]  # node-local storage of each replica
    for d in dirs:
        d.mkdir()
    replicas = start_replicas(ray, RecycleReplica, [(model_path, str(d)) for d in dirs])
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
