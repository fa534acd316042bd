"""The ``pearl`` proposer: a small draft model running beside the target, drafting while the target verifies.

After PEARL (Liu et al., 2025, "Parallel Speculative Decoding with Adaptive
Draft Length"). vLLM owns the target step and calls the proposer synchronously
once per step, so of PEARL's two halves only post-verify fits the
``custom_class`` seam: as soon as a chain is returned, the draft model keeps
drafting past it in the background, assuming the target accepts it all,
and predicts the target's bonus token too; the next step then returns at once
when that assumption held, and otherwise rolls the draft's KV cache back to
what the target kept and drafts from there (``state``). Draft length
adapts per request: chains stop before the first low-confidence prediction and
grow while they are accepted, bounded by k. The draft model, its per-request KV
caches and the thread are in ``draft``; ``placement: "process"`` (the
default) runs them in a child process (``pearl.process``), ``"ray"`` in a Ray
actor (``ray``; both share ``remote``), ``"thread"`` in a thread
of vLLM's worker. docs/pearl.md has the options, memory, CPU core split
and what is measured.

Memory (outside vLLM's planning): the draft's weights plus its KV cache,
``kv_bytes_per_token`` per cached token, at most ``max_cached_tokens`` tokens
over at most ``max_requests`` requests (least recently used evicted first);
``state_bytes()`` reports the current total.
"""
from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import time
import weakref
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

from pydantic import Field, field_validator, model_validator

from freespec import settings
from freespec.proposers.api import Draft, EngineInfo, Row, StepContext
from freespec.proposers.base import Proposer, ProposerOptions

logger = logging.getLogger("freespec")
# sync_feed_tokens' default: a draft this far behind catches up inside the step in a few draft passes.
SYNC_FEED_DEFAULT = 16


def resolve_draft_model(value: str) -> Path:
    """The draft's checkpoint directory: a path, a Hugging Face model id (from the HF cache, as vLLM
    resolves it) or a ``freespec models`` fixture name; see ``freespec.model_ref``."""
    from freespec.model_ref import resolve_model

    return resolve_model(value, "draft_model")


class PearlOptions(ProposerOptions):
    draft_model: str = Field(
        ..., description="draft model: a Hugging Face model id (org/name[@revision]), a checkpoint directory, "
        "or a `freespec models` test-fixture name"
    )
    device: str = Field("cpu", description='where the draft model runs: "cpu" or "cuda:N"')
    placement: Literal["process", "thread", "ray"] = Field(
        "process",
        description='"process": the draft runs in a child process (no GIL shared with the target); '
        '"thread": in a thread of vLLM\'s worker process; "ray": in a Ray actor, on the node or GPU Ray picks',
    )
    step_timeout_s: float = Field(
        30.0, gt=0, le=120,
        description="a step the draft does not answer in this time drafts nothing (at most 120 s). "
        '"process"/"ray": the draft is restarted, and until it has answered for 60 s later steps wait at most '
        '2 s; "thread": steps draft nothing until the late step has finished, then wait at most 2 s likewise',
    )
    ray_address: str = Field(
        "auto", min_length=1,
        description='placement "ray": the Ray cluster to join ("auto": the one this node belongs to, or host:port)',
    )
    ray_actor_options: Optional[dict[str, Any]] = Field(
        None,
        description='placement "ray": arguments of the draft actor\'s .options() (num_cpus, num_gpus, resources, '
        "...); default num_cpus = draft_threads, and num_gpus = 1 for a cuda device",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="draft weights and KV dtype")
    draft_cores: Optional[str] = Field(
        None, description='CPU ids the draft runs on, e.g. "1" or "2-3" (default: the caller\'s)'
    )
    draft_threads: int = Field(1, ge=1, le=256, description="torch intra-op threads of the draft")
    min_confidence: float = Field(
        0.1, ge=0.0, le=1.0, description="a chain stops before the first draft token with lower draft probability"
    )
    adaptive_length: bool = Field(
        True, description="grow the chain budget after full acceptance, shrink it after a rejection (False: k)"
    )
    max_requests: int = Field(64, ge=1, le=1 << 16, description="requests whose draft KV cache is kept")
    max_cached_tokens: int = Field(
        32_768, ge=1, le=1 << 30, description="draft KV cache tokens kept over all requests (docs/pearl.md: bytes)"
    )
    sync_feed_tokens: int = Field(
        SYNC_FEED_DEFAULT, ge=1, le=1 << 20,
        description="a request whose draft is further behind drafts nothing until caught up in the background; "
        "behind by less, it catches up inside the step, which then waits for it (seconds on a CPU for a prompt). "
        "Above 16, a step may take up to step_timeout_s: the adapter's step_budget_ms is raised to it unless set",
    )
    prefill_chunk: int = Field(32, ge=1, le=1 << 16, description="tokens per catch-up forward pass")

    @field_validator("draft_model")
    @classmethod
    def _resolve(cls, value: str) -> str:
        return str(resolve_draft_model(value))

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(r"cpu|cuda(:\d+)?", value):
            raise ValueError(f'{value!r} is not "cpu", "cuda" or "cuda:N"')
        return value

    @field_validator("draft_cores")
    @classmethod
    def _cores(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            from freespec.proposers.pearl.draft import parse_cores

            cores = parse_cores(value)
            missing = sorted(c for c in cores if c >= (os.cpu_count() or 1))
            if missing:
                shown = ", ".join(map(str, missing[:8])) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
                raise ValueError(f"CPU ids {shown} do not exist here ({os.cpu_count()} CPUs)")
        return value

    @field_validator("ray_actor_options")
    @classmethod
    def _actor_options(cls, value: Optional[dict]) -> Optional[dict]:
        if value is None:
            return value
        for name in ("num_cpus", "num_gpus"):
            amount = value.get(name)
            if amount is not None and (isinstance(amount, bool) or not isinstance(amount, (int, float))
                                       or amount < 0):
                raise ValueError(f"{name} must be a number >= 0, not {amount!r}")
        resources = value.get("resources")
        if resources is not None and (not isinstance(resources, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                for k, v in resources.items())):
            raise ValueError(f"resources must map resource names to amounts >= 0, not {resources!r}")
        return value

    @model_validator(mode="after")
    def _ray_placement(self) -> "PearlOptions":
        # Compared with the defaults, not model_fields_set: the worker re-validates a full model_dump().
        ray_fields = [name for name, default in (("ray_address", "auto"), ("ray_actor_options", None))
                      if getattr(self, name) != default]
        if self.placement != "ray":
            if ray_fields:
                raise ValueError(f"option {ray_fields[0]!r} is only used with placement \"ray\" "
                                 f"(placement is {self.placement!r})")
            return self
        if self.draft_cores is not None:
            raise ValueError("option 'draft_cores' cannot be used with placement \"ray\": Ray assigns the cores of "
                             "the node it places the draft actor on; ask for them with "
                             "'ray_actor_options' (num_cpus, resources)")
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ValueError("option 'placement' is \"ray\", but Ray is not installed here; "
                             "pip install 'vllm-freespec[cluster]'")
        if self.ray_actor_options:
            from freespec.proposers.pearl.ray import check_actor_options

            check_actor_options(self.ray_actor_options)
        index = int(self.device.partition(":")[2] or 0) if self.device.startswith("cuda") else None
        gpus = (self.ray_actor_options or {}).get("num_gpus", 1)
        if index is not None and index >= gpus:
            raise ValueError(f"option 'device' is {self.device!r}, but the draft actor gets {gpus} GPU(s) from Ray "
                             "('ray_actor_options' num_gpus; inside the actor its GPUs are cuda:0, cuda:1, ...)")
        return self


def tokenizer_dir_fingerprint(path: Path) -> Optional[str]:
    """Fingerprint of the tokenizer saved with a checkpoint, or None if it has none."""
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    from freespec.proposers.vocab import vocab_fingerprint

    return vocab_fingerprint(AutoTokenizer.from_pretrained(str(path)).get_vocab())


class PearlProposer(Proposer):
    Options = PearlOptions

    def __init__(self, options: PearlOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        import torch

        from freespec.proposers.pearl.draft import parse_cores

        # With placement "ray" the GPU is the actor's, on whichever node Ray picks.
        if options.device.startswith("cuda") and options.placement != "ray" and not torch.cuda.is_available():
            raise ValueError(f"pearl: option 'device' is {options.device!r}, but torch sees no CUDA device here")
        drafter_options = dict(
            min_confidence=options.min_confidence,
            adaptive_length=options.adaptive_length,
            max_requests=options.max_requests,
            max_cached_tokens=options.max_cached_tokens,
            sync_feed_tokens=options.sync_feed_tokens,
            prefill_chunk=options.prefill_chunk,
        )
        cores = parse_cores(options.draft_cores) if options.draft_cores else None
        if cores and options.device == "cpu" and hasattr(os, "sched_getaffinity"):
            shared = cores & os.sched_getaffinity(0)
            if shared:
                logger.warning(
                    "freespec: pearl draft_cores %s overlap the cores the target's thread runs on %s; "
                    "give vLLM the others with VLLM_CPU_OMP_THREADS_BIND (docs/pearl.md)",
                    sorted(cores), sorted(os.sched_getaffinity(0)),
                )
        self.draft_model = self.drafter = None  # placement "thread" only: the others keep them in the draft's process
        if options.placement in ("process", "ray"):
            from freespec.proposers.pearl.remote import DraftError

            spec = dict(model=options.draft_model, device=options.device, dtype=options.dtype,
                        k=num_speculative_tokens, threads=options.draft_threads, drafter=drafter_options)
            if options.placement == "process":
                from freespec.proposers.pearl.process import DraftProcess

                self.worker = DraftProcess({**spec, "cores": sorted(cores) if cores else None},
                                           step_timeout_s=options.step_timeout_s)
            else:
                from freespec.proposers.pearl.ray import RayDraft

                self.worker = RayDraft(spec, address=options.ray_address, options=options.ray_actor_options,
                                       step_timeout_s=options.step_timeout_s)
            try:
                self.worker.start()
            except DraftError as e:
                if "draft_cores" in str(e):
                    raise ValueError(f"pearl: option {e}") from e
                raise ValueError(f"pearl: option 'draft_model' ({options.draft_model}) cannot be loaded in the "
                                 f"{self.worker.kind}: {e}") from e
            self._vocab_size = int(self.worker.info["vocab_size"])
        else:
            from freespec.proposers.pearl.draft import TorchDraftModel
            from freespec.proposers.pearl.state import PearlDrafter

            try:
                self.draft_model = TorchDraftModel.load(options.draft_model, options.device, options.dtype)
            except Exception as e:
                raise ValueError(f"pearl: option 'draft_model' ({options.draft_model}) cannot be loaded: {e}") from e
            self.drafter = PearlDrafter(self.draft_model, num_speculative_tokens, max_position=self.draft_model.max_position,
                                        **drafter_options)
            self.worker = TimedDraftWorker(self.drafter, cores=cores, threads=options.draft_threads,
                                           device=options.device, step_timeout_s=options.step_timeout_s)
            self.worker.start()  # a bad core list fails here, at engine start, not at the first step
            self._vocab_size = self.draft_model.vocab_size
        self._bound = False
        self._closed = False
        self._last_log = time.monotonic()
        self._log_every_s = settings.stats_interval_s()  # vLLM's stats interval unless FREESPEC_STATS_INTERVAL_S
        # vLLM never closes a proposer: at exit, log the final stats and end the child.
        atexit.register(_close_ref, weakref.ref(self))

    def bind(self, info: EngineInfo) -> None:
        """Refuse a draft model whose vocabulary is not the target's."""
        path = Path(self.options.draft_model)
        target_fp = info.tokenizer_fingerprint() if info.tokenizer_fingerprint else None
        draft_fp = tokenizer_dir_fingerprint(path) if target_fp else None
        if target_fp and draft_fp:
            if target_fp != draft_fp:
                raise ValueError(
                    f"pearl: option 'draft_model' ({path}) has a different tokenizer than the target "
                    f"{info.model or ''} ({draft_fp[:19]}... vs {target_fp[:19]}...); the draft model must share "
                    "the target's token ids"
                )
        elif self._vocab_size != info.vocab_size:
            raise ValueError(
                f"pearl: option 'draft_model' ({path}) has a vocabulary of {self._vocab_size} tokens and the "
                f"target {info.model or ''} has {info.vocab_size}; without both tokenizers to compare, "
                "they must be equal"
            )
        # Same tokenizer, possibly padded differently: never draft an id the target does not have.
        vocab_limit = min(self._vocab_size, info.vocab_size)
        if self.draft_model is not None:
            self.draft_model.vocab_limit = vocab_limit
        else:
            self.worker.bind(vocab_limit)
        self._bound = True

    def draft(self, rows: Sequence[Row], step: StepContext) -> list[Draft]:
        """The draft model's chains. PEARL drafts on after the chain it proposes while the target verifies it,
        so the chain must be the one verified: the draft cuts it at the step's price itself (by its own
        confidences, through the policy's ``scorers.policy.cut``) and returns no chances to be cut again."""
        if not self._bound:
            raise RuntimeError("pearl proposer used before bind()")
        chains = self.worker.step(rows, step.token_cost)
        now = time.monotonic()
        if now - self._last_log >= self._log_every_s:
            self._last_log = now
            logger.info("freespec: pearl %s", self.stats())
        return [Draft(chain) for chain in chains]

    def release(self, key: int) -> None:
        self.worker.release(key)

    def step_time_needed(self) -> Optional[tuple[float, str]]:
        """Above its default, ``sync_feed_tokens`` makes a step wait for the draft to read up to that many
        tokens (seconds on a CPU for a prompt); the step stays bounded by ``step_timeout_s``."""
        if self.options.sync_feed_tokens <= SYNC_FEED_DEFAULT:
            return None
        return (self.options.step_timeout_s,
                f"pearl's sync_feed_tokens {self.options.sync_feed_tokens} (above {SYNC_FEED_DEFAULT}) catches "
                f"drafts up inside the step, within step_timeout_s {self.options.step_timeout_s:g}")

    def state_bytes(self) -> int:
        if self.draft_model is not None:
            return self.draft_model.weight_bytes() + self.draft_model.kv_bytes()
        s = self.worker.stats()  # as of the child's last reply
        return int(s.get("weight_bytes", self.worker.info.get("weight_bytes", 0))) + int(s.get("kv_bytes", 0))

    def stats(self) -> dict:
        """Drafter counters and where the time went (docs/pearl.md explains each).

        ``target_wait_ms`` is the mean time per step that ``propose`` blocked (the target
        waited for drafts); ``draft_idle_ms`` the mean time per step the draft had nothing
        to do (it waited for the target).
        """
        if self.draft_model is not None:
            s = {**self.drafter.stats.as_dict(), **self.worker.times.as_dict()}
        else:
            s = self.worker.stats()
        steps = max(1, int(s.get("steps", 0)))
        s["target_wait_ms"] = round(1000 * float(s.get("step_wait", 0.0)) / steps, 3)
        s["draft_idle_ms"] = round(1000 * float(s.get("idle", 0.0)) / steps, 3)
        s["placement"] = self.options.placement
        s["state_bytes"] = self.state_bytes()
        return s

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until post-verify has finished (tests, measurements)."""
        return self.worker.wait_idle(timeout)

    def close(self) -> None:
        """Log the final stats and stop the draft (thread, child process or actor); also run at exit."""
        if self._closed:
            return
        self._closed = True
        logger.info("freespec: pearl final stats %s", self.stats())
        self.worker.close()


@functools.cache
def _timed_worker_class():
    """``TimedDraftWorker`` is built on ``draft.DraftWorker``, which imports torch: defined on first use."""
    from freespec.proposers.pearl.draft import DraftWorker, StepTimeout
    from freespec.proposers.pearl.remote import HEALTHY_S, RETRY_TIMEOUT_S

    class TimedDraftWorker(DraftWorker):
        """The ``thread`` placement's worker, with a step timeout like the other placements.

        A thread cannot be killed: a step that does not finish in time drafts nothing, the thread is left to
        finish it, and steps draft nothing (without waiting) until it has; its late chains are discarded. After
        a timeout, steps wait at most ``RETRY_TIMEOUT_S`` until the draft has answered for ``HEALTHY_S``.
        """

        def __init__(self, *args, step_timeout_s: float = 30.0, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.step_timeout_s = step_timeout_s
            self.timeouts = 0
            self.skipped_steps = 0
            self._late = False  # a step that timed out is still running in the thread
            self._short_timeout = False
            self._good_since: Optional[float] = None

        def step(self, rows, token_cost=None):
            self.start()
            with self._cond:
                if self._late:
                    if self._result is None and self._thread.is_alive():
                        self.skipped_steps += 1
                        return [[] for _ in rows]
                    self._result, self._late = None, False  # the late chains: for a step long gone
            timeout = min(self.step_timeout_s, RETRY_TIMEOUT_S) if self._short_timeout else self.step_timeout_s
            try:
                chains = super().step(rows, token_cost, timeout=timeout)
            except StepTimeout:
                self._late, self._short_timeout, self._good_since = True, True, None
                self.timeouts += 1
                logger.error("freespec: pearl draft thread did not answer a step within %.1f s; steps draft "
                             "nothing until it has finished", timeout)
                return [[] for _ in rows]
            except Exception:
                if self._thread.is_alive():  # the draft answered, with its error
                    self._answered()
                raise
            self._answered()
            return chains

        def _answered(self) -> None:
            """The draft answered a step: after ``HEALTHY_S`` of answers, steps wait the full timeout again."""
            now = time.monotonic()
            if self._good_since is None:
                self._good_since = now
            elif now - self._good_since >= HEALTHY_S:
                self._short_timeout = False

    return TimedDraftWorker


def TimedDraftWorker(*args, **kwargs):  # noqa: N802 - a class, built on first use
    """The thread placement's ``DraftWorker`` with a step timeout (see ``_timed_worker_class``)."""
    return _timed_worker_class()(*args, **kwargs)


def _close_ref(ref) -> None:
    proposer = ref()
    if proposer is not None:
        proposer.close()
