"""The ``hybrid`` proposer: every source proposes, one fused chain per request is drafted.

Sources: ``suffix`` (SuffixDecoding's frequency-scored suffix trees of the request and of recent
outputs, through arctic-inference, with each token's acceptance learned; ``proposers/suffix_tree.py``),
``copy`` (the request's own context and recent outputs, longest match), ``recycle`` (the target's own
top-k from earlier steps), ``retrieval`` (a datastore; needs the ``datastore`` option) and ``draft`` (a
draft model run as ``pearl`` runs it, drafting while the target verifies; needs the ``draft_model``
option). Default:
``DEFAULT_SOURCES`` (no options needed); without a supported arctic-inference the default runs without
``suffix`` and says so once, while naming ``suffix`` explicitly without it is refused at start. Each source
is built through the registry (``SOURCE_PLUGINS``) with its own options under its name, e.g.
``{"plugin": "hybrid", "copy": {"min_match": 3}}``, checked by that plugin's Options (errors name
``copy.min_match``); the retrieval source's datastore is hybrid's ``datastore``, the draft source's model
hybrid's ``draft_model``; either, given, adds its source to the default ones.

Each source offers its candidates (``Proposer.candidates``): ``suffix`` one chain with a learned
chance per token, ``copy`` and ``recycle`` their one chain, ``retrieval`` every sampled continuation of
its longest match, ``draft`` the draft model's chain, already cut where the draft's own confidence
falls below its ``min_confidence`` (RASD's pruning of the draft by its confidence). They are fused by
common prefix (``scorers.fusion``): a token's support is the sum
over sources of the source's chance for that token (``suffix``) or its learned per-token acceptance
rate (the others) times the share of its candidates that agree up to it; the draft follows the
best-supported token while that support is at least ``min_support`` and, with the goodput policy, while
the chance that the whole prefix is accepted pays for verifying it.

Learning is counterfactual: a step's new tokens are the target's own continuation, so every source's
chain is scored against them (``acceptance.matched_prefix``), whichever chain was verified.

Pricing (``scorers.fusion.SourcePricing``): each source's own seconds per step are weighed against the
tokens only it got right (beyond the best other source), less the right tokens the fused draft lost by
following it where another source's chain was right (``displaced``), valued at the measured seconds per
output token. A source that cannot pay stops being run and is probed every ``PROBE_EVERY`` steps; when a
probe shows it paying again it is resumed.

Memory: the sum of the sources' (see their docs) plus one short chain per live request and source.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Optional, Sequence

from freespec.proposers.base import EngineInfo, Proposer, Row, ScoredPositions
from freespec.proposers.registry import CopySourceOptions, build_proposer, load_options
from freespec.proposers.suffix_tree import available as suffix_available
from freespec.scorers.acceptance import matched_prefix
from freespec.scorers.fusion import PROBE_EVERY, Candidates, SourcePricing, SourceWeights, fuse_sources
from pydantic import Field, ValidationInfo, field_validator, model_validator

logger = logging.getLogger("freespec")

# Source -> the plugin that drafts it (``suffix`` has no short name: vLLM's own method is called that).
SOURCE_PLUGINS = {"suffix": "freespec.proposers.suffix_tree:SuffixTreeProposer", "copy": "copy",
                  "recycle": "recycle", "retrieval": "retrieval", "draft": "pearl"}
# Sources that need a hybrid option (a file or a model), and which: given, it adds the source to the defaults.
SOURCE_NEEDS = {"retrieval": "datastore", "draft": "draft_model"}
SOURCES = tuple(SOURCE_PLUGINS)
DEFAULT_SOURCES = ("suffix", "recycle")
_warned_default = False


class HybridOptions(CopySourceOptions):
    sources: Optional[tuple[str, ...]] = Field(
        None, min_length=1, description=f"any of {list(SOURCES)} (default {list(DEFAULT_SOURCES)})"
    )
    datastore: Optional[str] = Field(
        None, description="datastore directory: adds the retrieval source to the default sources"
    )
    draft_model: Optional[str] = Field(
        None, description="draft model (as `pearl`'s): adds the draft source to the default sources"
    )
    min_support: float = Field(
        0.05, ge=0.0, le=10.0,
        description="stop the draft where support falls below this (the goodput policy cuts where the prefix stops paying)",
    )
    price_sources: bool = Field(True, description="stop running a source whose own tokens do not pay for its time")
    # Each source's own options, checked by its plugin's Options (`copy` is CopySourceOptions' field).
    suffix: Optional[dict[str, Any]] = Field(None, description="options of the suffix source (SuffixOptions)")
    recycle: Optional[dict[str, Any]] = Field(None, description="options of the recycle source (`recycle`)")
    retrieval: Optional[dict[str, Any]] = Field(
        None, description="options of the retrieval source (`retrieval`; its datastore: `datastore` above)"
    )
    draft: Optional[dict[str, Any]] = Field(
        None, description="options of the draft source (`pearl`; its model: `draft_model` above)"
    )

    @field_validator("sources")
    @classmethod
    def _known(cls, sources: Optional[tuple[str, ...]]) -> Optional[tuple[str, ...]]:
        if sources is None:
            return None
        unknown = [s for s in sources if s not in SOURCES]
        if unknown or len(set(sources)) != len(sources):
            raise ValueError(f"sources must be distinct names among {list(SOURCES)}, got {list(sources)}")
        if "suffix" in sources:
            ok, why = suffix_available()
            if not ok:
                raise ValueError(f'sources: "suffix" needs arctic-inference: {why}')
        return sources

    @field_validator("suffix", "recycle", "retrieval", "draft")
    @classmethod
    def _source_options(cls, raw: Optional[dict[str, Any]], info: ValidationInfo) -> Optional[dict[str, Any]]:
        """A source's options, checked by its plugin's Options (a bad field fails as ``copy.min_match``)."""
        name = info.field_name
        if raw is None:
            return None
        needs = SOURCE_NEEDS.get(name)
        if needs is not None:
            if needs in raw:
                raise ValueError(f'give the {name} source\'s {needs} as hybrid\'s "{needs}" option')
            if info.data.get(needs) is None:
                return raw  # refused below, for the missing option
        load_options(SOURCE_PLUGINS[name], _with_fixed(name, raw, info.data))
        return raw

    @model_validator(mode="after")
    def _needs_given(self) -> "HybridOptions":
        chosen = self.sources or ()
        for name, needs in SOURCE_NEEDS.items():
            if name in chosen and getattr(self, needs) is None:
                raise ValueError(f'the "{name}" source needs the "{needs}" option')
            if getattr(self, needs) is not None and self.sources is not None and name not in chosen:
                raise ValueError(f'"{needs}" is given but "{name}" is not among the sources')
        if self.datastore is not None:
            _check_datastore(self.datastore)
        if self.draft_model is not None and self.draft is None:  # else checked with the draft's options
            load_options(SOURCE_PLUGINS["draft"], self.source_options("draft"))
        for name in SOURCES:
            if getattr(self, name) is not None and name not in (self.sources or self._defaults()):
                raise ValueError(f'"{name}" options are given but "{name}" is not among the sources')
        return self

    def source_options(self, name: str) -> dict[str, Any]:
        """What source ``name`` is built with: its own options, and the datastore or draft model it needs."""
        return _with_fixed(name, getattr(self, name) or {}, {needs: getattr(self, needs) for needs in SOURCE_NEEDS.values()})

    def _defaults(self) -> tuple[str, ...]:
        """The default sources, and each source whose datastore or draft model is given."""
        return DEFAULT_SOURCES + tuple(name for name, needs in SOURCE_NEEDS.items() if getattr(self, needs) is not None)

    def chosen_sources(self) -> tuple[str, ...]:
        """The sources to run: the given ones, else the defaults that can run here (with ``retrieval`` when a
        datastore is given, ``draft`` when a draft model is)."""
        if self.sources is not None:
            return self.sources
        defaults = self._defaults()
        ok, why = suffix_available()
        if ok:
            return defaults
        global _warned_default
        if not _warned_default:
            _warned_default = True
            logger.warning("freespec: hybrid runs without its suffix source: %s", why)
        return tuple(s for s in defaults if s != "suffix") or ("copy",)


def _with_fixed(name: str, raw: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The retrieval source reads hybrid's datastore and, unless told, leaves the context to ``copy``; the
    draft source runs hybrid's draft model."""
    if name == "retrieval":
        return {"datastore": given.get("datastore"), "fuse_copy": False, **raw}
    if name == "draft":
        return {"draft_model": given.get("draft_model"), **raw}
    return raw


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
    target_topk = 8  # when recycle is a source (set per instance)

    def __init__(self, options: HybridOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        names = options.chosen_sources()
        self.sources: dict[str, Proposer] = {
            name: build_proposer(SOURCE_PLUGINS[name], options.source_options(name), num_speculative_tokens)
            for name in names
        }
        self.target_topk = max((s.target_topk for s in self.sources.values()), default=0)
        self.weights = SourceWeights()
        self.pricing = SourcePricing(tuple(self.sources)) if options.price_sources and len(self.sources) > 1 else None
        self.prices_own_time = self.pricing is not None  # the policy's step-time fit leaves the sources' time out
        # key -> (sequence length when drafted, each source's own chain then, the fused draft, tokens each
        # source supported)
        self._offered: dict[int, tuple[int, dict[str, list[int]], list[int], dict[str, int]]] = {}
        self._capture_seconds = 0.0  # the adapter's capture of the target's top-k in the last step (for recycle)
        self._last_call: Optional[float] = None
        self._paused: list[str] = []
        self._steps = 0
        self._sources: Optional[list[Optional[str]]] = None
        self._chances: Optional[list[list[float]]] = None
        self._seconds: Optional[dict[str, float]] = None

    def bind(self, info: EngineInfo) -> None:
        for source in self.sources.values():
            source.bind(info)

    def observe(self, scored: ScoredPositions) -> None:
        for source in self.sources.values():
            if source.target_topk:
                source.observe(scored)

    def _runs(self, name: str) -> bool:
        """Whether ``name`` drafts this step: it pays for its time, and its tokens can clear the bar.

        ``suffix`` offers each token with its own learned chance, so the bar cuts its chain token by
        token; the others are skipped while their average acceptance is below the bar, except one step
        in ``PROBE_EVERY``, so an estimate that fell there can recover.
        """
        if self.pricing is not None and not self.pricing.runs(name):
            return False
        return (name == "suffix" or self.weights.can_pay(name, self.token_cost)
                or self._steps % PROBE_EVERY == 0)

    def observe_capture_seconds(self, seconds: float) -> None:
        self._capture_seconds = seconds

    def wants_target_topk(self) -> bool:
        # Only recycle learns from the target's top-k; while it is not run it needs none.
        return "recycle" in self.sources and self._runs("recycle")

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

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        now = time.perf_counter()
        if self.pricing is not None and self._last_call is not None:
            self.pricing.observe_step(now - self._last_call)
        self._last_call = now
        self._steps += 1
        self._learn(rows)
        offered, seconds = {}, {}
        for name, source in self.sources.items():
            if not self._runs(name):
                continue
            source.token_cost = self.token_cost
            t0 = time.perf_counter()
            offered[name] = source.candidates(rows)
            seconds[name] = time.perf_counter() - t0
            if self.pricing is not None:  # recycle's price includes the top-k captured for it
                self.pricing.observe_cost(name, seconds[name] + (self._capture_seconds if name == "recycle" else 0.0))
        self._seconds = seconds
        if self.pricing is not None:
            self.pricing.step_done(tuple(offered))
            paused = self.pricing.paused()
            if paused != self._paused:
                self._paused = paused
                logger.info("freespec: hybrid sources paused %s (%s)", paused, self.pricing.describe())
        drafts, sources, chances = [], [], []
        for i, row in enumerate(rows):
            fused = fuse_sources({name: found[i] for name, found in offered.items()}, self.weights, self.k,
                                 self.options.min_support, self.token_cost)
            # metrics: the source that supported most of the draft (the first named, on a tie)
            sources.append(max(fused.supported, key=fused.supported.get) if fused.tokens and fused.supported
                           else None)
            if row.num_new > 0:
                own = {c.name: _own_chain(c, self.k) for c in fused.sources}
                self._offered[row.key] = (len(row.tokens), own, list(fused.tokens), dict(fused.supported))
            drafts.append(fused.tokens)
            chances.append(fused.chances)
        self._sources, self._chances = sources, chances
        return drafts

    def draft_sources(self) -> Optional[list[Optional[str]]]:
        return self._sources

    def draft_chances(self) -> Optional[list[list[float]]]:
        return self._chances

    def source_seconds(self) -> Optional[dict[str, float]]:
        return self._seconds

    def file_events(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for source in self.sources.values():
            for event, n in source.file_events().items():
                total[event] = total.get(event, 0) + n
        return total

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
