"""The ``custom_class`` adapter: vLLM's batch in, a freespec proposer's drafts out.

vLLM builds ``FreespecProposer(vllm_config)`` in each worker and calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)`` once per
step. The adapter keys requests by vLLM's request ids, read from the runner's
input batch (falling back to inferring identity from the tokens,
``RequestTracker``), hands the proposer one ``Row`` per batch row, and makes whatever comes back safe for vLLM:
at most k in-vocabulary token ids per row, none past the model's length limit.
A proposer that raises drafts nothing for that step: the text is unchanged
(vLLM decodes one token as without speculation), the first error is logged
with its traceback, later ones are counted. A circuit breaker
(``CircuitBreaker``) switches a plugin off for a back-off period when its
steps keep failing or overrun the step budget (``step_budget_ms``), and tries
it again; every transition is logged and ``breaker_state()`` reads it.

Each worker logs its counters every vLLM stats interval (``settings.stats_interval_s``) and exports
them as Prometheus metrics (``metrics``): tokens drafted and accepted, steps with and without a draft,
the plugin's seconds per step, errors, the breaker's on/off state, the policy's bar and step-time fit.

Under tensor parallelism every rank builds this adapter, but vLLM takes drafts
from one rank only (``ranks.draft_rank``). On the others no proposer is built,
so no datastore is mapped, no draft model loaded, no matrix kept, and
``propose`` returns empty drafts at once.
"""
from __future__ import annotations

import logging
import sys
import time

import numpy as np

from freespec import settings
from freespec.proposers.base import EngineInfo, Row
from freespec.proposers.padding import context_padding
from freespec.proposers.registry import load_proposer_class
from freespec.vllm_plugins.request_tracker import RequestTracker
from freespec.scorers.policy import GoodputPolicy
from freespec.vllm_plugins.frontend import ADDITIONAL_CONFIG_KEY, adapter_number, validate_options
from freespec.vllm_plugins.metrics import PluginMetrics
from freespec.vllm_plugins.ranks import draft_rank
from freespec.vllm_plugins.target_topk import TargetTopK

logger = logging.getLogger("freespec")

PADDING = "padding"  # the metrics' source name for padding tokens (docs/policy.md)
# Seconds between exports of the policy's step-time fit (a loop over a few dozen buckets; the bar itself is
# exported whenever it changes).
FIT_EVERY_S = 1.0


class ProposerStats:
    """Counters the adapter keeps per worker; logged periodically and readable in tests."""

    def __init__(self) -> None:
        self.steps = 0
        self.rows = 0
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0  # draft tokens vLLM accepted (read from the next step's sampled tokens)
        self.errors = 0
        self.overruns = 0  # steps over step_budget_ms
        self.skipped_steps = 0  # steps the circuit breaker kept the plugin out of
        self.steps_without_ids = 0  # steps whose rows were told apart by fingerprint: vLLM's ids unreadable
        self.padded_tokens = 0  # filler tokens added to drafts to reach a faster step size ("pad")
        self.padding_accepted = 0  # of those, accepted by the target
        self.trimmed_tokens = 0  # draft tokens dropped for a step size that pays better ("pad": "auto")
        self.expected_accepted = 0.0  # draft tokens (not padding) the plugin expected accepted, where it says
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
        budget_given = cfg.get("step_budget_ms")
        budget_ms = adapter_number("step_budget_ms", budget_given)
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
        self.policy = GoodputPolicy() if cfg.get("policy", "goodput") == "goodput" else None
        # Each one-request step scores the size with the most expected output per measured second
        # (GoodputPolicy.step_size): "pad": "auto", the default with the goodput policy, pads a draft or drops
        # its last tokens (where the plugin estimates its tokens' chances); "longer" only pads; "off".
        pad = cfg.get("pad", "auto") if self.policy is not None else "off"
        self.pad, self.trim = pad != "off", pad == "auto"
        self._last_padding: dict = {}
        self._last_step_at: float | None = None
        self._last_plugin_s = 0.0  # the last step's plugin time, left out of the policy's fit (prices_own_time)
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
        self._last_sources: dict[int, str | None] = {}  # request key -> the source of that draft (metrics)
        self._prefilling: set[int] = set()  # keys whose last step was a partial prefill chunk
        self.tracker = RequestTracker()
        self._batch = None  # vLLM's input batch, once found (request ids)
        self._ids_warned = False
        self.stats = ProposerStats()
        self.breaker = CircuitBreaker(self._step_budget_s(budget_ms / 1000.0, budget_given is not None), self.plugin)
        self.metrics = PluginMetrics(self.plugin)
        self._enabled = True  # as last exported: the breaker is not open
        self._log_every_s = settings.stats_interval_s()  # vLLM's stats interval; 0: every step
        self._last_log = self._last_fit = time.monotonic()
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
        ids = self._request_ids(sys._getframe(1), token_ids_cpu, n_rows)
        self.stats.steps_without_ids += ids is None
        keys, departed = self.tracker.update(views, ids)
        prev = [None if key in self._prefilling else self._last_drafts.get(key) for key in keys]
        accepted = accepted_tokens(views, prev)
        accepted_by = None
        if self._last_sources or self._last_padding:
            accepted_by = accepted_by_source(views, prev, [self._last_sources.get(key) for key in keys], self.plugin,
                                             [self._last_padding.get(key, 0) for key in keys])
            self.stats.padding_accepted += accepted_by.get(PADDING, 0)
        if not self.breaker.allow():
            return self._skip(keys, departed, n_rows, accepted, accepted_by)
        start = time.perf_counter()
        failure = None
        try:
            if self.policy is not None:
                self._observe_step(views, keys, start)
            for key in departed:
                self.proposer.release(key)
            if self.target_topk is not None:
                scored = self.target_topk.scored(views, [self._last_drafts.get(key, []) for key in keys])
                if scored is not None:
                    self.proposer.observe(scored)
                self.proposer.observe_capture_seconds(self.target_topk.take_seconds())
            rows = [Row(key, tokens, num_new) for key, (tokens, num_new) in zip(keys, views)]
            drafts = self.proposer.propose(rows)
            if len(drafts) != n_rows:
                raise ValueError(f"plugin returned {len(drafts)} drafts for {n_rows} rows")
            drafts = [self._safe(d, int(lengths[i]), views[i][1]) for i, d in enumerate(drafts)]
            if self.pad:
                drafts, padding = self._sized(drafts, views, lengths)
        except Exception as e:
            failure = f"{type(e).__name__}: {e}"
            self.stats.errors += 1
            self.metrics.error()
            if self.stats.errors == 1:
                logger.exception("freespec: plugin %r failed; this step drafts nothing (logged once)", self.plugin)
            drafts = [[] for _ in range(n_rows)]
        self._last_drafts = dict(zip(keys, drafts))
        self._last_padding = dict(zip(keys, padding)) if failure is None and self.pad else {}
        sources = self._draft_sources(n_rows) if failure is None else None
        seconds_by = self._source_seconds() if failure is None else None
        self._last_sources = dict(zip(keys, sources)) if sources is not None else {}
        if self.target_topk is not None:
            self.target_topk.active = self._wants_target_topk()
        self._prefilling = {key for key, (_, num_new) in zip(keys, views) if num_new == 0}
        seconds = time.perf_counter() - start
        self._last_plugin_s = seconds if getattr(self.proposer, "prices_own_time", False) else 0.0
        if seconds > self.breaker.budget_s:
            self.stats.overruns += 1
        if self.breaker.record(failure, seconds):
            self._opened(keys, forget=failure is not None)
        self._count(drafts, seconds, accepted, accepted_by, sources, seconds_by, padding if self._last_padding else None)
        return drafts

    def _draft_sources(self, n_rows: int) -> list | None:
        """The plugin's source of each row's draft (metrics); None when it names none or answers badly."""
        try:
            sources = self.proposer.draft_sources()
        except Exception:
            return None
        if sources is None or len(sources) != n_rows:
            return None
        return [s if isinstance(s, str) else None for s in sources]

    def _source_seconds(self) -> dict[str, float] | None:
        """The plugin's seconds by source for this step (metrics); None when it names none or answers badly."""
        try:
            by = self.proposer.source_seconds()
        except Exception:
            return None
        if not isinstance(by, dict):
            return None
        return {str(k): float(v) for k, v in by.items() if isinstance(v, (int, float)) and v >= 0}

    def _request_ids(self, caller, token_ids_cpu, n_rows: int) -> list[str] | None:
        """The engine's request id of each row, read from vLLM's input batch; None where it cannot be read.

        The seam passes no ids, but its caller is the model runner's ``propose_draft_token_ids``, whose
        ``self.input_batch`` holds ``token_ids_cpu`` (the very array passed) and ``req_ids`` in the same row
        order. The batch is found once through the caller's frame and then reused while it still holds this
        array; anything unexpected (another vLLM, another caller, ids missing or repeated) falls back to the
        fingerprint tracker, with one log line.
        """
        batch = self._batch
        if batch is None or getattr(batch, "token_ids_cpu", None) is not token_ids_cpu:
            batch = None
            try:
                runner = caller.f_locals.get("self") if caller is not None else None
                candidate = getattr(runner, "input_batch", None)
                if getattr(candidate, "token_ids_cpu", None) is token_ids_cpu:
                    batch = candidate
            except Exception:
                batch = None
            self._batch = batch
        ids = None
        if batch is not None:
            try:
                ids = list(batch.req_ids[:n_rows])
            except Exception:
                ids = None
            if ids is not None and (len(ids) != n_rows or not all(isinstance(i, str) for i in ids)
                                    or len(set(ids)) != n_rows):
                ids = None
        if ids is None and not self._ids_warned:
            self._ids_warned = True
            logger.warning("freespec: vLLM's request ids cannot be read here; requests are told apart by their "
                           "first tokens, length and last token (docs/reliability.md: request identity)")
        return ids

    def breaker_state(self) -> dict:
        """The circuit breaker's state (``closed``, ``open``, ``half_open``), its counters and back-off."""
        if self.breaker is None:
            return {"state": "not drafting"}
        return self.breaker.state_dict()

    def _skip(self, keys: list[int], departed: list[int], n_rows: int, accepted: int,
              accepted_by: dict[str, int] | None = None) -> list[list[int]]:
        """A step while the breaker is open: no drafts, nothing asked of the plugin but freeing departed requests."""
        self.stats.skipped_steps += 1
        self._release(departed)
        self._last_drafts = {}
        self._last_sources = {}
        self._prefilling = set()
        self._last_step_at = None  # the policy's step-time fit skips the gap
        if self.target_topk is not None:
            self.target_topk.active = False  # no top-k copied for a plugin that is off
        self._count([[] for _ in range(n_rows)], None, accepted, accepted_by)
        return [[] for _ in range(n_rows)]

    def _opened(self, keys: list[int], forget: bool) -> None:
        """The breaker has just opened. A plugin that raised (``forget``) forgets the live requests' state
        (it may be what fails) and sees them as new requests when tried again (their keys are unchanged).

        A plugin that was only slow keeps it: every row carries its whole sequence, so at the trial step it
        catches up on the steps it missed. Forgetting would make that trial re-read every live request (pearl
        re-prefills each context in the step), so the trial overran, the breaker opened again with twice the
        back-off, and the plugin drafted nothing while those requests lived.
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
                self.stats.errors += 1
                self.metrics.error()

    def _observe_step(self, views, keys, now: float) -> None:
        """Feed the policy the step that just ran (time since the last call, tokens it scored and produced)."""
        if self._last_step_at is not None:
            prev = [None if key in self._prefilling else self._last_drafts.get(key) for key in keys]
            counted = step_tokens(views, prev)
            if counted is not None:
                # A plugin that prices its own time (hybrid's sources) leaves it out: the fit is the
                # target's step, what verifying one more token costs.
                seconds = now - self._last_step_at - self._last_plugin_s
                self.policy.observe_step(counted[0], counted[1], seconds, rows=len(views))
        self._last_step_at = now
        self.proposer.token_cost = self.policy.token_cost(rows=len(views))
        self.metrics.token_cost(self.proposer.token_cost)

    def _wants_target_topk(self) -> bool:
        try:
            return bool(self.proposer.wants_target_topk())
        except Exception:
            return True  # capture as before; the failing proposer is already counted by propose()

    def _sized(self, drafts: list[list[int]], views, lengths) -> tuple[list[list[int]], list[int]]:
        """The drafts padded, or cut, to the step size the policy expects to pay best, and each row's padding.

        Only steps of one request, decoding: that is where a larger step was measured faster (docs/policy.md);
        with four requests at a time the step time rose steadily with the tokens scored (results/step-shape).
        """
        if len(drafts) != 1 or views[0][1] == 0:
            return drafts, [0] * len(drafts)
        draft = drafts[0]
        chances = self._chances(len(draft)) if self.trim else None
        room = max(len(draft), min(self.k, self.max_model_len - 1 - int(lengths[0])))
        extra = self.policy.step_size(1 + len(draft), 1 + room, chances) - 1 - len(draft)
        if extra < 0:
            self.stats.trimmed_tokens -= extra
            draft = draft[:extra]
        if chances is not None:
            self.stats.expected_accepted += sum(chances[: len(draft)])
        if extra <= 0:
            return [draft], [0]
        self.stats.padded_tokens += extra
        return [draft + context_padding(views[0][0], draft, extra)], [extra]

    def _chances(self, n: int) -> list[float] | None:
        """The plugin's chances for a one-row draft of ``n`` tokens (``Proposer.draft_chances``); None when it
        gives none, or not one per token."""
        try:
            chances = self.proposer.draft_chances()
        except Exception:
            return None
        if not chances or len(chances) != 1 or len(chances[0]) < n:
            return None
        return [float(c) for c in chances[0][:n]]

    def _safe(self, draft, num_tokens: int, num_new: int) -> list[int]:
        if num_new == 0:
            return []  # partial prefill: vLLM takes no draft for this row
        room = self.max_model_len - 1 - num_tokens
        draft = [int(t) for t in draft[: max(0, min(self.k, room))]]
        for t in draft:
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"draft token {t} outside the vocabulary [0, {self.vocab_size})")
        return draft

    def _count(self, drafts: list[list[int]], seconds: float | None, accepted: int,
               accepted_by: dict[str, int] | None = None, sources: list | None = None,
               seconds_by: dict[str, float] | None = None, padding: list[int] | None = None) -> None:
        """Account one step (``seconds``: the plugin's time, None when the breaker kept it out; ``accepted_by``,
        ``sources`` and ``seconds_by``: the accepted tokens, this step's drafts and its seconds by source, for
        plugins that name them; ``padding``: each row's padding tokens, counted under the source ``padding``)."""
        s = self.stats
        drafted = sum(1 for d in drafts if d)
        tokens = sum(len(d) for d in drafts)
        s.steps += 1
        s.rows += len(drafts)
        s.drafts += drafted
        s.draft_tokens += tokens
        s.accepted_tokens += accepted
        s.propose_seconds += seconds or 0.0
        draft_by = None
        if sources is not None or padding is not None:
            draft_by = {}
            for draft, source, pad in zip(drafts, sources or [None] * len(drafts), padding or [0] * len(drafts)):
                if len(draft) > pad:
                    name = source or self.plugin
                    draft_by[name] = draft_by.get(name, 0) + len(draft) - pad
                if pad:
                    draft_by[PADDING] = draft_by.get(PADDING, 0) + pad
        self.metrics.step(tokens, accepted, drafted > 0, seconds, draft_by, accepted_by, seconds_by)
        enabled = self.breaker.state != "open"
        if enabled != self._enabled:
            self._enabled = enabled
            self.metrics.switched(enabled, self.breaker.last_kind)
        now = time.monotonic()
        if now - self._last_fit >= FIT_EVERY_S:
            self._last_fit = now
            if self.policy is not None:
                self.metrics.step_fit(self.policy.model.fit())
            try:
                self.metrics.file_events(self.proposer.file_events())
            except Exception:
                pass  # a plugin's counts are for metrics only
        if now - self._last_log >= self._log_every_s:
            self._last_log = now
            self._log_stats()

    def _log_stats(self) -> None:
        """The periodic log line (vLLM's stats interval)."""
        extra = ""
        if self.policy is not None:
            extra = f" token_cost={self.proposer.token_cost}"
        if self.breaker.state != "closed" or self.breaker.opens:
            extra += f" breaker={self.breaker.state_dict()}"
        if self.target_topk is not None:
            t = self.target_topk
            extra += f" target_topk steps={t.steps} mismatched={t.mismatched_steps} seconds={t.topk_seconds:.3f}"
        logger.info("freespec: plugin %r stats %s%s", self.plugin, self.stats.as_dict(), extra)


class CircuitBreaker:
    """Switch a plugin off while its steps keep failing or overrunning the budget, and try it again later.

    Closed (the plugin runs): a *bad* step raised or took longer than ``budget_s``. ``TRIP_AFTER`` bad
    steps in a row, or one step over ``STALL_FACTOR`` x the budget (a stall: the next steps must not
    pay it again), open the breaker. The first ``GRACE_STEPS`` steps are not timed (JIT compilation, a
    cold page cache). Open: every step drafts nothing and the plugin is not called, for the back-off
    period. Then half-open: one trial step; if it is good the breaker closes, else it opens again with
    twice the back-off (from ``BACKOFF_S[0]`` up to ``BACKOFF_S[1]``). The back-off returns to its start
    once the plugin has stayed closed for ``HEALTHY_S``. Every transition is logged as a warning.

    A step is synchronous in vLLM's worker, so a step that overruns has already cost its time; the breaker
    makes sure the following steps do not.
    """

    TRIP_AFTER = 3
    STALL_FACTOR = 10.0
    GRACE_STEPS = 2
    BACKOFF_S = (1.0, 300.0)
    HEALTHY_S = 60.0

    def __init__(self, budget_s: float, name: str, clock=time.monotonic) -> None:
        self.budget_s = budget_s
        self.name = name
        self._clock = clock
        self.state = "closed"
        self.steps = 0
        self.bad_in_a_row = 0
        self.opens = 0
        self.skipped_steps = 0
        self.backoff_s = self.BACKOFF_S[0]  # the next open lasts this long
        self.retry_at = 0.0
        self.closed_since = clock()
        self.last_reason = ""
        self.last_kind = ""  # why it last opened, one of metrics.OFF_REASONS

    def allow(self) -> bool:
        """Whether the plugin runs this step (an open breaker whose back-off is over lets one trial through)."""
        if self.state != "open":
            return True
        if self._clock() < self.retry_at:
            self.skipped_steps += 1
            return False
        self.state = "half_open"
        logger.warning("freespec: plugin %r circuit breaker half-open: trying one step", self.name)
        return True

    def record(self, failure: str | None, seconds: float) -> bool:
        """Account one step the plugin ran (``failure``: its error, or None); True if the breaker opened now."""
        self.steps += 1
        timed = self.steps > self.GRACE_STEPS
        over = timed and seconds > self.budget_s
        stalled = timed and seconds > self.STALL_FACTOR * self.budget_s
        bad = failure is not None or over
        reason = failure or (f"step took {1000 * seconds:.0f} ms, budget {1000 * self.budget_s:.0f} ms" if over else "")
        if self.state == "half_open":
            if bad:
                self._open(f"trial step failed ({reason})", "trial_failed")
                return True
            self.state, self.bad_in_a_row, self.closed_since = "closed", 0, self._clock()
            logger.warning("freespec: plugin %r circuit breaker closed: the trial step was good; drafting again",
                           self.name)
            return False
        if not bad:
            self.bad_in_a_row = 0
            if self.backoff_s > self.BACKOFF_S[0] and self._clock() - self.closed_since >= self.HEALTHY_S:
                self.backoff_s = self.BACKOFF_S[0]
            return False
        self.bad_in_a_row += 1
        if stalled:
            self._open(f"{reason}, over {self.STALL_FACTOR:g}x the budget", "stall")
            return True
        if self.bad_in_a_row >= self.TRIP_AFTER:
            kind = "error" if failure is not None else "over_budget"
            self._open(f"{self.bad_in_a_row} bad steps in a row, the last: {reason}", kind)
            return True
        return False

    def _open(self, reason: str, kind: str) -> None:
        self.state = "open"
        self.opens += 1
        self.last_reason, self.last_kind = reason, kind
        self.retry_at = self._clock() + self.backoff_s
        logger.warning("freespec: plugin %r circuit breaker open: %s; drafting nothing for %.0f s, then one trial "
                       "step (open %d times so far)", self.name, reason, self.backoff_s, self.opens)
        self.backoff_s = min(2 * self.backoff_s, self.BACKOFF_S[1])
        self.bad_in_a_row = 0

    def state_dict(self) -> dict:
        return {
            "state": self.state,
            "budget_ms": round(1000 * self.budget_s, 3),
            "bad_in_a_row": self.bad_in_a_row,
            "opens": self.opens,
            "skipped_steps": self.skipped_steps,
            "retry_in_s": round(max(0.0, self.retry_at - self._clock()), 3) if self.state == "open" else 0.0,
            "next_backoff_s": self.backoff_s,
            "last_reason": self.last_reason,
        }


def accepted_by_source(views, prev_drafts, prev_sources, default: str, prev_padding) -> dict[str, int]:
    """``accepted_tokens`` split by the source each row's draft came from (``default`` where none was named),
    and ``padding`` for accepted tokens of the padding that ended a draft (``prev_padding``: its length)."""
    by: dict[str, int] = {}
    for (_, num_new), draft, source, pad in zip(views, prev_drafts, prev_sources, prev_padding):
        if draft and num_new > 0:
            accepted = min(len(draft), num_new - 1)
            of_padding = max(0, accepted - (len(draft) - pad))
            name = source or default
            by[name] = by.get(name, 0) + accepted - of_padding
            if of_padding:
                by[PADDING] = by.get(PADDING, 0) + of_padding
    return by


def accepted_tokens(views, prev_drafts) -> int:
    """Draft tokens the target accepted in the step just run: for each row given a draft last step, its new
    tokens minus the one vLLM samples itself, at most the draft's length. ``prev_drafts[i]``: None for a row
    that was new or mid-prefill (nothing was drafted for it)."""
    accepted = 0
    for (_, num_new), draft in zip(views, prev_drafts):
        if draft and num_new > 0:
            accepted += min(len(draft), num_new - 1)
    return accepted


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
