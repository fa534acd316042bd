"""The ``suffix`` source: SuffixDecoding's frequency-scored suffix trees, with acceptance learned per token.

Drafting is arctic-inference's ``SuffixDecodingCache`` (the library behind vLLM's ``suffix`` method,
Oliaro et al., 2024): one suffix tree per live request over its prompt and output, and one global tree
over the outputs of recent requests (``max_cached_requests``, evicted oldest first), each led by its
prompt's last ``prompt_tail`` tokens (vLLM's: outputs only). Those sequences are also kept whole
(``KnownAnswers``): a request that begins as one of them did (the same prompt tail and first token) is
drafted that answer, token for token, while it repeats it; elsewhere the trees draft. One cache per scope
(``Row.scope``, docs/security.md): a request's output, live or departed, enters only its scope's global
tree, and it drafts only from that one; a row without a scope (None) drafts from its own tree alone. Each step the
last ``max_tree_depth`` tokens are matched in both trees and the more frequent continuation is
drafted, each token with the tree's estimate of its probability (how often that continuation followed
the match).

What this adapter adds: those frequencies are counts, not acceptance rates. It learns, online, how
often a drafted token is accepted given its tree probability and the length of the match that found it
(``TokenCalibration``), and offers every token with that learned chance; ``hybrid`` (or the policy, when
the source is used alone) then keeps the prefix whose chance of being accepted pays for verifying it at
the current load (``token_cost``, scorers/policy.py). Learning uses what the target actually produced: a step's new
tokens are the target's own continuation, so each drafted token is scored against it even when the
fused draft that was verified was another source's.

arctic-inference is optional (``bench``/``cpu``/``cuda`` extras); ``available()`` says whether a
supported version (``SUPPORTED``) is importable.

Learning across restarts and replicas: with a ``state_dir`` (a folder, ``proposers/learned/folder_log.py``, or a
Redis URL, ``redis_stream.py``) every finished response of every scope is handed to the backend, which appends it
once to the fleet's log and brings back what other replicas appended (``proposers.learned``: add, take, close);
the source seeds those into the scope's global tree, a bounded share per step. The legacy ``responses_path`` /
``merge_from`` keep the shared scope's responses in a bounded ``ResponseStore`` (``learned/response_store.py``),
saved atomically in a background thread every ``save_every_s`` and at exit or SIGTERM, loaded into the global
tree at the next start, replicas merging each other's files; a bad file is refused at start, naming it.

Memory: per live request a tree over its sequence (O(tokens), path-compressed, depth at most
``max_tree_depth``); the global tree holds at most ``max_cached_requests`` outputs and at most
``max_cached_tokens`` of their tokens, all scopes together (the least recently used scope's oldest output is
evicted first; a scope with no live request and no output held is dropped; arctic bounds only the count; a response's length is bounded by the
model's context, so the count alone allows 10,000 x max_model_len tokens); docs/hybrid.md gives the bytes a
held token takes. With ``prompt_tail``: the same sequences whole in ``KnownAnswers`` (4 bytes a token, the same
bounds: 8 MB at the defaults); ``state_bytes`` asks the trees (arctic's own estimate) and adds those. With
``prompt_tail`` or ``responses_path``: each live request's sequence once more (4 bytes a token); with
``responses_path`` the store (``ResponseStore.max_bytes``: 15 MB at the defaults, twice that while saving).
"""
from __future__ import annotations

import itertools
import logging
import math
import operator
import time
from collections import OrderedDict, deque
from importlib import metadata
from typing import Optional, Sequence

import numpy as np
from freespec.proposers.api import SHARED_SCOPE, Draft, EngineInfo, Row, StepContext
from freespec.proposers.base import Proposer, ProposerOptions
from freespec.proposers.learned.known_answers import Follow, KnownAnswers
from freespec.option_checks import check_path_options
from freespec.scorers.acceptance import matched_prefix
from freespec.scorers.calibration import TokenCalibration
from freespec.scorers.tuning import PAST_MATCH_ACCEPTANCE
from freespec.proposers.api import Candidates
from pydantic import Field, field_validator, model_validator

logger = logging.getLogger("freespec")

SUPPORTED = ((0, 1, 1), (0, 4, 0))  # arctic-inference >=0.1.1,<0.4: the same suffix-decoding code throughout
ONE_CHAIN = np.ones(1)  # the weight of the one chain offered (shared, read-only)
ONE_CHAIN.flags.writeable = False
# Responses merged from replicas go into the global tree on the engine's thread, a few a step: whole responses
# while the step's tokens stay within this (at least one response a step). About 1.6 us a token on a Zen 3
# core, so under 2 ms a step; 32 responses of 200 tokens a step took 10 ms (state-dir-qwen-replica-k24-zen3).
SEED_TOKENS_PER_STEP = 1024
NO_SCOPE = ("freespec-no-scope",)  # the cache of rows without a scope: it keeps no outputs


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def available() -> tuple[bool, str]:
    """(whether a supported arctic-inference is importable, why not)."""
    try:
        version = metadata.version("arctic-inference")
    except metadata.PackageNotFoundError:
        try:
            version = metadata.version("arctic_inference")
        except metadata.PackageNotFoundError:
            return False, "arctic-inference is not installed (pip install 'arctic-inference>=0.1.1,<0.2', or 0.3.x)"
    low, high = SUPPORTED
    if not low <= _version_tuple(version) < high:
        return False, f"arctic-inference {version} is installed; the suffix source supports >=0.1.1,<0.4"
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError as e:
        return False, f"arctic-inference {version} cannot be imported: {e}"
    return True, ""


def with_prompt_tail(prompt: Sequence[int], output: Sequence[int], tail: int) -> list[int]:
    """A response as the source learns and stores it: its prompt's last ``tail`` tokens, then the output (what a
    warm-start file, ``freespec responses build``, must hold to match what a server saves)."""
    return [int(t) for t in prompt[max(0, len(prompt) - tail):]] + [int(t) for t in output]


class SuffixOptions(ProposerOptions):
    max_tree_depth: int = Field(24, ge=1, le=256, description="longest context matched, and depth of the trees")
    max_cached_requests: int = Field(
        10_000, ge=0, le=1_000_000, description="outputs of departed requests kept in the global tree (0: none)"
    )
    prompt_tail: int = Field(
        16, ge=0, le=256,
        description="the last prompt tokens learned with each output: a prompt answered before is drafted that "
        "answer, from its first token and whole while the new one repeats it (0: outputs only, as vLLM's suffix)",
    )
    max_cached_tokens: int = Field(
        2_000_000, ge=1, le=268_435_456,
        description="tokens of departed requests (outputs, prompt tails) kept in the global tree, oldest evicted "
        "first, and as many again kept whole (about 264 bytes a token in memory at max_tree_depth 24: 0.5 GiB at "
        "the default)",
    )
    # Longer than vLLM's `suffix` defaults (1 and 0.1): the goodput bar cuts each chain by its tokens' learned
    # chances, so the tree may offer more (docs/hybrid.md).
    max_spec_factor: float = Field(
        4.0, ge=0.0, le=64.0, description="a match of m tokens drafts at most max_spec_factor * m + 1 tokens"
    )
    min_token_prob: float = Field(
        0.02, ge=0.0, le=1.0, description="stop where the tree's path probability falls below"
    )
    min_token_gain: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description='used alone: draft while the chance the prefix is accepted is at least this (with "policy": "fixed")',
    )
    responses_path: Optional[str] = Field(
        None,
        description="file of past responses: loaded into the global tree at start, saved every save_every_s "
        "and at exit (learning across restarts); its folder must exist",
    )
    merge_from: tuple[str, ...] = Field(
        (), max_length=256, description="other replicas' responses files, merged in at start and every save_every_s"
    )
    save_every_s: float = Field(
        30.0, ge=0.0, le=86_400.0,
        description="seconds between saves to responses_path (of responses that changed since) and checks of "
        "merge_from (0: only at start and exit)",
    )
    max_saved_responses: int = Field(
        10_000, ge=1, le=1_048_576,
        description="responses kept in responses_path (newest; 12 bytes each on disk); in a state_dir, as many "
                    "again for all cache_salt scopes together"
    )
    max_saved_tokens: int = Field(
        2_000_000, ge=1, le=268_435_456, description="tokens kept in responses_path (newest; 4 bytes each)"
    )


    @field_validator("responses_path", "merge_from")
    @classmethod
    def _paths(cls, value, info):
        return check_path_options(value, info.field_name)

    @model_validator(mode="after")
    def _merge_needs_own_file(self) -> "SuffixOptions":
        if self.merge_from and self.responses_path is None:
            raise ValueError("merge_from needs responses_path (this replica's own file)")
        return self


class _Live:
    __slots__ = ("by_known", "cells", "chain", "fed", "follow", "kept", "looked", "pieces", "scope", "start")

    def __init__(self, fed: int, keep: bool, scope) -> None:
        self.scope = scope  # the cache it lives in (NO_SCOPE: one that holds no outputs)
        self.start = fed  # prompt tokens less its tail (the rest goes to the global tree as the output)
        self.fed = fed  # tokens of the request given to the cache so far
        self.chain: Optional[list[int]] = None  # last offered chain, scored against what the target produced
        self.cells: Optional[list[int]] = None
        # the learned sequence so far (prompt tail, output), in pieces, when responses are persisted or kept
        # whole (4 bytes a token, freed at release); ``kept``: the pieces already given to the store
        self.pieces: Optional[list[np.ndarray]] = [] if keep else None
        self.kept = 0
        self.follow: Optional[Follow] = None  # earlier answers it still repeats
        self.looked = False  # whether they were looked up (once, when the key's tokens are in)
        self.by_known = False  # whether ``chain`` came from an earlier answer (its own calibration)


class SuffixTreeProposer(Proposer):
    """Drafts from SuffixDecoding's trees; usable alone (``module:Class``) or as ``hybrid``'s ``suffix`` source."""

    Options = SuffixOptions

    def __init__(self, options: SuffixOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        ok, why = available()
        if not ok:
            raise RuntimeError(f"the suffix source needs arctic-inference: {why}")
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self._new_cache = lambda held: SuffixDecodingCache(
            max_tree_depth=options.max_tree_depth, max_cached_requests=options.max_cached_requests if held else 0)
        # scope -> its cache (live requests' trees, and its global tree), least recently used first;
        # NO_SCOPE: the rows of no scope, whose cache keeps no outputs
        self._caches: OrderedDict = OrderedDict()
        self.calibration = TokenCalibration()
        # Prompts answered before (``prompt_tail`` > 0): their answers whole, and how often following one pays.
        self.known = (KnownAnswers(options.prompt_tail + 1, options.max_cached_requests, options.max_cached_tokens)
                      if options.prompt_tail > 0 else None)
        self.known_calibration = TokenCalibration()
        self._live: dict[int, _Live] = {}
        self.store = None  # ResponseStore, with the legacy responses_path (bind)
        self.learned = None  # LearnedResponses, with a state_dir, folder or Redis (bind; ``proposers.learned``)
        # responses merged from replicas, put into the tree a few per step; at most what the store holds (the
        # oldest go first: many merges between steps cannot pile up more than the bounds)
        self._to_seed: deque = deque(maxlen=options.max_saved_responses)
        self._last_save = 0.0
        self._seeded = 0
        self._merges = 0
        self._cached: dict = {}  # scope -> {departed request's key in its global tree: output tokens}, oldest first
        self._cached_tokens = 0
        self._cached_count = 0
        self._peers = lambda: self.options.merge_from  # the legacy responses_path's replicas' files
        # Another source that learns from the same outputs (hybrid's ``copy``): told of every response loaded or
        # merged from the files, and of every purged scope, so the one store persists both (``share_outputs``).
        self._output_sharers: list = []

    def share_outputs(self, other) -> None:
        """``other`` (with ``keep_output(scope, tokens)`` and ``forget_scope(scope)``) gets every response this
        source loads or merges from its files, and forgets a purged scope with it. Call before ``bind``."""
        self._output_sharers.append(other)

    # -- lifecycle -------------------------------------------------------
    def bind(self, info: EngineInfo) -> None:
        """Load the persisted responses (and the replicas') into the global tree; a bad file stops the start.

        With a state directory (``info.state_dir``, ``proposers.learned.state_dir``) this process's file is
        ``<state_dir>/suffix/<writer>.bin`` and its peers every other file there, read again every save."""
        o = self.options
        if info.state_dir is not None:
            self._bind_learned(info)
            return
        path = o.responses_path
        if path is None:
            return
        from freespec.proposers.learned.state_dir import legacy_warning

        legacy_warning("suffix responses_path/merge_from")
        if info.tokenizer_fingerprint is None:
            raise ValueError("suffix responses_path/merge_from need the tokenizer's identity, which this engine "
                             "does not give")
        from freespec.proposers.learned.exit_save import save_at_exit
        from freespec.proposers.learned.response_store import ResponseStore, ResponseStoreError

        try:
            self.store = ResponseStore(path, fingerprint=info.tokenizer_fingerprint(), vocab_size=info.vocab_size,
                                       max_responses=o.max_saved_responses, max_tokens=o.max_saved_tokens)
            self.store.load()
            for peer in self._peers():
                self.store.merge_from(peer)
                self._merges += 1
        except ResponseStoreError as e:
            raise ValueError(f"suffix responses_path/merge_from: {e}") from e
        except ValueError as e:
            raise ValueError(f"suffix responses_path: {e}") from e
        self._seed(self.store.responses())  # what the bounds kept of every file read
        self._last_save = time.monotonic()
        save_at_exit(self.close, "suffix responses")

    def _bind_learned(self, info: EngineInfo) -> None:
        """A state directory: a folder (``proposers.learned.folder_log``, its newest segments read here, at start)
        or a Redis URL (``proposers.learned.redis_stream``); either shares every scope's responses as an
        append-only log. Nothing waits on a file or on Redis later: the backend's thread catches up with the fleet,
        and ``_files_tick`` seeds what it read, a bounded share per step."""
        from freespec.proposers.learned import is_url
        from freespec.proposers.learned.exit_save import save_at_exit

        o = self.options
        if is_url(info.state_dir):
            from freespec.proposers.learned.redis_stream import redacted, usable_url

            where = redacted(info.state_dir)
        else:
            where = info.state_dir
        if o.responses_path is not None or o.merge_from:
            logger.warning("freespec: suffix responses_path/merge_from are ignored: state_dir %s is given", where)
        if info.tokenizer_fingerprint is None:
            raise ValueError("suffix state_dir needs the tokenizer's identity, which this engine does not give")
        if not is_url(info.state_dir):
            from freespec.proposers.learned.folder_log import FolderLog

            try:
                self.learned = FolderLog(info.state_dir, fingerprint=info.tokenizer_fingerprint(),
                                         vocab_size=info.vocab_size, max_responses=o.max_saved_responses,
                                         max_tokens=o.max_saved_tokens, max_age_s=info.state_max_age_s,
                                         max_bytes=info.state_max_bytes, interval_s=o.save_every_s)
            except OSError as e:  # a link planted at suffix/, or a folder that cannot be made
                raise ValueError(f"state_dir {info.state_dir!r}: {e}") from e
            for scope, tokens in self.learned.loaded:
                self._seed([tokens], scope)
            self.learned.loaded = []
            save_at_exit(self.close, "suffix responses")
            return
        usable_url(info.state_dir)
        from freespec.proposers.learned.redis_stream import RedisResponses

        self.learned = RedisResponses(info.state_dir, fingerprint=info.tokenizer_fingerprint(),
                                      vocab_size=info.vocab_size, max_responses=o.max_saved_responses,
                                      max_tokens=o.max_saved_tokens)
        logger.info("freespec: suffix responses shared through Redis %s", where)
        save_at_exit(self.close, "suffix responses")

    def _persists(self) -> bool:
        """Whether finished responses are kept beyond the trees (a file, a state directory or Redis)."""
        return self.store is not None or self.learned is not None

    @property
    def cache(self):
        """The shared scope's cache (requests without a cache_salt), made when first asked for."""
        return self._cache_of(SHARED_SCOPE)

    def _cache_of(self, scope):
        cache = self._caches.get(scope)
        if cache is None:
            cache = self._caches[scope] = self._new_cache(scope is not NO_SCOPE)
        self._caches.move_to_end(scope)
        return cache

    def _seed(self, responses: Sequence[np.ndarray], scope: str = SHARED_SCOPE) -> None:
        """Put responses into the scope's global tree as if requests had just produced them (oldest first)."""
        for tokens in responses:
            self._seeded += 1
            key = ("freespec-seed", self._seeded)
            cache = self._cache_of(scope)
            cache.start_request(key, np.zeros(0, dtype=np.int32))
            cache.add_active_response(key, np.array(tokens, dtype=np.int32))  # a writable copy
            cache.stop_request(key)
            self._account(scope, key, len(tokens))
            if self.known is not None:
                self.known.add(scope, tokens)
            for other in self._output_sharers:
                other.keep_output(scope, tokens)

    def _forget(self, scope: str, quiet: bool = False) -> None:
        """A purged scope: every departed output of it leaves its global tree (live requests go on)."""
        cache = self._caches.get(scope)
        for key, tokens in list(self._cached.pop(scope, {}).items()):
            self._cached_tokens -= tokens
            self._cached_count -= 1
            if cache is not None and key in cache.cached_requests and key not in cache.active_requests:
                cache.evict_cached_response(key)
        self._drop_if_empty(scope)
        if self.known is not None:
            self.known.forget(scope)
        for other in self._output_sharers:
            other.forget_scope(scope)
        if not quiet:
            logger.info("freespec: suffix forgot a purged scope's responses")

    def _account(self, scope, key, tokens: int) -> None:
        """A departed request's ``tokens`` output tokens stay in its scope's global tree: while more than
        ``max_cached_requests`` outputs or ``max_cached_tokens`` tokens are held in all scopes together, evict
        the least recently used scope's oldest (never the one just added); drop scopes left empty."""
        if self.options.max_cached_requests == 0 or scope is NO_SCOPE:
            self._drop_if_empty(scope)
            return
        held = self._cached.setdefault(scope, {})
        before = held.pop(key, None)  # a key that serves a new request replaces its old output
        self._cached_tokens += tokens - (before or 0)
        self._cached_count += before is None
        held[key] = tokens
        o = self.options
        if self._cached_tokens <= o.max_cached_tokens and self._cached_count <= o.max_cached_requests:
            return
        for victim in list(self._caches):
            entries = self._cached.get(victim, {})
            cache = self._caches[victim]
            while entries and (self._cached_tokens > o.max_cached_tokens or self._cached_count > o.max_cached_requests):
                oldest = next(iter(entries))
                if victim == scope and oldest == key:
                    break  # never the newest
                self._cached_tokens -= entries.pop(oldest)
                self._cached_count -= 1
                # arctic evicted it itself (its own count bound), or its key serves a new request
                if oldest in cache.cached_requests and oldest not in cache.active_requests:
                    cache.evict_cached_response(oldest)
            self._drop_if_empty(victim)
            if self._cached_tokens <= o.max_cached_tokens and self._cached_count <= o.max_cached_requests:
                break

    def _drop_if_empty(self, scope) -> None:
        """Forget a scope whose cache holds no live request and no output."""
        cache = self._caches.get(scope)
        if cache is not None and not cache.active_requests and not self._cached.get(scope):
            del self._caches[scope]
            self._cached.pop(scope, None)

    def _files_tick(self, keep_live: bool = False) -> None:
        """Take what the backend brought (a state directory's, memory only) and seed a bounded share of it; every
        ``save_every_s`` keep the live requests' outputs too when ``keep_live`` (an idle engine), and with the
        legacy ``responses_path`` ask for a save and for the replicas' changed files (no file I/O in this thread)."""
        o = self.options
        n = 0
        if self.learned is not None:
            self._take_learned()
        merged = self.store.take_merged() if self.store is not None else ()
        if merged:
            self._merges += 1
            self._to_seed.extend((SHARED_SCOPE, r) for r in merged)
        budget = SEED_TOKENS_PER_STEP  # a replica's file may bring thousands: a bounded share per step
        while self._to_seed and (n == 0 or len(self._to_seed[0][1]) <= budget):
            scope, tokens = self._to_seed.popleft()
            self._seed([tokens], scope)
            budget -= len(tokens)
            n += 1
        if o.save_every_s and time.monotonic() - self._last_save >= o.save_every_s:
            self._last_save = time.monotonic()
            if keep_live:  # an idle engine: what live requests answered so far is kept now (a backend appends it)
                self._keep_live()
            if self.store is not None:
                self.store.save_async()
                peers = self._peers()
                if peers:
                    self.store.merge_async(peers)

    def _take_learned(self) -> None:
        """What the fleet brought (``LearnedResponses.take``, memory only): purged scopes forgotten, the trees
        rebuilt after a purge of responses, others' responses queued to seed."""
        got = self.learned.take()
        for scope in got.forget:
            self._forget(scope)
        if got.forget:
            gone = set(got.forget)
            self._to_seed = deque((item for item in self._to_seed if item[0] not in gone), maxlen=self._to_seed.maxlen)
        if got.rebuild is not None:
            for scope in list(self._cached):
                self._forget(scope, quiet=True)
            self._to_seed.clear()
            logger.info("freespec: suffix: a purge was recorded in the state directory; the trees rebuilt from the %d response(s) "
                        "kept", len(got.rebuild))
            self._to_seed.extend(got.rebuild)
        if got.new:
            self._merges += 1
            self._to_seed.extend(got.new)

    def idle(self) -> bool:
        """The engine is idle (``Proposer.idle``): when a save is due, the outputs of requests not yet released
        go to the store first, then the save tick runs (merging the replicas' files in too, whole responses of
        ``SEED_TOKENS_PER_STEP`` tokens at most a call, or one: True while more wait). A request that goes on
        after all (a step longer than the idle time) has the rest of its output stored apart at release."""
        if not self._persists():
            return False
        self._files_tick(keep_live=True)
        return bool(self._to_seed)

    def file_events(self) -> dict[str, int]:
        if self.learned is not None:
            return {"save": self.learned.appended, "merge": self._merges}
        return {} if self.store is None else {"save": self.store.saves, "merge": self._merges}

    def close(self) -> None:
        """The final save (at exit and on SIGTERM; idempotent, never raises). Requests still live are kept
        too: the engine tells the adapter a request left only at the next step, which never comes for the
        last ones before a shutdown."""
        if not self._persists():
            return
        self._keep_live()
        if self.learned is not None:
            self.learned.close()
            return
        self.store.close()

    def _keep_live(self) -> None:
        """Requests not yet released keep what they answered so far (the engine tells the adapter a request
        left only at its next step)."""
        for st in list(self._live.values()):
            self._keep(st)

    def _keep(self, st: _Live) -> None:
        # A state directory keeps every scope's (each apart); the legacy file only the shared scope's.
        new, st.kept = st.pieces[st.kept :], len(st.pieces)
        if new and self.learned is not None and st.scope is not NO_SCOPE:
            self.learned.add(st.scope, np.concatenate(new))
            return
        if new and st.scope == SHARED_SCOPE:
            try:
                self.store.add(np.concatenate(new))
            except ValueError as e:  # ids outside the vocabulary: not kept
                logger.debug("freespec: suffix response not stored: %s", e)

    def release(self, key: int) -> None:
        """The request left: its prompt tree goes; its output stays in the global tree (evicted FIFO), and in
        the persisted store when there is one."""
        st = self._live.pop(key, None)
        if st is not None:
            self._caches[st.scope].stop_request(key)
            self._account(st.scope, key, st.fed - st.start)
            if self.known is not None and st.scope is not NO_SCOPE and st.pieces:
                self.known.add(st.scope, np.concatenate(st.pieces))
            if self._persists():
                self._keep(st)

    def state_bytes(self) -> int:
        trees = [t for cache in self._caches.values()
                 for t in (getattr(cache, "_global_tree", None), *getattr(cache, "_local_trees", {}).values())]
        held = 0 if self.known is None else 4 * self.known.tokens
        return held + sum(int(t.estimate_memory()) for t in trees if t is not None and hasattr(t, "estimate_memory"))

    # -- drafting --------------------------------------------------------
    def _update(self, row: Row) -> Optional[_Live]:
        """Give the cache the row's new tokens and learn from them; None for a partial prefill."""
        n = len(row.tokens)
        st = self._live.get(row.key)
        if row.num_new == 0 or n == 0:
            return st
        tokens = np.ascontiguousarray(row.tokens, dtype=np.int32)
        if st is None:
            # The prompt's last ``prompt_tail`` tokens are fed as if they began the output, so they enter the
            # global tree (and the stored response) ahead of it: the first tokens of an answer to a prompt
            # seen before are then matched by the prompt's end, not guessed from the answers' most frequent
            # opening (a replay of repeated agent turns: results/prompt-tail-replay).
            start = max(0, n - row.num_new - self.options.prompt_tail)
            scope = NO_SCOPE if row.scope is None else row.scope
            self._cache_of(scope).start_request(row.key, tokens[:start])
            keep = self._persists() or (self.known is not None and scope is not NO_SCOPE)
            st = self._live[row.key] = _Live(start, keep, scope)
        if st.chain is not None:
            produced = tokens[st.fed : min(n, st.fed + len(st.chain))].tolist()
            matched, compared = matched_prefix(st.chain, produced)
            (self.known_calibration if st.by_known else self.calibration).observe(st.cells, matched, compared)
            st.chain = st.cells = None
        if n > st.fed:
            self._caches[st.scope].add_active_response(row.key, tokens[st.fed : n])
            if st.pieces is not None:
                st.pieces.append(tokens[st.fed : n].copy())
            if self.known is not None and st.scope is not NO_SCOPE:
                self._follow(st, tokens[st.start : n])
            st.fed = n
        return st

    def _follow(self, st: _Live, sequence: np.ndarray) -> None:
        """Look up the earlier answers the request began like (once its key's tokens are in), then keep those it
        still repeats."""
        if st.follow is None and not st.looked and len(sequence) >= self.known.key_tokens:
            st.looked = True
            found = self.known.find(st.scope, sequence)
            st.follow = Follow(found) if found else None
        if st.follow is not None:
            st.follow.advance(sequence)
            if not st.follow.candidates:
                st.follow = None

    def chain(self, row: Row, bar: Optional[float] = None) -> tuple[list[int], list[float]]:
        """The tree's draft for ``row`` and each token's learned chance of acceptance (given the ones before).

        ``bar``: the price of a draft token. A chain may run past its match (up to ``max_spec_factor`` tokens
        a matched token), but a token past the match is accepted about ``PAST_MATCH_ACCEPTANCE`` of the time,
        while its learned chance over-claims it; where the bar is that high such tokens do not pay, so the
        factor shrinks toward vLLM's 1 as the price rises (issue 69: results/hybrid-vs-suffix-costly-tokens).
        """
        st = self._update(row)
        if st is None or row.num_new == 0:
            return [], []
        ahead = None if st.follow is None else st.follow.ahead(self.k)
        st.by_known = ahead is not None
        if ahead is not None:  # a prompt answered before, and the answer so far the same: that answer goes on
            tokens = ahead.tolist()
            st.chain, st.cells = tokens, TokenCalibration.cells([1.0] * len(tokens), st.follow.seen)
            return tokens, self.known_calibration.estimate(st.cells)
        o = self.options
        factor = o.max_spec_factor
        if bar is not None and bar > 0:
            factor = min(factor, max(1.0, PAST_MATCH_ACCEPTANCE / bar))
        context = np.ascontiguousarray(row.tokens[-o.max_tree_depth :], dtype=np.int32)
        draft = self._cache_of(st.scope).speculate(
            row.key,
            context,
            max_spec_tokens=self.k,
            max_spec_factor=factor,
            min_token_prob=o.min_token_prob,
        )
        tokens = list(draft.token_ids)
        if not tokens:
            return [], []
        path = list(draft.probs)
        cond = [p / prev if prev > 0 else math.inf for p, prev in zip(path, [1.0] + path[:-1])]
        cells = TokenCalibration.cells(cond, int(draft.match_len))
        st.chain, st.cells = tokens, cells
        return tokens, self.calibration.estimate(cells)

    def candidates(self, rows: Sequence[Row], step: Optional[StepContext] = None) -> list[Optional[Candidates]]:
        if self._persists():
            self._files_tick()
        out: list[Optional[Candidates]] = []
        bar = None if step is None else step.bar(self.fixed_bar())
        for row in rows:
            tokens, q = self.chain(row, bar)
            out.append(
                Candidates("suffix", np.asarray([tokens], dtype=np.int64), ONE_CHAIN,
                           token_probs=np.asarray([q], dtype=np.float64))
                if tokens else None
            )
        return out

    def draft(self, rows: Sequence[Row], step: StepContext) -> list[Draft]:
        """Each row's tree chain, with the chance that each token and those before it are accepted (the
        product of the learned per-token chances): the policy cuts it where that falls below the bar."""
        if self._persists():
            self._files_tick()
        drafts = []
        for row in rows:
            tokens, q = self.chain(row, step.bar(self.fixed_bar()))
            drafts.append(Draft(tokens, list(itertools.accumulate(q, operator.mul))))
        return drafts
