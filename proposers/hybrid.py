"""The ``hybrid`` proposer: every source proposes, one fused chain per request is drafted.

Sources are one table, ``SOURCE_TABLE``: each entry names the plugin that drafts it, what it offers, the
hybrid option it needs (``retrieval`` a ``datastore``, ``draft`` a ``draft_model``; given, it adds its
source to the defaults) and whether it is a default. A new source is one entry there plus its plugin.
Default: ``DEFAULT_SOURCES`` (no options needed); without a supported arctic-inference the default runs
without ``suffix`` and says so once, while naming ``suffix`` explicitly without it is refused at start.
Each source is built through the registry with its own options under its name, e.g.
``{"plugin": "hybrid", "copy": {"min_match": 3}}``, checked by that plugin's Options (errors name
``copy.min_match``).

Each source offers its candidates (``Proposer.candidates``): ``suffix`` one chain with a learned
chance per token, ``copy`` and ``recycle`` their one chain, ``retrieval`` every sampled continuation of
its longest match, ``draft`` the draft model's chain, already cut where the draft's own confidence
falls below its ``min_confidence`` (RASD's pruning of the draft by its confidence). They are fused by
common prefix (``scorers.fusion``): a token's support is the sum
over sources of the source's chance for that token (``suffix``) or its learned per-token acceptance
rate (the others) times the share of its candidates that agree up to it; the draft follows the
best-supported token while that support is at least ``min_support``, and is returned with the chance that
each prefix is accepted, which the policy cuts where it stops paying for its verification.

Learning is counterfactual: a step's new tokens are the target's own continuation, so every source's
chain is scored against them (``acceptance.matched_prefix``), whichever chain was verified.

Pricing (``scorers.controller.SourcePricing``): each source's own seconds per step are weighed against the
tokens only it got right (beyond the best other source), less the right tokens the fused draft lost by
following it where another source's chain was right (``displaced``), valued at the measured seconds per
output token. A source that cannot pay stops being run and is probed every ``PROBE_EVERY`` steps; when a
probe shows it paying again it is resumed.

Memory: the sum of the sources' (see their docs) plus one short chain per live request and source.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from freespec.proposers.api import SHARED_SCOPE, Draft, Drafts, EngineInfo, Row, ScoredPositions, StepContext
from freespec.proposers.base import Proposer
from freespec.proposers.registry import CopySourceOptions, build_proposer, load_options
from freespec.proposers.suffix_tree import available as suffix_available
from freespec.scorers.acceptance import matched_prefix
from freespec.proposers.api import Candidates
from freespec.scorers.controller import SourcePricing
from freespec.scorers.fusion import SourceWeights, fuse_sources
from freespec.scorers.tuning import PROBE_EVERY
from pydantic import Field, ValidationInfo, create_model, field_validator, model_validator

logger = logging.getLogger("freespec")


@dataclass(frozen=True)
class Source:
    """One of ``hybrid``'s sources: the plugin that drafts it and what ``hybrid`` must know about it."""

    plugin: str  # a registry name or ``module:Class``
    offers: str  # what it offers to the fusion (docs, the options' descriptions)
    default: bool = False  # run when no ``sources`` are given
    # The hybrid option the source needs (a file or a model), with its description: given, it adds the source
    # to the defaults, and the source is built with it under the same name.
    needs: Optional[tuple[str, str]] = None
    fixed: dict[str, Any] = field(default_factory=dict)  # options hybrid gives it unless the user's say otherwise
    # It offers each token with its own learned chance, so the bar cuts its chain token by token: it is never
    # skipped for its average acceptance.
    per_token_chances: bool = False
    # It learns from and drafts for requests without a cache_salt only (docs/security.md): in a step with no
    # such row it is not run, and the target's top-k is not captured for it, so salted traffic pays nothing for it.
    shared_scope_only: bool = False
    available: Optional[Callable[[], tuple[bool, str]]] = None  # whether it can run here, and why not
    # Checks the needed option's value when the config is read (raises ValueError naming the problem); None:
    # the source's options are checked with it instead.
    check_need: Optional[Callable[[str], None]] = None


# ``suffix`` has no short plugin name: vLLM's own method is called that.
SOURCE_TABLE: dict[str, Source] = {
    "suffix": Source("freespec.proposers.suffix_tree:SuffixTreeProposer", default=True, per_token_chances=True,
                     available=suffix_available,
                     offers="SuffixDecoding's suffix trees of the request and of recent outputs, a learned chance "
                            "per token"),
    "copy": Source("copy", offers="the longest earlier match in the request's context and recent outputs"),
    "recycle": Source("recycle", default=True, shared_scope_only=True,
                      offers="the target's own top-k from earlier steps"),
    "retrieval": Source("retrieval", needs=("datastore", "datastore directory: adds the retrieval source to "
                                            "the default sources"),
                        fixed={"fuse_copy": False},  # the context is the copy source's, unless told
                        check_need=lambda path: _check_datastore(path),
                        offers="every sampled continuation of the longest match in a datastore"),
    "draft": Source("pearl", needs=("draft_model", "draft model (as `pearl`'s): adds the draft source to the "
                                    "default sources"),
                    offers="a draft model's chain, cut where its own confidence falls below min_confidence"),
}
SOURCES = tuple(SOURCE_TABLE)
DEFAULT_SOURCES = tuple(name for name, s in SOURCE_TABLE.items() if s.default)
NEEDS = {s.needs[0]: name for name, s in SOURCE_TABLE.items() if s.needs}  # needed option -> its source
_warned_default = False


class _HybridOptions(CopySourceOptions):
    sources: Optional[tuple[str, ...]] = Field(
        None, min_length=1, description=f"any of {list(SOURCES)} (default {list(DEFAULT_SOURCES)})"
    )
    min_support: float = Field(
        0.05, ge=0.0, le=10.0,
        description="stop the draft where support falls below this (the goodput policy cuts where the prefix stops paying)",
    )
    price_sources: bool = Field(True, description="stop running a source whose own tokens do not pay for its time")

    @field_validator("sources")
    @classmethod
    def _known(cls, sources: Optional[tuple[str, ...]]) -> Optional[tuple[str, ...]]:
        if sources is None:
            return None
        unknown = [s for s in sources if s not in SOURCES]
        if unknown or len(set(sources)) != len(sources):
            raise ValueError(f"sources must be distinct names among {list(SOURCES)}, got {list(sources)}")
        for name in sources:
            check = SOURCE_TABLE[name].available
            ok, why = check() if check is not None else (True, "")
            if not ok:
                raise ValueError(f'sources: "{name}" cannot run here: {why}')
        return sources

    @model_validator(mode="after")
    def _needs_given(self) -> "_HybridOptions":
        chosen = self.sources or ()
        for needs, name in NEEDS.items():
            if name in chosen and getattr(self, needs) is None:
                raise ValueError(f'the "{name}" source needs the "{needs}" option')
            if getattr(self, needs) is not None and self.sources is not None and name not in chosen:
                raise ValueError(f'"{needs}" is given but "{name}" is not among the sources')
            if (getattr(self, needs) is not None and getattr(self, name) is None  # else checked with its options
                    and SOURCE_TABLE[name].check_need is None):
                load_options(SOURCE_TABLE[name].plugin, self.source_options(name))
        for name in SOURCES:
            if getattr(self, name) is not None and name not in (self.sources or self._defaults()):
                raise ValueError(f'"{name}" options are given but "{name}" is not among the sources')
        return self

    def source_options(self, name: str) -> dict[str, Any]:
        """What source ``name`` is built with: its own options, and the datastore or draft model it needs."""
        return _built_with(name, getattr(self, name) or {}, {needs: getattr(self, needs) for needs in NEEDS})

    def _defaults(self) -> tuple[str, ...]:
        """The default sources, and each source whose needed option is given."""
        return DEFAULT_SOURCES + tuple(name for needs, name in NEEDS.items() if getattr(self, needs) is not None)

    def chosen_sources(self) -> tuple[str, ...]:
        """The sources to run: the given ones, else the defaults that can run here (with each source whose
        needed option is given)."""
        if self.sources is not None:
            return self.sources
        runnable = []
        for name in self._defaults():
            check = SOURCE_TABLE[name].available
            ok, why = check() if check is not None else (True, "")
            if ok:
                runnable.append(name)
                continue
            global _warned_default
            if not _warned_default:
                _warned_default = True
                logger.warning("freespec: hybrid runs without its %s source: %s", name, why)
        return tuple(runnable) or ("copy",)


def _built_with(name: str, raw: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Source ``name``'s options: the hybrid option it needs, what hybrid fixes for it, then its own."""
    source = SOURCE_TABLE[name]
    needed = {source.needs[0]: given.get(source.needs[0])} if source.needs else {}
    return {**needed, **source.fixed, **raw}


def _needed_option(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
    """A needed option (a datastore, a draft model), checked by its source's ``check_need`` where it has one."""
    name = NEEDS[info.field_name]
    check = SOURCE_TABLE[name].check_need
    chosen = info.data.get("sources")
    if value is not None and check is not None and (chosen is None or name in chosen):  # else refused for that
        check(value)
    return value


def _source_options(cls, raw: Optional[dict[str, Any]], info: ValidationInfo) -> Optional[dict[str, Any]]:
    """A source's options, checked by its plugin's Options (a bad field fails as ``recycle.candidates``)."""
    name = info.field_name
    if raw is None:
        return None
    source = SOURCE_TABLE[name]
    if source.needs is not None:
        needs = source.needs[0]
        if needs in raw:
            raise ValueError(f'give the {name} source\'s {needs} as hybrid\'s "{needs}" option')
        if info.data.get(needs) is None:
            return raw  # refused by _needs_given, for the missing option
    load_options(source.plugin, _built_with(name, raw, info.data))
    return raw


# Every source but ``copy`` (CopySourceOptions' field, shared with ``retrieval``) gets an options field under its
# name, and every needed option its own field, from the table.
_OWN_OPTIONS = tuple(name for name in SOURCES if name != "copy")
HybridOptions = create_model(
    "HybridOptions",
    __base__=_HybridOptions,
    __module__=__name__,
    __validators__={"_source_options": field_validator(*_OWN_OPTIONS)(classmethod(_source_options)),
                    "_needed_option": field_validator(*NEEDS)(classmethod(_needed_option))},
    **{s.needs[0]: (Optional[str], Field(None, description=s.needs[1])) for s in SOURCE_TABLE.values() if s.needs},
    **{name: (Optional[dict[str, Any]],
              Field(None, description=f"options of the {name} source (plugin `{SOURCE_TABLE[name].plugin}`): "
                                      f"{SOURCE_TABLE[name].offers}"))
       for name in _OWN_OPTIONS},
)


def _check_datastore(path: str) -> None:
    """Refuse a datastore that is not one when the config is read, as ``retrieval`` does (numpy only: the
    search, with numba, is not imported here)."""
    import os

    from freespec.proposers.retrieval.datastore import read_manifest

    if not os.path.isdir(path):
        what = "is a file, not a datastore directory" if os.path.exists(path) else "does not exist"
        raise ValueError(f"datastore directory {path!r} {what}")
    read_manifest(path)


def _own_chain(found: Candidates, k: int) -> list[int]:
    """What the source would draft alone: its one chain, or the majority descent through its chains."""
    if len(found.chains) == 1:
        return [t for t in found.chains[0].tolist() if t >= 0]
    return found.descent[0][:k]


def displaced(draft: Sequence[int], supported: dict[str, int], got: dict[str, int],
              produced: Sequence[int]) -> dict[str, int]:
    """Right tokens the fused draft lost by following a source: {source: tokens}.

    Where the draft's first wrong token was supported by some sources while another source's own chain
    was right there, those sources displaced that chain: they are charged the tokens the other chain had
    right beyond the draft's right prefix (within the draft's length, which the goodput bar set).
    """
    right, _ = matched_prefix(draft, produced)
    if right >= len(draft) or right >= len(produced):
        return {}
    wrong = [name for name, n in supported.items() if n > right]
    best_other = max((got.get(name, 0) for name in got if name not in wrong), default=0)
    lost = min(best_other, len(draft)) - right
    return {name: lost for name in wrong} if lost > 0 else {}


class HybridProposer(Proposer):
    Options = HybridOptions
    target_topk = 8  # when a source learns from the target's top-k (set per instance)

    def __init__(self, options: HybridOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        names = options.chosen_sources()
        self.sources: dict[str, Proposer] = {
            name: build_proposer(SOURCE_TABLE[name].plugin, options.source_options(name), num_speculative_tokens)
            for name in names
        }
        self.target_topk = max((s.target_topk for s in self.sources.values()), default=0)
        self.weights = SourceWeights()
        self.pricing = SourcePricing(tuple(self.sources)) if options.price_sources and len(self.sources) > 1 else None
        self.prices_own_time = self.pricing is not None  # the policy's step-time fit leaves the sources' time out
        # key -> (sequence length when drafted, each source's own chain then, the fused draft, tokens each
        # source supported)
        self._offered: dict[int, tuple[int, dict[str, list[int]], list[int], dict[str, int]]] = {}
        self._last_call: Optional[float] = None
        self._paused: list[str] = []
        self._steps = 0
        self._shared_rows = True  # whether the last step had a row without a cache_salt (``_serves``)
        self._bar: Optional[float] = None  # the last step's price of a draft token (whether a source is worth running)

    def bind(self, info: EngineInfo) -> None:
        copy, suffix = self.sources.get("copy"), self.sources.get("suffix")
        if copy is not None and suffix is not None:  # one store of outputs: suffix's files fill copy's pool too
            suffix.share_outputs(copy)
            copy.persisted_by = "suffix"
        for source in self.sources.values():
            source.bind(info)

    def observe(self, scored: ScoredPositions) -> None:
        for source in self.sources.values():
            if source.target_topk:
                source.observe(scored)

    def fixed_bar(self) -> Optional[float]:
        return None  # without a price the draft is ``min_support``'s alone

    def _runs(self, name: str, bar: Optional[float]) -> bool:
        """Whether ``name`` drafts this step: it pays for its time, and its tokens can clear the bar.

        A source with per-token chances (``suffix``) is cut token by token; the others are skipped while
        their average acceptance is below the bar, except one step in ``PROBE_EVERY``, so an estimate that
        fell there can recover.
        """
        if self.pricing is not None and not self.pricing.runs(name):
            return False
        return (SOURCE_TABLE[name].per_token_chances or self.weights.can_pay(name, bar)
                or self._steps % PROBE_EVERY == 0)

    def wants_target_topk(self) -> bool:
        # Only the sources that learn from the target's top-k need it, and only while they run.
        return any(source.target_topk and self._runs(name, self._bar) and self._serves(name)
                   for name, source in self.sources.items())

    def _serves(self, name: str) -> bool:
        """Whether ``name`` has a row of its scope in the last step (a shared-scope-only source needs one)."""
        return self._shared_rows or not SOURCE_TABLE[name].shared_scope_only

    def _learn(self, rows: Sequence[Row]) -> None:
        """Score each source's last chain against what the target produced since (counterfactually)."""
        right: dict[str, int] = {}
        produced_total = 0
        for row in rows:
            offered = self._offered.pop(row.key, None)
            if offered is None or row.num_new == 0:
                continue
            start, chains, draft, supported = offered
            produced_total += len(row.tokens) - start
            # a chain is at most k tokens: only that much of the output is compared (as a list: a few
            # tokens, where numpy's per-call cost would dominate)
            produced = row.tokens[start : start + self.k + 1].tolist()
            got = {}
            for name, chain in chains.items():
                matched, compared = matched_prefix(chain, produced)
                if compared:
                    self.weights.observe_outcome(name, matched, compared)
                got[name] = matched
            if len(got) == 1:  # one source ran: all it got right is its own, and it displaced nothing
                for name, matched in got.items():
                    right[name] = right.get(name, 0) + matched
                continue
            for name, matched in got.items():
                others = max((m for other, m in got.items() if other != name), default=0)
                right[name] = right.get(name, 0) + max(0, matched - others)
            for name, lost in displaced(draft, supported, got, produced).items():
                right[name] = right.get(name, 0) - lost
        if self.pricing is not None:
            self.pricing.observe_tokens(right, produced_total)

    def draft(self, rows: Sequence[Row], step: StepContext) -> Drafts:
        now = time.perf_counter()
        if self.pricing is not None and self._last_call is not None:
            self.pricing.observe_step(now - self._last_call)
        self._last_call = now
        self._steps += 1
        self._bar = step.token_cost
        self._shared_rows = any(row.scope == SHARED_SCOPE for row in rows)
        self._learn(rows)
        offered, seconds_by = {}, {}
        for name, source in self.sources.items():
            if not self._serves(name) or not self._runs(name, step.token_cost):
                continue
            t0 = time.perf_counter()
            offered[name] = source.candidates(rows, step)
            seconds = seconds_by[name] = time.perf_counter() - t0
            if self.pricing is not None:  # a source's price includes the top-k captured for it
                self.pricing.observe_cost(name, seconds + (step.capture_seconds if source.target_topk else 0.0))
        if self.pricing is not None:
            self.pricing.step_done(tuple(offered))
            paused = self.pricing.paused()
            if paused != self._paused:
                self._paused = paused
                logger.info("freespec: hybrid sources paused %s (%s)", paused, self.pricing.describe())
        drafts = Drafts(source_seconds=seconds_by)
        for i, row in enumerate(rows):
            fused = fuse_sources({name: found[i] for name, found in offered.items()}, self.weights, self.k,
                                 self.options.min_support, step.token_cost)
            # metrics: the source that supported most of the draft (the first named, on a tie)
            source = (max(fused.supported, key=fused.supported.get)
                      if fused.paying and fused.supported else None)
            if row.num_new > 0:
                own = {c.name: _own_chain(c, self.k) for c in fused.sources}
                # judged on the draft as the policy will keep it
                self._offered[row.key] = (len(row.tokens), own, fused.tokens[: fused.paying], dict(fused.supported))
            drafts.append(Draft(fused.tokens, fused.chances, source))
        return drafts

    def file_events(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for source in self.sources.values():
            for event, n in source.file_events().items():
                total[event] = total.get(event, 0) + n
        return total

    def idle(self) -> bool:
        return any([source.idle() for source in self.sources.values()])  # every source's, not the first's

    def release(self, key: int) -> None:
        self._offered.pop(key, None)
        for source in self.sources.values():
            source.release(key)

    def state_bytes(self) -> int:
        return sum(source.state_bytes() for source in self.sources.values())

    def step_time_needed(self) -> Optional[tuple[float, str]]:
        """The longest any source claims (the sources run one after another, but only ``draft`` claims)."""
        claims = [claim for claim in (s.step_time_needed() for s in self.sources.values()) if claim]
        return max(claims, default=None)
