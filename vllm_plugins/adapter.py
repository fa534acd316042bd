"""The ``custom_class`` adapter: vLLM's batch in, a freespec proposer's drafts out.

vLLM builds ``FreespecProposer(vllm_config)`` in each worker and calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)`` once per step. The adapter keys
requests by vLLM's request ids (``request_ids``; else by their tokens, ``RequestTracker``), calls the
proposer's ``draft(rows, step)`` with one ``Row`` per batch row and the step's context (the policy's price
of a draft token), has the policy cut and size what comes back (``scorers.policy.shape_drafts``) and makes it
safe for vLLM: at most k in-vocabulary token ids per row, none past the model's length limit.

A proposer that raises drafts nothing for that step: the text is unchanged (vLLM decodes one token as
without speculation), the first error is logged with its traceback, later ones are counted. A circuit
breaker (``breaker.CircuitBreaker``) switches a plugin off for a back-off period when its steps keep
failing or overrun the step budget, and tries it again. A plugin whose own time does not pay for itself
(a draft model that does not keep up with the target) steps aside: ``scorers.step_aside.StepAside`` measures
decoding with and without it and keeps the faster. Counters and metrics: ``accounting``.

Under tensor parallelism every rank builds this adapter, but vLLM takes drafts from one rank only
(``ranks.draft_rank``). On the others no proposer is built, so no datastore is mapped, no draft model
loaded, no matrix kept, and ``propose`` returns empty drafts at once.
"""
from __future__ import annotations

import logging
import sys
import time

import numpy as np

from freespec.proposers.base import Draft, EngineInfo, Row, StepContext
from freespec.proposers.registry import load_proposer_class
from freespec.scorers.policy import GoodputPolicy, shape_drafts
from freespec.scorers.step_aside import StepAside
from freespec.vllm_plugins.accounting import (
    PADDING, StepAccounting, accepted_by_source, accepted_tokens, step_tokens,
)
from freespec.vllm_plugins.breaker import CircuitBreaker
from freespec.vllm_plugins.frontend import ADDITIONAL_CONFIG_KEY, check_additional_config
from freespec.vllm_plugins.patches import install_in_worker
from freespec.vllm_plugins.ranks import draft_rank
from freespec.vllm_plugins.request_ids import BatchRequestIds
from freespec.vllm_plugins.request_tracker import RequestTracker
from freespec.vllm_plugins.target_topk import TargetTopK

logger = logging.getLogger("freespec")

__all__ = ["FreespecProposer", "CircuitBreaker", "PADDING", "accepted_by_source", "accepted_tokens",
           "step_tokens", "tokenizer_fingerprint"]


class FreespecProposer:
    """vLLM ``custom_class`` proposer that runs a freespec plugin."""

    def __init__(self, vllm_config) -> None:
        cfg = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        spec = vllm_config.speculative_config
        # the same checks, and messages, as the {"plugin": ...} spelling; on every rank
        self.plugin, options, adapter = check_additional_config(cfg, spec.num_speculative_tokens)
        install_in_worker()  # patches a freespec engine's workers need (cpu_expand_kernel)
        where = draft_rank(vllm_config)
        self.drafting = where.drafts
        self.breaker: CircuitBreaker | None = None
        if not self.drafting:
            self.proposer = None
            logger.info(
                "freespec: %s: plugin %r not built here (%s); this rank drafts nothing",
                where.rank, self.plugin, where.why,
            )
            return
        logger.info("freespec: %s: plugin %r runs here (%s)", where.rank, self.plugin, where.why)
        # Load-aware draft length (scorers/policy.py): "policy": "goodput", the default; "fixed" turns it off.
        self.policy = GoodputPolicy() if adapter.policy == "goodput" else None
        pad = adapter.pad if self.policy is not None else "off"
        self.pad, self.trim = pad != "off", pad == "auto"
        self._last_padding: dict = {}
        self._last_step_at: float | None = None
        self._last_plugin_s = 0.0  # the last step's plugin time, left out of the policy's fit (prices_own_time)
        self.token_cost: float | None = None  # the policy's last price of a draft token (logged, tests)
        self.step_aside = StepAside() if adapter.step_aside else None
        self._aside_at: float | None = None  # the start of the last adapter call step_aside can measure from
        self._aside_rows = 0
        self._aside_drafted = True  # whether the plugin drafted for the last step
        self._aside_plugin_s = 0.0  # the plugin's own time in the last call
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
        self._last_sources: dict[int, str | None] = {}  # request key -> the source of that draft (metrics)
        self._prefilling: set[int] = set()  # keys whose last step was a partial prefill chunk
        self.tracker = RequestTracker()
        self.request_ids = BatchRequestIds()
        self.accounting = StepAccounting(self.plugin)
        self.stats = self.accounting.stats
        self.breaker = CircuitBreaker(self._step_budget_s(adapter.budget_s, adapter.step_budget_ms is not None),
                                      self.plugin)
        logger.info("freespec: plugin %r with k=%d and options %s", self.plugin, self.k, options.model_dump())

    def _step_budget_s(self, budget_s: float, given: bool) -> float:
        """The breaker's step budget: ``step_budget_ms``, raised to what the plugin's own options make a step
        take (``Proposer.step_time_needed``) unless the operator set it, who is then warned once."""
        try:
            needed = self.proposer.step_time_needed()
        except Exception:
            needed = None
        if not needed or needed[0] <= budget_s:
            return budget_s
        seconds, why = needed
        if given:
            logger.warning(
                "freespec: plugin %r: speculative_config 'step_budget_ms' %g is below the %g ms its options "
                "need (%s): the circuit breaker will switch it off on those steps; raise step_budget_ms or "
                "leave it unset", self.plugin, budget_s * 1000, seconds * 1000, why)
            return budget_s
        logger.info("freespec: plugin %r: step budget %g ms (not 'step_budget_ms' %g): %s",
                    self.plugin, seconds * 1000, budget_s * 1000, why)
        return float(seconds)

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
        ids = self.request_ids.read(sys._getframe(1), token_ids_cpu, n_rows)
        self.stats.steps_without_ids += ids is None
        keys, departed = self.tracker.update(views, ids)
        prev = [None if key in self._prefilling else self._last_drafts.get(key) for key in keys]
        counted = step_tokens(views, prev)  # what the last step scored and produced (None: it prefilled)
        accepted = accepted_tokens(views, prev)
        accepted_by = None
        if self._last_sources or self._last_padding:
            accepted_by = accepted_by_source(views, prev, [self._last_sources.get(key) for key in keys], self.plugin,
                                             [self._last_padding.get(key, 0) for key in keys])
            self.stats.padding_accepted += accepted_by.get(PADDING, 0)
        if not self.breaker.allow():
            return self._skip(keys, departed, n_rows, accepted, accepted_by)
        start = time.perf_counter()
        if self._steps_aside(len(views), counted, start):
            return self._aside(views, keys, departed, accepted, accepted_by, counted, start)
        failure = None
        step = StepContext(budget_s=self.breaker.budget_s)
        try:
            if self.policy is not None:
                step.token_cost = self._observe_step(len(views), counted, start)
            for key in departed:
                self.proposer.release(key)
            if self.target_topk is not None:
                scored = self.target_topk.scored(views, [self._last_drafts.get(key, []) for key in keys])
                if scored is not None:
                    self.proposer.observe(scored)
                step.capture_seconds = self.target_topk.take_seconds()
            rows = [Row(key, tokens, num_new) for key, (tokens, num_new) in zip(keys, views)]
            drafts = self.proposer.draft(rows, step)
            if not isinstance(drafts, list) or len(drafts) != n_rows:
                raise ValueError(f"plugin returned {len(drafts)} drafts for {n_rows} rows")
            rooms = [0 if views[i][1] == 0 else max(0, min(self.k, self.max_model_len - 1 - int(lengths[i])))
                     for i in range(n_rows)]
            drafts = [self._checked(d, room) for d, room in zip(drafts, rooms)]
            shaped = shape_drafts(drafts, step.bar(self.proposer.fixed_bar()), self.policy, [v[0] for v in views],
                                  rooms, self.pad, self.trim)
            tokens, padding = shaped.tokens, shaped.padding
            self.stats.trimmed_tokens += shaped.trimmed
            self.stats.expected_accepted += shaped.expected
            self.stats.padded_tokens += sum(padding)
        except Exception as e:
            failure = f"{type(e).__name__}: {e}"
            self.accounting.error()
            if self.stats.errors == 1:
                logger.exception("freespec: plugin %r failed; this step drafts nothing (logged once)", self.plugin)
            tokens, padding = [[] for _ in range(n_rows)], None
        self._last_drafts = dict(zip(keys, tokens))
        self._last_padding = dict(zip(keys, padding)) if failure is None and self.pad else {}
        sources = [d.source for d in drafts] if failure is None else None
        if sources is not None and all(s is None for s in sources):
            sources = None
        self._last_sources = dict(zip(keys, sources)) if sources is not None else {}
        if self.target_topk is not None:
            self.target_topk.active = self._wants_target_topk()
        self._prefilling = {key for key, (_, num_new) in zip(keys, views) if num_new == 0}
        seconds = time.perf_counter() - start
        self._last_plugin_s = seconds if getattr(self.proposer, "prices_own_time", False) else 0.0
        self._aside_drafted, self._aside_plugin_s = True, seconds
        if seconds > self.breaker.budget_s:
            self.stats.overruns += 1
        if self.breaker.record(failure, seconds):
            self._opened(keys, forget=failure is not None)
        seconds_by = {str(k): float(v) for k, v in step.source_seconds.items()} if failure is None else None
        self.accounting.count(tokens, seconds, accepted, accepted_by, sources, seconds_by or None,
                              padding if self._last_padding else None)
        self._periodic()
        return tokens

    @property
    def metrics(self):
        """The plugin's Prometheus metrics (``accounting.StepAccounting.metrics``)."""
        return self.accounting.metrics

    @metrics.setter
    def metrics(self, value) -> None:
        self.accounting.metrics = value

    def _checked(self, draft: Draft, room: int) -> Draft:
        """A plugin's draft as plain ints, at most ``room`` tokens, every one inside the vocabulary."""
        if not isinstance(draft, Draft):
            raise TypeError(f"draft() must return freespec.proposers.base.Draft objects, got {type(draft).__name__}")
        tokens = [int(t) for t in draft.tokens[: max(0, room)]]
        for t in tokens:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"draft token {t} outside the vocabulary [0, {self.vocab_size})")
        chances = None
        if draft.chances is not None:
            chances = [float(c) for c in draft.chances[: len(tokens)]]
            if len(chances) < len(tokens):
                chances = None  # not one per token: the draft is not cut or trimmed
        source = draft.source if isinstance(draft.source, str) else None
        return Draft(tokens, chances, source)

    def breaker_state(self) -> dict:
        """The circuit breaker's state (``closed``, ``open``, ``half_open``), its counters and back-off."""
        if self.breaker is None:
            return {"state": "not drafting"}
        return self.breaker.state_dict()

    def _skip(self, keys: list[int], departed: list[int], n_rows: int, accepted: int,
              accepted_by: dict[str, int] | None = None) -> list[list[int]]:
        """A step while the breaker is open: no drafts, nothing asked of the plugin but freeing departed requests."""
        self.stats.skipped_steps += 1
        self._last_drafts = {}
        self._last_sources = {}
        self._prefilling = set()
        self._last_step_at = None  # the policy's step-time fit skips the gap
        self._aside_at = None  # and so does step_aside's measure
        return self._draft_nothing(n_rows, departed, accepted, accepted_by)

    def _draft_nothing(self, n_rows: int, departed: list[int], accepted: int,
                       accepted_by: dict[str, int] | None) -> list[list[int]]:
        """The end of a step the plugin was not asked to draft for (breaker open, or stepped aside): departed
        requests freed, nothing else asked of it."""
        self._release(departed)
        if self.target_topk is not None:
            self.target_topk.active = False  # no top-k copied for a plugin that is off
        self.accounting.count([[] for _ in range(n_rows)], None, accepted, accepted_by)
        self._periodic()
        return [[] for _ in range(n_rows)]

    def _steps_aside(self, rows: int, counted: tuple[int, int] | None, now: float) -> bool:
        """Feed ``step_aside`` the step that just ran; whether the plugin sits this one out."""
        if self.step_aside is None:
            return False
        if self._aside_at is not None and counted is not None:
            self.step_aside.observe(self._aside_rows, self._aside_drafted, now - self._aside_at, counted[1],
                                    self._aside_plugin_s)
        self._aside_at, self._aside_rows = now, rows
        drafts = self.step_aside.drafts(rows)
        for change in self.step_aside.changes:
            logger.info("freespec: plugin %r at %s", self.plugin, change)
        self.step_aside.changes.clear()
        return not drafts

    def _aside(self, views, keys: list[int], departed: list[int], accepted: int,
               accepted_by: dict[str, int] | None, counted: tuple[int, int] | None, start: float) -> list[list[int]]:
        """A step the plugin sits out (``step_aside``): no drafts; the policy still learns the plain step."""
        self.stats.aside_steps += 1
        if self.policy is not None:
            self._last_plugin_s = 0.0
            self._observe_step(len(views), counted, start)
        self._last_drafts = {key: [] for key in keys}  # measured next step: each row scored its last token
        self._last_sources, self._last_padding = {}, {}
        self._prefilling = {key for key, (_, num_new) in zip(keys, views) if num_new == 0}
        self._aside_drafted, self._aside_plugin_s = False, 0.0
        return self._draft_nothing(len(views), departed, accepted, accepted_by)

    def _opened(self, keys: list[int], forget: bool) -> None:
        """The breaker has just opened. A plugin that raised (``forget``) forgets the live requests' state
        (it may be what fails) and sees them as new requests when tried again (their keys are unchanged).

        A plugin that was only slow keeps it: every row carries its whole sequence, so at the trial step it
        catches up on the steps it missed. Forgetting would make that trial re-read every live request (pearl
        re-prefills each context in the step), so the trial would overrun, the breaker open again with twice
        the back-off, and the plugin draft nothing while those requests lived.
        """
        if forget:
            self._release(keys)
        self._last_drafts = {}
        self._last_sources = {}

    def _release(self, keys: list[int]) -> None:
        """Tell the plugin these requests are gone; a plugin that raises is counted, never propagated."""
        for key in keys:
            try:
                self.proposer.release(key)
            except Exception:
                self.accounting.error()

    def _observe_step(self, rows: int, counted: tuple[int, int] | None, now: float) -> float | None:
        """Feed the policy the step that just ran (time since the last call, tokens it scored and produced:
        ``counted``, None for a step that prefilled); the price of a draft token for the step about to be drafted."""
        if self._last_step_at is not None and counted is not None:
            # A plugin that prices its own time (hybrid's sources) leaves it out: the fit is the
            # target's step, what verifying one more token costs.
            seconds = now - self._last_step_at - self._last_plugin_s
            self.policy.observe_step(counted[0], counted[1], seconds, rows=rows)
        self._last_step_at = now
        self.token_cost = self.policy.token_cost(rows=rows)
        self.metrics.token_cost(self.token_cost)
        return self.token_cost

    def _wants_target_topk(self) -> bool:
        try:
            return bool(self.proposer.wants_target_topk())
        except Exception:
            return True  # capture as before; the failing proposer is already counted by propose()

    def _periodic(self) -> None:
        extra = f" token_cost={self.token_cost}" if self.policy is not None else ""
        if self.target_topk is not None:
            t = self.target_topk
            extra += f" target_topk steps={t.steps} mismatched={t.mismatched_steps} seconds={t.topk_seconds:.3f}"
        self.accounting.periodic(self.breaker, self.policy, self.proposer, extra)


def tokenizer_fingerprint(tokenizer_path: str) -> str:
    """Identity of a tokenizer's vocabulary, for files learned with one model and loaded with another."""
    from transformers import AutoTokenizer

    from freespec.proposers.vocab import vocab_fingerprint

    return vocab_fingerprint(AutoTokenizer.from_pretrained(tokenizer_path).get_vocab())
