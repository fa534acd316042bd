"""The ``custom_class`` adapter: vLLM's batch in, a freespec proposer's drafts out.

vLLM builds ``FreespecProposer(vllm_config)`` in each worker and calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)`` once per step. The adapter keys
requests by vLLM's request ids (``request_ids``; else by their tokens, ``RequestTracker``), calls the
proposer's ``draft(rows, step)`` with one ``Row`` per batch row (its scope by the ``scope`` option) and the step's context (the policy's price
of a draft token), has the controller cut and size what comes back (``scorers.controller``) and makes it
safe for vLLM: at most k in-vocabulary token ids per row, none past the model's length limit. Each step is
one frozen record (``step_record.StepRecord``), read by the next step's measures and by accounting.

A proposer that raises drafts nothing for that step: the text is unchanged (vLLM decodes one token as
without speculation), the first error is logged with its traceback, later ones are counted. A circuit
breaker (``breaker.CircuitBreaker``) switches a plugin off for a back-off period when its steps keep
failing or overrun the step budget, and tries it again. A plugin whose own time does not pay for itself
(a draft model that does not keep up with the target) steps aside: the controller measures decoding with and
without it and keeps the faster (``scorers.step_aside``). Counters and metrics: ``accounting``.

Under tensor parallelism every rank builds this adapter, but vLLM takes drafts from one rank only
(``ranks.draft_rank``). On the others no proposer is built, so no datastore is mapped, no draft model
loaded, no matrix kept, and ``propose`` returns empty drafts at once.
"""
from __future__ import annotations

import logging
import sys
import time
from contextlib import nullcontext

import numpy as np

from freespec.proposers.learned import exit_save
from freespec.proposers.api import SHARED_SCOPE, EngineInfo, Row, StepContext
from freespec.proposers.registry import load_proposer_class
from freespec.proposers.learned.state_dir import cap_total, open_root
from freespec.proposers.vocab import vocab_fingerprint
from freespec.scorers.controller import DraftController
from freespec.vllm_plugins.accounting import (
    PADDING, StepAccounting, accepted_by_source, accepted_tokens, step_tokens,
)
from freespec.vllm_plugins.breaker import CircuitBreaker, step_budget_s
from freespec.vllm_plugins.draft_checks import checked_draft, draft_rooms
from freespec.vllm_plugins.frontend import ADDITIONAL_CONFIG_KEY, check_additional_config
from freespec.vllm_plugins.idle_save import IdleSave, warn_if_stop_skips_saves
from freespec.vllm_plugins.patches import install_in_worker
from freespec.vllm_plugins.ranks import draft_rank
from freespec.vllm_plugins.request_ids import BatchRequestIds
from freespec.vllm_plugins.request_tracker import RequestTracker
from freespec.vllm_plugins.step_record import START, Drafted, StepRecord
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
        self.idle_save: IdleSave | None = None
        if not self.drafting:
            self.proposer = None
            logger.info("freespec: %s: plugin %r not built here (%s); this rank drafts nothing",
                        where.rank, self.plugin, where.why)
            return
        logger.info("freespec: %s: plugin %r runs here (%s)", where.rank, self.plugin, where.why)
        # Whether drafting pays and how much is drafted: the goodput policy, its padding, step-aside.
        self.control = DraftController(adapter.policy, adapter.pad, adapter.step_aside)
        self.k = int(spec.num_speculative_tokens)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.proposer = load_proposer_class(self.plugin)(options, self.k)
        if adapter.state_dir is not None:  # at start, before this process's sources load and write their files
            cap_total(open_root(adapter.state_dir, trust_others=adapter.state_dir_trust_others), adapter.state_dir_max_bytes)
        model_config = vllm_config.model_config
        saving = len(exit_save.registered())
        self.proposer.bind(EngineInfo(
            vocab_size=self.vocab_size, model=str(model_config.model),
            tokenizer_fingerprint=lambda: tokenizer_fingerprint(model_config.tokenizer), state_dir=adapter.state_dir,
            state_max_age_s=adapter.state_max_age_s, state_max_bytes=adapter.state_max_bytes))
        warn_if_stop_skips_saves(vllm_config)
        # What the last requests before a quiet spell taught is saved without a next step (idle_save).
        if len(exit_save.registered()) > saving:  # this plugin saves learned state
            self.idle_save = IdleSave(self.proposer)
        # Proposers that learn from the target's own predictions get them through this adapter.
        self.target_topk = TargetTopK(self.proposer.target_topk) if self.proposer.target_topk else None
        self.last = START  # the last step, as the next one measures it
        self.tracker = RequestTracker()
        self.request_ids = BatchRequestIds()
        self.scope = adapter.scope
        self.accounting = StepAccounting(self.plugin)
        self.stats = self.accounting.stats
        self.breaker = CircuitBreaker(
            step_budget_s(self.proposer, self.plugin, adapter.budget_s, adapter.step_budget_ms is not None), self.plugin)
        logger.info("freespec: plugin %r with k=%d and options %s", self.plugin, self.k, options.model_dump())

    def load_model(self, target_model) -> None:
        """vLLM hands over the target model; only the ``target_topk`` adapter needs it."""
        if self.drafting and self.target_topk is not None:
            self.target_topk.install(target_model)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **_):
        if not self.drafting:  # vLLM ignores this rank's drafts
            return [[] for _ in range(len(sampled_token_ids))]
        caller = sys._getframe(1)  # vLLM's, where the batch's request ids are read (request_ids)
        with self.idle_save.step() if self.idle_save is not None else nullcontext():
            return self._propose(caller, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def _propose(self, caller, sampled_token_ids, num_tokens_no_spec, token_ids_cpu):
        n_rows = len(sampled_token_ids)
        lengths = np.asarray(num_tokens_no_spec[:n_rows])
        views = [(token_ids_cpu[i, : lengths[i]], len(sampled_token_ids[i])) for i in range(n_rows)]
        ids = self.request_ids.read(caller, token_ids_cpu, n_rows)
        self.stats.steps_without_ids += ids is None
        keys, departed = self.tracker.update(views, ids)
        given = self.last.given()
        counted, accepted, accepted_by = self._last_outcome(views, keys, given)
        prefilling = frozenset(key for key, (_, num_new) in zip(keys, views) if num_new == 0)
        if not self.breaker.allow():  # no drafts, nothing asked of the plugin but freeing departed requests
            self.stats.skipped_steps += 1
            return self._draft_nothing(keys, departed, accepted, accepted_by, cost=self.last.token_cost)
        start = time.perf_counter()
        decided = self._decide(n_rows, counted, start)
        if decided is None:  # the controller failed: this step drafts nothing
            return self._draft_nothing(keys, departed, accepted, accepted_by, cost=self.last.token_cost)
        drafts_now, cost = decided
        if not drafts_now:  # step_aside: no drafts; the policy has learned the plain step all the same
            self.stats.aside_steps += 1
            return self._draft_nothing(keys, departed, accepted, accepted_by, start, prefilling, cost)
        drafted = self._draft(keys, views, lengths, ids, departed, given, cost)
        return self._record(start, keys, prefilling, drafted, cost, accepted, accepted_by)

    def _last_outcome(self, views, keys: list[int], given: dict[int, list[int]]):
        """The last step's drafts read off this step's rows: (tokens scored, accepted, accepted by source)."""
        last = self.last
        prev = [None if key in last.prefilling else given.get(key) for key in keys]
        counted, accepted, accepted_by = step_tokens(views, prev), accepted_tokens(views, prev), None
        if given and (last.sources is not None or last.padding is not None):
            accepted_by = accepted_by_source(views, prev, last.by_key(last.sources, keys), self.plugin,
                                             last.by_key(last.padding, keys, 0))
            self.stats.padding_accepted += accepted_by.get(PADDING, 0)
        return counted, accepted, accepted_by

    def _decide(self, n_rows: int, counted, start: float) -> tuple[bool, float | None] | None:
        """The controller's (draft or step aside, price of a draft token); None where it failed (counted)."""
        last = self.last
        own_s = (last.plugin_s or 0.0) if self.proposer.prices_own_time else 0.0
        try:
            decided = self.control.step(n_rows, counted, start, last.started, len(last.keys), last.drafted,
                                        last.plugin_s or 0.0, own_s, last.token_cost)
        except Exception:
            self.accounting.error()
            if self.stats.errors == 1:
                logger.exception("freespec: the draft controller failed; this step drafts nothing (logged once)")
            return None
        for change in self.control.changes():
            logger.info("freespec: plugin %r at %s", self.plugin, change)
        if self.control.policy is not None:
            self.metrics.token_cost(decided[1])
        return decided

    def _draft(self, keys, views, lengths, ids, departed, given, cost) -> Drafted:
        """The plugin's drafts, made safe and sized; a plugin that raises drafts nothing (counted, logged once)."""
        try:
            for key in departed:
                self.proposer.release(key)
            step, drafts = self._ask(keys, views, ids, given, cost)
            return self._shape(drafts, step, views, lengths)
        except Exception as e:
            self.accounting.error()
            if self.stats.errors == 1:
                logger.exception("freespec: plugin %r failed; this step drafts nothing (logged once)", self.plugin)
            return Drafted([[] for _ in keys], None, None, None, f"{type(e).__name__}: {e}")

    def _ask(self, keys, views, ids, given, cost):
        """The step's context and the plugin's drafts, one per row (after the target's top-k it observes)."""
        scopes = self._scopes(ids, len(views))  # read only for a step the plugin drafts in
        capture = 0.0
        if self.target_topk is not None:
            scored = self.target_topk.scored(views, [given.get(key, []) for key in keys], scopes)
            if scored is not None:
                self.proposer.observe(scored)
            capture = self.target_topk.take_seconds()
        step = StepContext(token_cost=cost, budget_s=self.breaker.budget_s, capture_seconds=capture)
        drafts = self.proposer.draft([Row(key, tokens, num_new, scope)
                                      for key, (tokens, num_new), scope in zip(keys, views, scopes)], step)
        if not isinstance(drafts, list) or len(drafts) != len(views):
            raise ValueError(f"plugin returned {len(drafts)} drafts for {len(views)} rows")
        return step, drafts

    def _shape(self, drafts, step: StepContext, views, lengths) -> Drafted:
        """Drafts checked (``draft_checks``) and cut, trimmed and padded by the controller, with their sources."""
        rooms = draft_rooms(views, lengths, self.k, self.max_model_len)
        checked = [checked_draft(d, room, self.vocab_size) for d, room in zip(drafts, rooms)]
        shaped = self.control.shape(checked, step.bar(self.proposer.fixed_bar()), [v[0] for v in views], rooms)
        self.stats.trimmed_tokens += shaped.trimmed
        self.stats.expected_accepted += shaped.expected
        self.stats.padded_tokens += sum(shaped.padding)
        sources = [d.source for d in checked]
        seconds_by = getattr(drafts, "source_seconds", None)
        return Drafted(shaped.tokens, shaped.padding if self.control.pad else None,
                        None if all(s is None for s in sources) else sources,
                        {str(k): float(v) for k, v in seconds_by.items()} or None if seconds_by else None, None)

    def _record(self, start: float, keys, prefilling, drafted: Drafted, cost, accepted: int, accepted_by):
        """The step's end: its time against the breaker, its record kept for the next step and counted."""
        if self.target_topk is not None:
            self.target_topk.active = self._wants_target_topk()
        seconds = time.perf_counter() - start
        if seconds > self.breaker.budget_s:
            self.stats.overruns += 1
        # The breaker just opened: nothing drafted now is measured next step. A plugin that raised forgets the
        # live requests (it may be what fails; tried again, it sees them as new). One that was only slow keeps
        # them: each row carries its whole sequence, so the trial step catches up; forgetting would make the
        # trial re-read every live request (pearl re-prefills each), overrun, and double the back-off.
        opened = self.breaker.record(drafted.failure, seconds)
        if opened and drafted.failure is not None:
            self._release(keys)
        self.last = record = StepRecord(start, keys, drafted.tokens, prefilling, not opened, seconds,
                                        drafted.sources, drafted.padding, drafted.seconds_by, cost)
        self.accounting.count(record, accepted, accepted_by)
        self._periodic()
        return drafted.tokens

    def _scopes(self, ids: list[str] | None, n_rows: int) -> list[str | None]:
        """Each row's scope by the ``scope`` option: its cache_salt's (``"salt"``, through patch
        ``cache_salt_scope``), the shared one (``"global"``), or none (``"none"``)."""
        if self.scope != "salt":  # "none": nothing learned across requests
            return [SHARED_SCOPE if self.scope == "global" else None] * n_rows
        return self.request_ids.scopes(ids, n_rows)

    @property
    def token_cost(self) -> float | None:
        """The policy's last price of a draft token (logged, tests)."""
        return self.last.token_cost

    @property
    def metrics(self):
        """The plugin's Prometheus metrics (``accounting.StepAccounting.metrics``)."""
        return self.accounting.metrics

    @metrics.setter
    def metrics(self, value) -> None:
        self.accounting.metrics = value

    def breaker_state(self) -> dict:
        """The circuit breaker's state (``closed``, ``open``, ``half_open``), its counters and back-off."""
        if self.breaker is None:
            return {"state": "not drafting"}
        return self.breaker.state_dict()

    def _draft_nothing(self, keys, departed: list[int], accepted: int, accepted_by: dict[str, int] | None,
                       start: float | None = None, prefilling: frozenset = frozenset(), cost: float | None = None):
        """A step the plugin is not asked for (no ``start``: not measured): departed requests freed, no drafts."""
        self._release(departed)
        if self.target_topk is not None:
            self.target_topk.active = False  # no top-k copied for a plugin that is off
        self.last = record = StepRecord(start, keys, [[] for _ in keys], prefilling, measured=start is not None,
                                        token_cost=cost)
        self.accounting.count(record, accepted, accepted_by)
        self._periodic()
        return record.tokens

    def _release(self, keys: list[int]) -> None:
        """Tell the plugin these requests are gone; a plugin that raises is counted, never propagated."""
        for key in keys:
            try:
                self.proposer.release(key)
            except Exception:
                self.accounting.error()

    def _wants_target_topk(self) -> bool:
        try:
            return bool(self.proposer.wants_target_topk())
        except Exception:
            return True  # capture as before; the failing proposer is already counted by propose()

    def _periodic(self) -> None:
        extra = f" token_cost={self.last.token_cost}" if self.control.policy is not None else ""
        if self.target_topk is not None:
            t = self.target_topk
            extra += f" target_topk steps={t.steps} mismatched={t.mismatched_steps} seconds={t.topk_seconds:.3f}"
        self.accounting.periodic(self.breaker, self.control, self.proposer, extra)


def tokenizer_fingerprint(tokenizer_path: str) -> str:
    """Identity of a tokenizer's vocabulary, for files learned with one model and loaded with another."""
    from transformers import AutoTokenizer  # heavy: only proposers with files learned per tokenizer ask

    return vocab_fingerprint(AutoTokenizer.from_pretrained(tokenizer_path).get_vocab())
