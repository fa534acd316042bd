"""One engine step as the adapter ran it: a frozen record built once per ``propose`` call.

The next call reads it to measure the step that just ran: which drafts vLLM was given (acceptance, by
source and padding), when the call started and what the plugin's own time was (the policy's step-time fit,
``step_aside``'s measure), and the price the step was drafted at. Accounting reads the same record to count
the step. Nothing else carries a step's state from one call to the next.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence


@dataclass(frozen=True)
class StepRecord:
    """What one adapter call did (row order is the batch's)."""

    started: Optional[float]  # perf_counter at the call's start; None: the breaker kept the plugin out (a gap)
    keys: Sequence[int]  # the rows' request keys
    tokens: Sequence[list[int]]  # the token ids vLLM was given for each row
    prefilling: frozenset = frozenset()  # keys whose row was a partial prefill chunk (nothing to measure)
    measured: bool = True  # False: the next step reads no acceptance of ``tokens`` (the breaker was or went open)
    plugin_s: Optional[float] = None  # the plugin's own seconds; None: it was not asked (breaker open, aside)
    sources: Optional[Sequence[Optional[str]]] = None  # each draft's source, where the plugin named one
    padding: Optional[Sequence[int]] = None  # filler tokens ending each row's draft, with padding on
    source_seconds: Optional[dict[str, float]] = None  # the plugin's seconds by source, where it names them
    token_cost: Optional[float] = None  # the policy's price of a draft token in this step

    @property
    def drafted(self) -> bool:
        """Whether the plugin was asked to draft (step_aside's mode)."""
        return self.plugin_s is not None

    def given(self) -> dict[int, list[int]]:
        """Request key -> the tokens vLLM was given, for the next step to measure; empty when not measured."""
        return dict(zip(self.keys, self.tokens)) if self.measured else {}

    def by_key(self, values: Optional[Sequence], keys: Sequence[int], default=None) -> list:
        """``values`` (``sources`` or ``padding``, in this record's rows) for ``keys``, the next step's rows."""
        if values is None:
            return [default] * len(keys)
        of = dict(zip(self.keys, values))
        return [of.get(key, default) for key in keys]


START = StepRecord(None, (), ())  # before the first step


class Drafted(NamedTuple):
    """What the plugin's call in a step gave vLLM (``StepRecord`` keeps it for the next step)."""

    tokens: list[list[int]]  # the token ids for each row
    padding: Optional[list[int]]  # filler tokens ending each row's draft, with padding on
    sources: Optional[list[Optional[str]]]  # each draft's source, where the plugin named one
    seconds_by: Optional[dict[str, float]]  # the plugin's seconds by source
    failure: Optional[str]  # what the plugin raised; None: it drafted
