"""The ``custom_class`` adapter: vLLM's batch in, a freespec proposer's drafts out.

vLLM builds ``FreespecProposer(vllm_config)`` in each worker and calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)`` once per
step. The adapter infers request identity (``RequestTracker``), hands the
proposer one ``Row`` per batch row, and makes whatever comes back safe for vLLM:
at most k in-vocabulary token ids per row, none past the model's length limit.
A proposer that raises drafts nothing for that step: the text is unchanged
(vLLM decodes one token as without speculation), the first error is logged
with its traceback, later ones are counted.

Under tensor parallelism every rank builds this adapter, but vLLM takes drafts
from one rank only (``seams.draft_rank``). On the others no proposer is built,
so no datastore is mapped, no draft model loaded, no matrix kept, and
``propose`` returns empty drafts at once.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from freespec.proposers.base import EngineInfo, Row
from freespec.proposers.registry import load_proposer_class
from freespec.proposers.request_tracker import RequestTracker
from freespec.scorers.policy import GoodputPolicy
from freespec.vllm_plugins.frontend import ADDITIONAL_CONFIG_KEY, validate_options
from freespec.vllm_plugins.seams import draft_rank
from freespec.vllm_plugins.target_topk import TargetTopK

logger = logging.getLogger("freespec")

# How often each worker logs its counters (FREESPEC_STATS_INTERVAL_S; 0 = every step).
STATS_LOG_EVERY_S = float(os.environ.get("FREESPEC_STATS_INTERVAL_S", "60"))


class ProposerStats:
    """Counters the adapter keeps per worker; logged periodically and readable in tests."""

    def __init__(self) -> None:
        self.steps = 0
        self.rows = 0
        self.drafts = 0
        self.draft_tokens = 0
        self.errors = 0
        self.propose_seconds = 0.0

    def as_dict(self) -> dict:
        return dict(vars(self))


class FreespecProposer:
    """vLLM ``custom_class`` proposer that runs a freespec plugin."""

    def __init__(self, vllm_config) -> None:
        cfg = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if not isinstance(cfg, dict) or "plugin" not in cfg:
            raise ValueError(
                "freespec's custom_class adapter needs additional_config "
                '{"freespec": {"plugin": NAME, "options": {...}}}; '
                'or use --speculative-config \'{"plugin": NAME, ...}\''
            )
        self.plugin = cfg["plugin"]
        options = validate_options(self.plugin, cfg.get("options") or {})  # same error on every rank
        where = draft_rank(vllm_config)
        self.drafting = where.drafts
        if not self.drafting:
            self.proposer = None
            logger.info(
                "freespec: %s: plugin %r not built here (%s); this rank drafts nothing",
                where.rank, self.plugin, where.why,
            )
            return
        logger.info("freespec: %s: plugin %r runs here (%s)", where.rank, self.plugin, where.why)
        # Load-aware draft length (scorers/policy.py): "policy": "goodput", the default; "fixed" turns it off.
        self.policy = GoodputPolicy() if cfg.get("policy", "goodput") == "goodput" else None
        self._last_step_at: float | None = None
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.proposer = load_proposer_class(self.plugin)(options, self.k)
        model_config = vllm_config.model_config
        self.proposer.bind(
            EngineInfo(
                vocab_size=self.vocab_size,
                model=str(model_config.model),
                tokenizer_fingerprint=lambda: tokenizer_fingerprint(model_config.tokenizer),
            )
        )
        # Proposers that learn from the target's own predictions get them through this adapter.
        self.target_topk = TargetTopK(self.proposer.target_topk) if self.proposer.target_topk else None
        self._last_drafts: dict[int, list[int]] = {}  # request key -> what we proposed last step
        self._prefilling: set[int] = set()  # keys whose last step was a partial prefill chunk
        self.tracker = RequestTracker()
        self.stats = ProposerStats()
        self._last_log = time.monotonic()
        logger.info("freespec: plugin %r with k=%d and options %s", self.plugin, self.k, options.model_dump())

    def load_model(self, target_model) -> None:
        """vLLM hands over the target model; only the ``target_topk`` adapter needs it."""
        if self.drafting and self.target_topk is not None:
            self.target_topk.install(target_model)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **_):
        n_rows = len(sampled_token_ids)
        if not self.drafting:  # vLLM ignores this rank's drafts
            return [[] for _ in range(n_rows)]
        lengths = np.asarray(num_tokens_no_spec[:n_rows])
        views = [(token_ids_cpu[i, : lengths[i]], len(sampled_token_ids[i])) for i in range(n_rows)]
        keys, departed = self.tracker.update(views)
        start = time.perf_counter()
        try:
            if self.policy is not None:
                self._observe_step(views, keys, start)
            for key in departed:
                self.proposer.release(key)
            if self.target_topk is not None:
                scored = self.target_topk.scored(views, [self._last_drafts.get(key, []) for key in keys])
                if scored is not None:
                    self.proposer.observe(scored)
            rows = [Row(key, tokens, num_new) for key, (tokens, num_new) in zip(keys, views)]
            drafts = self.proposer.propose(rows)
            if len(drafts) != n_rows:
                raise ValueError(f"plugin returned {len(drafts)} drafts for {n_rows} rows")
            drafts = [self._safe(d, int(lengths[i]), views[i][1]) for i, d in enumerate(drafts)]
        except Exception:
            self.stats.errors += 1
            if self.stats.errors == 1:
                logger.exception("freespec: plugin %r failed; this step drafts nothing (logged once)", self.plugin)
            drafts = [[] for _ in range(n_rows)]
        self._last_drafts = dict(zip(keys, drafts))
        if self.target_topk is not None:
            self.target_topk.active = self._wants_target_topk()
        self._prefilling = {key for key, (_, num_new) in zip(keys, views) if num_new == 0}
        self._count(drafts, time.perf_counter() - start)
        return drafts

    def _observe_step(self, views, keys, now: float) -> None:
        """Feed the policy the step that just ran (time since the last call, tokens it scored and produced)."""
        if self._last_step_at is not None:
            prev = [None if key in self._prefilling else self._last_drafts.get(key) for key in keys]
            counted = step_tokens(views, prev)
            if counted is not None:
                self.policy.observe_step(counted[0], counted[1], now - self._last_step_at, rows=len(views))
        self._last_step_at = now
        self.proposer.token_cost = self.policy.token_cost(rows=len(views))

    def _wants_target_topk(self) -> bool:
        try:
            return bool(self.proposer.wants_target_topk())
        except Exception:
            return True  # capture as before; the failing proposer is already counted by propose()

    def _safe(self, draft, num_tokens: int, num_new: int) -> list[int]:
        if num_new == 0:
            return []  # partial prefill: vLLM takes no draft for this row
        room = self.max_model_len - 1 - num_tokens
        draft = [int(t) for t in draft[: max(0, min(self.k, room))]]
        for t in draft:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"draft token {t} outside the vocabulary [0, {self.vocab_size})")
        return draft

    def _count(self, drafts: list[list[int]], seconds: float) -> None:
        s = self.stats
        s.steps += 1
        s.rows += len(drafts)
        s.drafts += sum(1 for d in drafts if d)
        s.draft_tokens += sum(len(d) for d in drafts)
        s.propose_seconds += seconds
        now = time.monotonic()
        if now - self._last_log >= STATS_LOG_EVERY_S:
            self._last_log = now
            extra = f" token_cost={self.proposer.token_cost}" if self.policy is not None else ""
            if self.target_topk is not None:
                t = self.target_topk
                extra += f" target_topk steps={t.steps} mismatched={t.mismatched_steps} seconds={t.topk_seconds:.3f}"
            logger.info("freespec: plugin %r stats %s%s", self.plugin, s.as_dict(), extra)


def step_tokens(views, prev_drafts) -> tuple[int, int] | None:
    """(tokens the last step scored, tokens it produced) for a pure decode step; None if it prefilled.

    A decode row scored its last token plus the draft it was given; a row seen for the first time
    (``prev_drafts[i] is None``) or mid-prefill (``num_new == 0``) also ran prompt tokens whose number
    the seam does not show, so such steps are left out of the step-time fit rather than guessed.
    """
    scored = produced = 0
    for (_, num_new), draft in zip(views, prev_drafts):
        if num_new == 0 or draft is None:
            return None
        scored += 1 + len(draft)
        produced += num_new
    return (scored, produced) if scored else None


def tokenizer_fingerprint(tokenizer_path: str) -> str:
    """Identity of a tokenizer's vocabulary, for files learned with one model and loaded with another."""
    from transformers import AutoTokenizer

    from freespec.proposers.vocab import vocab_fingerprint

    return vocab_fingerprint(AutoTokenizer.from_pretrained(tokenizer_path).get_vocab())
