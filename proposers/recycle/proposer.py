"""The ``recycle`` proposer: token recycling (Luo et al., 2024, "Turning Trash into Treasure").

One adjacency matrix per worker, ``[vocab_size, candidates]``: for every token,
the target model's top candidates for the next token the last time the target
scored a position holding that token. Every position the target scores updates
it, rejected draft positions included (their candidates are the recycled
"trash"), so it learns from every request the server sees; it needs no draft
model, no datastore and no training.

Drafting expands a static tree from the request's last token through the matrix
(``freespec.kernels.tree``: depth d takes the top ``tree_widths[d]`` candidates
of each node). vLLM verifies one linear chain, so ``freespec.scorers.chain``
picks the path with the best expected accepted tokens minus verification cost,
using online estimates of how often candidates of each rank and recorded
probability are accepted. ``adaptive: false`` drafts the plain top-1 chain of
length k instead (the baseline the scorer is measured against).

Scopes (``Row.scope``, docs/security.md): the matrix can reveal one request's text to another (after a token,
it holds what the target predicted there in the last request that had it), and one matrix per scope would
cost its full size per tenant; so it learns from, and drafts for, the shared scope's requests only (those
without a ``cache_salt``; every request with ``"scope": "global"``). A request with a salt neither teaches nor
uses it.

Memory (fixed, shared by all requests): ``vocab_size * candidates`` int32 ids
plus float16 probabilities (6 bytes per entry) and a uint32 stamp per token:
2.6 MB for SmolLM2's 49,152 tokens and 7.9 MB for Qwen2.5's 151,936 at the
default 8 candidates; per live request only the last chain's edges (at most k).

Through Redis (``state_dir: redis://...``, ``shared_rows``): every ``SHARE_EVERY_S`` the engine's thread hands
the rows it changed (copies) to a thread that appends them; what other replicas appended is merged here by the
same rule, newest row wins.

Persistence and fleets (``matrix``): ``matrix_path`` is this server's
own file, loaded at start and saved atomically every ``save_every_s``, at exit
and on SIGTERM; ``merge_from`` files (other replicas' files, or one merged by
``freespec recycle merge``) are merged in at start and again whenever one changes
(checked every ``save_every_s``), newest row winning. A file of another tokenizer
or vocabulary, or a corrupt one, is refused at start naming the field; later, a
bad or unreachable ``merge_from`` file is logged (once per distinct error) and
retried (the server keeps what it has).

File work never runs inside ``propose`` after start: saving (write and fsync,
possibly to a network filesystem) and reading peers' files happen in one
background thread (``proposers/learned/file_worker.py``). ``propose`` only hands it a copy of the matrix
(one slot: a newer copy replaces one not yet written, only the latest matters)
and merges a peer matrix the thread has read and checked (one slot: the thread
waits until it is taken). Memory: at most two extra matrices (one copy being
written, one peer waiting), plus the one being read.

Bounds: the draft tree has at most ``MAX_TREE_NODES`` nodes (the sum over depths of
the product of the widths so far, with depths up to k), refused at start naming
``tree_widths`` with the computed count.
"""
from __future__ import annotations


import atexit
import logging
import os
import time
from collections.abc import Iterator, Sequence

import numpy as np
from freespec import confined
from freespec.kernels.tree import expand_tree, tree_template
from freespec.proposers.api import SHARED_SCOPE, Draft, EngineInfo, Row, ScoredPositions, StepContext
from freespec.proposers.base import Proposer, ProposerOptions
from freespec.proposers.learned.exit_save import save_at_exit
from freespec.proposers.learned.file_worker import FileWorker, error_kind
from freespec.option_checks import check_path_options
from freespec.proposers.learned import is_url
from freespec.proposers.recycle.matrix import (
    STAMP_MAX,
    Matrix,
    MatrixFileError,
    clear_rows_up_to,
    load_matrix,
    merge_into,
    merge_rows,
    rows_of,
    write_matrix,
)
from freespec.scorers.chain import EdgeAcceptance, best_chains
from freespec.scorers.tuning import RECYCLE_PROBE_EVERY as PROBE_EVERY
from pydantic import Field, field_validator, model_validator

logger = logging.getLogger("freespec")

# The most nodes the draft tree may have: every step expands it for every drafting row (expand_tree), and
# the template is built in Python at start. The default widths give 108 nodes at k = 8 and 492 at k = 32.
MAX_TREE_NODES = 4096


def tree_nodes(widths: Sequence[int], depth: int | None = None) -> int:
    """Nodes of the draft tree with ``widths`` (cut or padded with 1 to ``depth`` levels when given)."""
    widths = list(widths)
    if depth is not None:
        widths = widths[:depth] + [1] * max(0, depth - len(widths))
    nodes, level = 0, 1
    for w in widths:
        level *= w
        nodes += level
    return nodes


class RecycleOptions(ProposerOptions):
    candidates: int = Field(8, ge=1, le=32, description="top-k candidates kept per vocabulary token")
    tree_widths: tuple[int, ...] = Field(
        (4, 2, 2, 1, 1, 1, 1, 1),
        min_length=1,
        max_length=32,
        description="children per node at each depth of the draft tree (depths beyond it take 1); the tree "
        f"may have at most {MAX_TREE_NODES} nodes (sum over depths of the product of the widths so far)",
    )
    adaptive: bool = Field(True, description="choose chain and length by expected gain (False: top-1 chain of k)")
    min_token_gain: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description='draft one more token while its expected acceptance is at least this (with "policy": "fixed")',
    )
    matrix_path: str | None = Field(None, description="warm-start file: loaded at start, saved periodically and at exit")
    merge_from: tuple[str, ...] = Field(
        (),
        max_length=256,
        description="matrix files of other replicas (or a merged one) to merge in at start and whenever they change",
    )
    save_every_s: float = Field(
        30.0, ge=0.0, le=86_400.0,
        description="seconds between saves to matrix_path (of a matrix that changed since) and checks of merge_from "
        "(0: only at start/exit; each save first copies the matrix on the engine's thread: docs/recycle.md)",
    )

    @field_validator("matrix_path", "merge_from")
    @classmethod
    def _paths(cls, value, info):
        return check_path_options(value, info.field_name)

    @field_validator("tree_widths")
    @classmethod
    def _positive(cls, widths: tuple[int, ...]) -> tuple[int, ...]:
        if any(w < 1 for w in widths):
            raise ValueError(f"every tree width must be >= 1, got {list(widths)}")
        return widths

    @model_validator(mode="after")
    def _widths_fit(self) -> RecycleOptions:
        if max(self.tree_widths) > self.candidates:
            raise ValueError(f"tree_widths {list(self.tree_widths)} exceed candidates ({self.candidates})")
        nodes = tree_nodes(self.tree_widths)
        if nodes > MAX_TREE_NODES:
            raise ValueError(f"tree_widths {list(self.tree_widths)} make a draft tree of {nodes} nodes; "
                             f"the limit is {MAX_TREE_NODES}")
        # A file may not exist yet (first start, a peer that has not saved yet); its directory must.
        for name, path in [("matrix_path", self.matrix_path)] + [("merge_from", p) for p in self.merge_from]:
            if path is None:
                continue
            directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(directory):
                raise ValueError(f"{name} {path!r}: directory {directory!r} does not exist")
        return self


class RecycleProposer(Proposer):
    Options = RecycleOptions
    target_topk = 8  # learns from the target's top-k (the instance uses its `candidates` option)

    def __init__(self, options: RecycleOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        self.target_topk = options.candidates
        self._events = {"save": 0, "save_error": 0, "merge": 0}  # file_events()
        self._save_error: str | None = None  # the last save failure logged
        nodes = tree_nodes(options.tree_widths, num_speculative_tokens)
        if nodes > MAX_TREE_NODES:
            raise ValueError(
                f"recycle: option 'tree_widths' {list(options.tree_widths)} with num_speculative_tokens "
                f"{num_speculative_tokens} makes a draft tree of {nodes} nodes; the limit is {MAX_TREE_NODES}"
            )
        widths = tuple(options.tree_widths[:num_speculative_tokens])
        widths += (1,) * (num_speculative_tokens - len(widths))
        self.parents, self.ranks, self.depths = tree_template(widths)  # vLLM's k is at least 1
        # The template is static, so the plain top-1 chain (adaptive: false) is too: rank 0 under
        # rank 0 at every depth. Found once here instead of per request and step.
        top1, node = [], -1
        for _ in range(num_speculative_tokens):
            node = int(np.flatnonzero((self.parents == node) & (self.ranks == 0))[0])
            top1.append(node)
        self._top1_nodes = np.asarray(top1, dtype=np.int64)
        self.acceptance = EdgeAcceptance(options.candidates)
        self.matrix: Matrix | None = None
        self.updates = 0
        self._chains: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # key -> (ranks, buckets) drafted
        self._empty_steps: dict[int, int] = {}
        self._info: EngineInfo | None = None
        self._fingerprint = ""
        self._last_save = time.monotonic()
        self._merged_stat: dict[str, tuple[int, int]] = {}  # merge_from path -> (mtime_ns, size) last read
        self._stat_errors: dict[str, str] = {}  # merge_from path -> the last error logged for it
        # this server's file and its peers': matrix_path and merge_from, or the state directory's (bind)
        self._path: str | None = options.matrix_path
        self._peers = lambda: self.options.merge_from
        self._purges = None  # PurgeLog, with a state directory (bind)
        self._recycle_cut = 0  # the purged row stamp the matrix was last cleared to
        self._perms: int | None = None
        self._files: FileWorker | None = None
        self._shared = None  # SharedRows, with a Redis state_dir (bind)
        self._dirty: np.ndarray | None = None
        self._closed = False
        # (updates, rows merged) when the last save was asked for: a matrix that did not change is neither copied
        # nor written again (peers re-read a file whose mtime moved, so idle replicas would otherwise rewrite
        # their files for each other every save_every_s); None after a failed save: ask again.
        self._rows_merged = 0
        self._save_asked: tuple[int, int] | None = None

    # The matrix's arrays, by their old names (the tree expansion and tests read them).
    @property
    def ids(self) -> np.ndarray | None:
        return None if self.matrix is None else self.matrix.ids

    @property
    def probs(self) -> np.ndarray | None:
        return None if self.matrix is None else self.matrix.probs

    # ---------------------------------------------------------------- set-up and persistence
    def bind(self, info: EngineInfo) -> None:
        self._info = info
        self.matrix = Matrix.empty(info.vocab_size, self.options.candidates, "", info.model)
        if is_url(info.state_dir):
            self._bind_redis(info)
            return
        if info.state_dir is not None:
            from freespec.proposers.learned import state_dir

            if self.options.matrix_path is not None or self.options.merge_from:
                logger.warning("freespec: recycle matrix_path/merge_from are ignored: state_dir %s is given",
                               info.state_dir)
            try:
                self._path = state_dir.own_file(info.state_dir, "recycle", "npz")
            except OSError as e:  # a link planted at recycle/, or a folder that cannot be made
                raise ValueError(f"state_dir {info.state_dir!r}: {e}") from e
            self._perms = state_dir.FILE_MODE
            state_dir.sweep_old(os.path.dirname(self._path), info.state_max_age_s)
            from freespec.proposers.learned.purges import PurgeLog

            self._purges = PurgeLog(info.state_dir)  # rows a purge removed are cleared and never merged back
            # the newest peers only: a start's and a merge's work follow the bounds, not the folder's size
            self._peers = lambda: tuple(state_dir.peer_files(self._path, info.state_max_age_s)[-state_dir.START_FILES:])
        elif self.options.matrix_path is not None or self.options.merge_from:
            from freespec.proposers.learned.state_dir import legacy_warning

            legacy_warning("recycle matrix_path/merge_from")
        path = self._path
        if path is None and not self._peers():
            return
        if info.tokenizer_fingerprint is None:
            raise ValueError("recycle matrix_path/merge_from need the tokenizer's identity, which this engine does not give")
        self._fingerprint = self.matrix.tokenizer = info.tokenizer_fingerprint()
        own = None
        if path is not None and confined.exists(path):
            try:
                own = self._load(path, "recycle matrix_path")
            except MatrixFileError as e:
                if self._perms is None:
                    raise
                # its own file in a shared folder (a link planted at its name): the next save replaces it
                logger.warning("freespec: recycle state_dir: this writer's earlier file is skipped (%s)", e)
        if own is not None:
            self.matrix.ids, self.matrix.probs, self.matrix.stamps = own.ids, own.probs, own.stamps
            self.updates = own.updates
            logger.info("freespec: recycle matrix loaded from %s (%d updates)", path, self.updates)
        elif path is not None and not confined.exists(path):
            logger.info("freespec: recycle matrix %s does not exist yet; starting cold, will save there", path)
        self._clear_purged(self.matrix, fresh=True)
        for peer_path, peer in self._changed_peers(at_start=True):
            self._merge(peer_path, peer)
        if self.options.save_every_s:
            self._files = FileWorker(self._write, lambda peers: self._changed_peers(at_start=False), "recycle-files")
        # A strong reference: vLLM may drop its drafter before the interpreter exits, and the last
        # save must still happen (a weak one let the engine exit without saving).
        if path is not None:
            save_at_exit(self.close, "recycle")  # at exit and on SIGTERM
        elif self._files is not None:
            atexit.register(self.close)  # stops the background merges

    def _bind_redis(self, info: EngineInfo) -> None:
        """``state_dir`` is a Redis URL (``shared_rows``): the rows this replica changes are shared through it and
        the fleet's merged in, on its own thread; nothing here waits on Redis."""
        from freespec.proposers.learned.redis_stream import redacted, usable_url
        from freespec.proposers.recycle.shared_rows import SharedRows

        if self.options.matrix_path is not None or self.options.merge_from:
            logger.warning("freespec: recycle matrix_path/merge_from are ignored: state_dir %s is given",
                           redacted(info.state_dir))
        if info.tokenizer_fingerprint is None:
            raise ValueError("recycle state_dir needs the tokenizer's identity, which this engine does not give")
        usable_url(info.state_dir)
        self._fingerprint = self.matrix.tokenizer = info.tokenizer_fingerprint()
        self._shared = SharedRows(info.state_dir, fingerprint=self._fingerprint, vocab_size=info.vocab_size,
                                  candidates=self.options.candidates)
        self._dirty = np.zeros(info.vocab_size, dtype=bool)  # rows changed since they were last handed over
        logger.info("freespec: recycle matrix shared through Redis %s", redacted(info.state_dir))
        save_at_exit(self.close, "recycle")  # the last rows handed over at exit and on SIGTERM

    def _share_tick(self, force: bool = False) -> None:
        """Merge what the Redis thread read (and clear what a purge removed); every ``SHARE_EVERY_S`` hand it
        copies of the rows changed since (a vectorised gather of at most the vocabulary: no I/O here)."""
        from freespec.proposers.recycle.shared_rows import SHARE_EVERY_S

        got = self._shared.take()
        if got.cut > self._recycle_cut:
            self._recycle_cut = got.cut
            clear_rows_up_to(self.matrix, got.cut)
        for part in got.parts:
            self._rows_merged += merge_rows(self.matrix, part)
        if got.reshare:  # Redis lost its rows: every row held is shared again
            self._dirty[:] = True
        # while earlier rows still wait (Redis slow or down) the changed rows stay marked: bounded by the vocabulary
        if force or (time.monotonic() - self._last_save >= SHARE_EVERY_S and self._shared.ready()):
            self._last_save = time.monotonic()
            changed = np.flatnonzero(self._dirty)
            if len(changed):
                self._dirty[changed] = False
                self._shared.put(rows_of(self.matrix, changed))

    def _load(self, path: str, what: str) -> Matrix:
        return load_matrix(
            path, vocab_size=self.matrix.vocab_size, candidates=self.options.candidates,
            tokenizer=self._fingerprint, what=what,
        )

    def _changed_peers(self, at_start: bool) -> Iterator[tuple[str, Matrix]]:
        """Read every ``merge_from`` file that changed since it was last read (in the background after start).

        At start a bad file stops the engine (like ``matrix_path``); later it is logged and skipped until it
        changes again, so a peer writing garbage cannot take the server down. A file that cannot be looked at
        (``os.stat`` failing: permissions, a network filesystem gone) is logged once per distinct error and
        tried again at the next check.
        """
        own = os.path.abspath(self._path) if self._path else None
        for path in self._peers():
            if os.path.abspath(path) == own:  # a peer list that names this server's own file: it is here already
                continue
            try:
                st = confined.lstat(path)  # a link is then refused by the read (``freespec.confined``)
            except FileNotFoundError:
                if at_start:
                    logger.info("freespec: recycle merge_from %s does not exist yet; will merge it when it does", path)
                self._stat_errors.pop(path, None)
                continue
            except OSError as e:
                why, kind = f"{type(e).__name__}: {e}", error_kind(e)
                if self._stat_errors.get(path) != kind:
                    self._stat_errors[path] = kind
                    logger.warning("freespec: recycle merge_from %s cannot be read now (%s); trying again every "
                                   "save_every_s (logged once per distinct error)", path, why)
                continue
            self._stat_errors.pop(path, None)
            stat = (st.st_mtime_ns, st.st_size)
            if self._merged_stat.get(path) == stat:
                continue
            self._merged_stat[path] = stat
            try:
                peer = self._load(path, "recycle merge_from")
                self._clear_purged(peer, fresh=True)  # in the background: never merged back
            except MatrixFileError:
                if at_start and self._perms is None:  # a state directory's peer never stops the start
                    raise
                logger.warning("freespec: recycle merge_from %s skipped", path, exc_info=True)
                continue
            yield path, peer

    def _merge(self, path: str, peer: Matrix) -> None:
        taken = merge_into(self.matrix, peer)
        self._events["merge"] += 1
        self._rows_merged += taken
        logger.info("freespec: recycle matrix merged %d rows from %s", taken, path)

    def _apply_merges(self) -> None:
        """Merge the peer matrix the background thread has read, if any (a vectorised row copy: no I/O)."""
        if self._files is not None:
            ready = self._files.take()
            if ready is not None:
                self._merge(*ready)

    def snapshot(self) -> Matrix:
        """A copy of the matrix as it is now, for the background writer."""
        m = self.matrix
        return Matrix(m.ids.copy(), m.probs.copy(), m.stamps.copy(), m.tokenizer, m.model, self.updates)

    def wait_files(self, timeout: float = 30.0) -> bool:
        """Wait until the background file work requested so far is done and its merges applied (tests, exit)."""
        if self._files is None:
            return True
        deadline = time.monotonic() + timeout
        while True:
            idle = self._files.wait(max(0.0, deadline - time.monotonic()))
            had = self._files.has_ready()
            self._apply_merges()
            if idle and not had:
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        """Stop the background thread and save a last time (at exit; idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._shared is not None:
            self._share_tick(force=True)
            self._shared.close()
            return
        if self._files is not None:
            self._files.stop()
        self._final = True
        self.save()

    def save(self) -> None:
        """Write the matrix to ``matrix_path`` now, in this thread (atomically); a no-op without one.

        For exit, SIGTERM and tests; while serving, ``propose`` hands copies to the background thread.
        """
        if self._path is None or self.matrix is None:
            return
        self.matrix.updates = self.updates
        self._write(self.matrix)

    def _clear_purged(self, m: Matrix, fresh: bool) -> int:
        """Clear ``m``'s rows a purge removed (``proposers.learned.purges``); ``fresh``: read the records now (file I/O:
        the background thread or start), else the last read (the engine's thread)."""
        if self._purges is None:
            return 0
        cut = (self._purges.current() if fresh else self._purges.latest).recycle_cut
        return clear_rows_up_to(m, cut)

    def _write(self, m: Matrix) -> None:
        if self._path is None:
            return
        self._clear_purged(m, fresh=True)  # right before writing: a purge recorded since is never written back
        try:
            if self._perms is None:
                write_matrix(self._path, m)
            else:  # a state directory's file: readable by the serving user only
                write_matrix(self._path, m, self._perms)
            self._events["save"] += 1
        except OSError as e:
            self._events["save_error"] += 1
            self._save_asked = None
            why, kind = f"{type(e).__name__}: {e}", error_kind(e)
            if getattr(self, "_final", False):
                logger.error("freespec: the final save of the recycle matrix to %s failed (%s); what it learned "
                             "since its last successful save is lost", self._path, why)
            elif self._save_error != kind:  # once per distinct error, not every save_every_s
                self._save_error = kind
                logger.error("freespec: could not save the recycle matrix to %s (%s); trying again every "
                             "save_every_s (logged once per distinct error)", self._path, why)
            return
        self._save_error = None

    # ---------------------------------------------------------------- learning
    def observe(self, scored: ScoredPositions) -> None:
        if self.ids is None or len(scored.tokens) == 0:
            return
        if scored.scopes is not None and any(s != SHARED_SCOPE for s in scored.scopes):
            # Only the shared scope's positions: the matrix is one for all, and a row of it is a request's text
            # (the target's next tokens after a token, in that request's context), so learning from a request
            # with a cache_salt would let others draft its text (module docstring).
            keep = np.fromiter((s == SHARED_SCOPE for s in scored.scopes), dtype=bool, count=len(scored.scopes))
            scored = ScoredPositions(scored.tokens[keep], scored.topk_ids[keep], scored.topk_probs[keep])
            if len(scored.tokens) == 0:
                return
        c = min(self.options.candidates, scored.topk_ids.shape[1])
        # Fancy assignment: when a token was scored twice in one step, the later row wins.
        self.ids[scored.tokens, :c] = scored.topk_ids[:, :c]
        self.probs[scored.tokens, :c] = scored.topk_probs[:, :c]
        # When the row was written, for merging with other replicas (newest wins).
        self.matrix.stamps[scored.tokens] = min(int(time.time()), STAMP_MAX)
        self.updates += len(scored.tokens)
        if self._dirty is not None:
            self._dirty[scored.tokens] = True

    # ---------------------------------------------------------------- drafting
    def draft(self, rows: Sequence[Row], step: StepContext) -> list[Draft]:
        """The best chain of each row's candidate tree. The bar (``step.bar``) chooses the chain among the
        tree's paths, so it is drafted whole: no chances are returned and the policy does not cut it again,
        which keeps what is learned next step (``num_new - 1`` of this chain accepted) exact."""
        if self.ids is None:
            raise RuntimeError("recycle proposer used before bind()")
        for row in rows:
            self._learn(row)
        drafts: list[list[int]] = [[] for _ in rows]
        live = [i for i, row in enumerate(rows) if row.num_new > 0 and len(row.tokens) and row.scope == SHARED_SCOPE]
        if live and self.k > 0:
            roots = np.asarray([rows[i].tokens[-1] for i in live], dtype=np.int64)
            tokens, edge_probs = expand_tree(self.ids, self.probs, roots, self.parents, self.ranks)
            if self.options.adaptive:
                p = self.acceptance.estimate(np.broadcast_to(self.ranks, tokens.shape), edge_probs)
                chains = best_chains(
                    tokens, p, self.parents, self.depths, step.bar(self.options.min_token_gain), self.k
                )
            else:
                chains = [self._top1_path(tokens[j]) for j in range(len(live))]
            for j, i in enumerate(live):
                nodes = chains[j]
                key = rows[i].key
                if len(nodes) == 0 and self.options.adaptive and tokens[j, 0] >= 0:
                    # Nothing pays by the current estimates: now and then draft one token anyway,
                    # so estimates that are too pessimistic can recover.
                    n = self._empty_steps.get(key, 0) + 1
                    self._empty_steps[key] = n
                    if n % PROBE_EVERY == 0:
                        nodes = np.zeros(1, dtype=np.int64)
                drafts[i] = [int(t) for t in tokens[j, nodes]]
                _, buckets = EdgeAcceptance.cells(self.ranks[nodes], edge_probs[j, nodes])
                self._chains[key] = (self.ranks[nodes].astype(np.int64), buckets)
        self._files_tick()
        return [Draft(d) for d in drafts]

    def idle(self) -> bool:
        """The engine is idle (``Proposer.idle``): what the last steps learned is saved when its save is due
        (a peer's matrix is merged whole, in one vectorised copy)."""
        self._files_tick()
        return False

    def _files_tick(self) -> None:
        """Apply what the background thread merged; every ``save_every_s`` hand it a copy of the matrix when
        it changed (milliseconds here; the write, its fsync and the peers' reads are the thread's) and ask
        for the peers' changed files (listed in the background, never here: a state directory's folder may
        be on a network filesystem)."""
        if self._shared is not None:
            self._share_tick()
            return
        if self._files is None:
            return
        self._apply_merges()
        if self._purges is not None and self._purges.latest.recycle_cut > self._recycle_cut:
            self._recycle_cut = self._purges.latest.recycle_cut
            if self._clear_purged(self.matrix, fresh=False):
                self.updates += 1  # saved again without them
        if time.monotonic() - self._last_save >= self.options.save_every_s:
            peers = ("state_dir",) if self._perms is not None else self.options.merge_from
            changed = (self.updates, self._rows_merged)
            save = self._path is not None and changed != self._save_asked
            if save:
                self._save_asked = changed
            self._files.request(self.snapshot() if save else None, peers)
            self._last_save = time.monotonic()

    def _top1_path(self, tokens: np.ndarray) -> np.ndarray:
        """The rank-0 chain's nodes, cut before the first node whose token is unknown."""
        known = tokens[self._top1_nodes] >= 0
        return self._top1_nodes[: len(known) if known.all() else int(np.argmin(known))]

    def _learn(self, row: Row) -> None:
        """The chain drafted for this request last step has been verified: num_new - 1 were accepted."""
        chain = self._chains.pop(row.key, None)
        if chain is not None and row.num_new > 0 and self.options.adaptive:
            ranks, buckets = chain
            self.acceptance.observe(ranks, buckets, row.num_new - 1)

    def release(self, key: int) -> None:
        self._chains.pop(key, None)
        self._empty_steps.pop(key, None)

    def file_events(self) -> dict[str, int]:
        return dict(self._events)

    def state_bytes(self) -> int:
        matrix = 0 if self.matrix is None else self.matrix.nbytes()
        return matrix + sum(r.nbytes + b.nbytes for r, b in self._chains.values())


