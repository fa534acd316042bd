"""Which worker's drafts vLLM takes, and so which rank builds the proposer (seam ``draft_rank``).

Every tensor-parallel rank of the last pipeline stage builds the ``custom_class`` proposer, but vLLM
uses the drafts of one worker only (``probes.probe_draft_rank`` checks where). The rule is kept free of
vLLM (``decide_draft_rank``) so it can be tested; ``draft_rank`` reads the ranks in the worker.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import freespec.vllm_plugins.probes as probes
from freespec.vllm_plugins.probes import ProbeResult


@dataclass(frozen=True)
class DraftRank:
    """Whether vLLM uses the drafts of the worker asking, and which worker that is (for its log line)."""

    drafts: bool
    rank: str
    why: str


def decide_draft_rank(
    tp_rank: int, tp_size: int, pcp_rank: int, pcp_size: int, probe: ProbeResult, backend: str | None = None
) -> DraftRank:
    """The rule, kept free of vLLM so it can be tested: only TP rank 0 / PCP rank 0 drafts."""
    rank = f"TP rank {tp_rank} of {tp_size}"
    if pcp_size > 1:
        rank += f", PCP rank {pcp_rank} of {pcp_size}"
    if backend == "external_launcher":  # torchrun: each rank is an engine of its own and uses its own drafts
        return DraftRank(True, rank, "external_launcher: every rank's engine uses its own drafts")
    if not probe.ok:  # drafting everywhere is only wasteful; drafting nowhere would silently lose the speed-up
        return DraftRank(True, rank, f"every rank drafts, since {probe.seam} moved: {probe.detail}")
    if tp_rank == 0 and pcp_rank == 0:
        return DraftRank(True, rank, "vLLM takes its drafts from this rank")
    return DraftRank(False, rank, "vLLM takes drafts from TP rank 0 only")


def draft_rank(vllm_config) -> DraftRank:
    """Seam ``draft_rank``: whether this worker's drafts reach vLLM (called in the worker, once ranks are set)."""
    backend = getattr(getattr(vllm_config, "parallel_config", None), "distributed_executor_backend", None)
    try:
        parallel_state = importlib.import_module("vllm.distributed.parallel_state")
        if not parallel_state.model_parallel_is_initialized():  # built outside a vLLM worker: the only rank
            return DraftRank(True, "single process", "no vLLM worker ranks")
        tp, pcp = parallel_state.get_tp_group(), parallel_state.get_pcp_group()
        ranks = (tp.rank_in_group, tp.world_size, pcp.rank_in_group, pcp.world_size)
    except Exception as e:
        return DraftRank(True, "rank unknown", f"every rank drafts, since reading the rank failed ({e!r})")
    if ranks[1] * ranks[3] == 1:
        probe = ProbeResult("draft_rank", True, "one rank")  # nothing to decide: skip the probe's imports
    else:
        probe = probes.run(probes.probe_draft_rank)  # looked up at call time: a test can stand in
    return decide_draft_rank(*ranks, probe, backend)

