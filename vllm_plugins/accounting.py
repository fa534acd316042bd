"""What the adapter counts per worker: tokens drafted and accepted (by source), steps, errors, the plugin's
time; logged every vLLM stats interval (``settings.stats_interval_s``) and exported as Prometheus metrics
(``metrics``).

Acceptance is read from the next step: a row that was given a draft gained its accepted draft tokens plus
the one token vLLM samples itself.
"""
from __future__ import annotations

import logging
import time

from freespec import settings
from freespec.vllm_plugins.metrics import PluginMetrics
from freespec.vllm_plugins.step_record import StepRecord

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
        self.aside_steps = 0  # steps the plugin sat out because decoding without it was faster (step_aside)
        self.steps_without_ids = 0  # steps whose rows were told apart by fingerprint: vLLM's ids unreadable
        self.padded_tokens = 0  # filler tokens added to drafts to reach a faster step size ("pad")
        self.padding_accepted = 0  # of those, accepted by the target
        self.trimmed_tokens = 0  # draft tokens dropped for a step size that pays better ("pad": "auto")
        self.expected_accepted = 0.0  # draft tokens (not padding) the plugin expected accepted, where it says
        self.propose_seconds = 0.0

    def as_dict(self) -> dict:
        return dict(vars(self))


class StepAccounting:
    """The adapter's counters and metrics for one plugin: ``count`` accounts a step, and every
    ``FIT_EVERY_S`` exports the policy's fit and the plugin's file events; every stats interval it logs."""

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.stats = ProposerStats()
        self.metrics = PluginMetrics(plugin)
        self._enabled = True  # as last exported: the breaker is not open
        self._log_every_s = settings.stats_interval_s()  # vLLM's stats interval; 0: every step
        self._last_log = self._last_fit = time.monotonic()

    def error(self) -> None:
        self.stats.errors += 1
        self.metrics.error()

    def count(self, step: StepRecord, accepted: int, accepted_by: dict[str, int] | None = None) -> None:
        """Account one step (``step``: what the adapter did in it; ``accepted`` and ``accepted_by``: the last
        step's draft tokens accepted, split by source for plugins that name them; padding tokens are counted
        under the source ``padding``)."""
        s = self.stats
        drafts, sources, padding = step.tokens, step.sources, step.padding
        drafted = sum(1 for d in drafts if d)
        tokens = sum(len(d) for d in drafts)
        s.steps += 1
        s.rows += len(drafts)
        s.drafts += drafted
        s.draft_tokens += tokens
        s.accepted_tokens += accepted
        s.propose_seconds += step.plugin_s or 0.0
        draft_by = None
        if sources is not None or padding is not None:
            draft_by = {}
            for draft, source, pad in zip(drafts, sources or [None] * len(drafts), padding or [0] * len(drafts)):
                if len(draft) > pad:
                    name = source or self.plugin
                    draft_by[name] = draft_by.get(name, 0) + len(draft) - pad
                if pad:
                    draft_by[PADDING] = draft_by.get(PADDING, 0) + pad
        self.metrics.step(tokens, accepted, drafted > 0, step.plugin_s, draft_by, accepted_by, step.source_seconds)

    def periodic(self, breaker, control, proposer, extra: str) -> None:
        """Export the breaker's state when it changed, the policy's fit and the plugin's file events every
        ``FIT_EVERY_S``, and log the counters every stats interval (``extra``: the adapter's own words)."""
        enabled = breaker.state != "open"
        if enabled != self._enabled:
            self._enabled = enabled
            self.metrics.switched(enabled, breaker.last_kind)
        now = time.monotonic()
        if now - self._last_fit >= FIT_EVERY_S:
            self._last_fit = now
            self.metrics.step_fit(control.fit())
            try:
                self.metrics.file_events(proposer.file_events())
            except Exception:
                pass  # a plugin's counts are for metrics only
        if now - self._last_log >= self._log_every_s:
            self._last_log = now
            if breaker.state != "closed" or breaker.opens:
                extra += f" breaker={breaker.state_dict()}"
            logger.info("freespec: plugin %r stats %s%s", self.plugin, self.stats.as_dict(), extra)


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
