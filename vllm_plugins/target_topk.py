"""Named adapter ``target_topk``: the target model's top-k at every position it scored.

vLLM's ``custom_class`` seam hands a proposer token ids only. Token recycling
needs the target's own next-token candidates, so this adapter wraps the target
model's ``compute_logits`` (reached through ``load_model(target_model)``, which
vLLM calls on every proposer) and keeps, for each logits row it returns, the
top-k token ids and their probabilities. The logits are returned untouched, so
what vLLM samples is unchanged; only a copy of k ids and k floats per row is
kept (``freespec.kernels.topk``: a Triton kernel on CUDA, torch on the CPU).

Which token each logits row belongs to is vLLM's layout, written down in
``probes.probe_target_logits`` and checked there against the installed source:
rows come in batch order, and request i contributes ``1 + d_i`` rows, where
``d_i`` is the number of draft tokens it was scheduled this step (rows for the
last committed token and for each draft token). The adapter knows what it
proposed for each request last step, so the token at each scored position is
the request's last committed token followed by its draft. A step whose row
count does not match (the scheduler cut a draft, a second ``compute_logits``
call for prompt logprobs, a layout change) is skipped and counted: recycled
candidates only ever change what is *proposed*, never what is accepted, so a
skipped or wrong update costs speed, not correctness.

Named patch ``target_topk`` (``patches.PATCHES``, probe ``target_topk``): ``FREESPEC_DISABLE_PATCHES=target_topk``
leaves the target model as it is, and nothing is captured.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from freespec import settings
from freespec.proposers.base import ScoredPositions

logger = logging.getLogger("freespec")

MAX_CAPTURES = 4  # compute_logits calls kept between two propose() calls (main step + prompt logprobs)


@dataclass
class Capture:
    ids: np.ndarray  # int32 [rows, k]
    probs: np.ndarray  # float32 [rows, k]


class TargetTopK:
    """Wraps ``target_model.compute_logits``; ``scored()`` maps the captured rows to tokens."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._captures: list[Capture] = []
        self.steps = 0
        self.mismatched_steps = 0  # steps whose logits rows did not match the expected layout
        self.errors = 0
        self.topk_seconds = 0.0  # all captures' time (the stats line)
        self._unclaimed_seconds = 0.0  # captures' time since take_seconds() last ran
        # The adapter sets this after each step from ``Proposer.wants_target_topk``: off, the next
        # forward's logits are not copied (a full batch has no time for what nobody will use). Off until
        # the adapter's first step: the engine's warm-up forwards (the profile run, the dummy sampler run:
        # up to max_num_seqs rows each) are no request's, and their copies' time was charged to the first
        # step's recycle source (many times a normal step's capture), which got it paused.
        self.active = False

    def install(self, target_model) -> None:
        """Shadow ``compute_logits`` on this model instance (idempotent); not where the patch is disabled."""
        if "target_topk" in settings.disabled_patches():
            logger.info("freespec: patch target_topk is disabled: the target's top-k is not captured")
            return
        original = target_model.compute_logits
        if getattr(original, "_freespec_topk", None) is not None:
            original._freespec_topk.append(self)
            return
        hooks = [self]

        def compute_logits(*args, **kwargs):
            logits = original(*args, **kwargs)
            if logits is not None:
                for hook in hooks:
                    hook._capture(logits)
            return logits

        compute_logits._freespec_topk = hooks  # type: ignore[attr-defined]
        # nn.Module.__setattr__ keeps a plain function in the instance dict, which
        # shadows the class method the model runner calls.
        target_model.compute_logits = compute_logits

    def _capture(self, logits) -> None:
        from freespec.kernels.topk import row_topk

        if not self.active:
            return
        start = time.perf_counter()
        try:
            ids, probs = row_topk(logits.detach(), min(self.k, logits.shape[-1]))
            self._captures.append(Capture(ids.cpu().numpy(), probs.cpu().numpy()))
            del self._captures[:-MAX_CAPTURES]
        except Exception:
            self.errors += 1
            if self.errors == 1:
                logger.exception("freespec: target top-k capture failed; recycling pauses for such steps (logged once)")
        spent = time.perf_counter() - start
        self.topk_seconds += spent
        self._unclaimed_seconds += spent

    def take_seconds(self) -> float:
        """Seconds the captures took since the last call (the adapter's per-step charge to the proposer)."""
        spent, self._unclaimed_seconds = self._unclaimed_seconds, 0.0
        return spent

    def scored(self, views: Sequence[tuple[np.ndarray, int]], prev_drafts: Sequence[Sequence[int]],
               scopes: Sequence[str | None] | None = None):
        """The scored positions of the step that just ran, or ``None`` when they cannot be mapped.

        ``views[i]`` is row i's ``(tokens, num_new)`` as the adapter sees it now;
        ``prev_drafts[i]`` is what the adapter proposed for that request last step; ``scopes[i]`` its scope,
        given to each of its positions (``ScoredPositions.scopes``).
        """
        captures, self._captures = self._captures, []
        self.steps += 1
        if not captures:  # nothing was captured (recycle paused, or no forward): nothing to map
            return None
        tokens, expected = positions_of_step(views, prev_drafts)
        match = next((c for c in reversed(captures) if len(c.ids) == expected), None)
        if match is None:
            self.mismatched_steps += 1
            return None
        keep = tokens >= 0
        per_position = None
        if scopes is not None:
            counts = [1 if num_new == 0 else 1 + len(d) for (_, num_new), d in zip(views, prev_drafts)]
            per_position = [s for s, c in zip(scopes, counts) for _ in range(c)]
            per_position = [s for s, k in zip(per_position, keep.tolist()) if k]
        return ScoredPositions(tokens[keep], match.ids[keep], match.probs[keep], per_position)


def positions_of_step(views: Sequence[tuple[np.ndarray, int]], prev_drafts: Sequence[Sequence[int]]):
    """The token at each logits row of the last step (-1: unknown), and the row count.

    Row i (``n`` tokens now, ``a`` of them new) was scored at its last committed
    token ``tokens[n - a - 1]`` and at each of the ``d`` draft tokens it was
    scheduled. A partial prefill chunk (``a == 0``) has one row whose position is
    inside the prompt and is not known here: -1.
    """
    out: list[int] = []
    for (tokens, num_new), draft in zip(views, prev_drafts):
        n = len(tokens)
        if num_new == 0:
            out.append(-1)
            continue
        draft = list(draft)
        # Accepted draft tokens are in the sequence now; if they are not what we proposed,
        # the scheduler changed the draft and this row's layout is unknown.
        if num_new - 1 > len(draft) or list(tokens[n - num_new : n - 1]) != draft[: num_new - 1]:
            return np.full(0, -1, dtype=np.int32), -1
        out.append(int(tokens[n - num_new - 1]))
        out.extend(draft)
    return np.asarray(out, dtype=np.int32), len(out)
