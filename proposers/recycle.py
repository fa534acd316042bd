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

Memory (fixed, shared by all requests): ``vocab_size * candidates`` int32 ids
plus float16 probabilities, i.e. 6 bytes per entry: 2.4 MB for SmolLM2's 49,152
tokens and 7.3 MB for Qwen2.5's 151,936 at the default 8 candidates; per live
request only the last chain's edges (at most k). Warm start: ``matrix_path``
is loaded at start (refused if it belongs to another tokenizer or is corrupt,
``recycle_matrix``) and saved atomically every ``save_every_s`` and at exit.
"""
from __future__ import annotations

import atexit
import logging
import os
import time
from typing import Optional, Sequence

import numpy as np
from pydantic import Field, field_validator, model_validator

from freespec.kernels.tree import expand_tree, tree_template
from freespec.proposers.base import EngineInfo, Proposer, ProposerOptions, Row, ScoredPositions
from freespec.proposers.recycle_matrix import load_matrix, save_matrix
from freespec.scorers.chain import EdgeAcceptance, best_chains

logger = logging.getLogger("freespec")

PROBE_EVERY = 16  # a request whose best chain is empty still drafts its top-1 token this often, to keep learning


class RecycleOptions(ProposerOptions):
    candidates: int = Field(8, ge=1, le=32, description="top-k candidates kept per vocabulary token")
    tree_widths: tuple[int, ...] = Field(
        (4, 2, 2, 1, 1, 1, 1, 1),
        min_length=1,
        max_length=32,
        description="children per node at each depth of the draft tree (depths beyond it take 1)",
    )
    adaptive: bool = Field(True, description="choose chain and length by expected gain (False: top-1 chain of k)")
    min_token_gain: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description='draft one more token while its expected acceptance is at least this (with "policy": "fixed")',
    )
    matrix_path: Optional[str] = Field(None, description="warm-start file: loaded at start, saved periodically and at exit")
    save_every_s: float = Field(300.0, ge=0.0, description="seconds between saves to matrix_path (0: only at exit)")

    @field_validator("tree_widths")
    @classmethod
    def _positive(cls, widths: tuple[int, ...]) -> tuple[int, ...]:
        if any(w < 1 for w in widths):
            raise ValueError(f"every tree width must be >= 1, got {list(widths)}")
        return widths

    @model_validator(mode="after")
    def _widths_fit(self) -> "RecycleOptions":
        if max(self.tree_widths) > self.candidates:
            raise ValueError(f"tree_widths {list(self.tree_widths)} exceed candidates ({self.candidates})")
        if self.matrix_path is not None:
            directory = os.path.dirname(os.path.abspath(self.matrix_path))
            if not os.path.isdir(directory):
                raise ValueError(f"matrix_path {self.matrix_path!r}: directory {directory!r} does not exist")
        return self


class RecycleProposer(Proposer):
    Options = RecycleOptions
    target_topk = 8  # learns from the target's top-k (the instance uses its `candidates` option)

    def __init__(self, options: RecycleOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        self.target_topk = options.candidates
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
        self.ids: Optional[np.ndarray] = None
        self.probs: Optional[np.ndarray] = None
        self.updates = 0
        self._chains: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # key -> (ranks, buckets) drafted
        self._empty_steps: dict[int, int] = {}
        self._info: Optional[EngineInfo] = None
        self._fingerprint = ""
        self._last_save = time.monotonic()

    # ---------------------------------------------------------------- set-up and persistence
    def bind(self, info: EngineInfo) -> None:
        self._info = info
        c = self.options.candidates
        self.ids = np.full((info.vocab_size, c), -1, dtype=np.int32)
        self.probs = np.zeros((info.vocab_size, c), dtype=np.float16)
        path = self.options.matrix_path
        if path is None:
            return
        if info.tokenizer_fingerprint is None:
            raise ValueError("recycle matrix_path needs the tokenizer's identity, which this engine does not give")
        self._fingerprint = info.tokenizer_fingerprint()
        if os.path.exists(path):
            self.ids, self.probs, meta = load_matrix(
                path, vocab_size=info.vocab_size, candidates=c, tokenizer=self._fingerprint
            )
            self.updates = int(meta.get("updates", 0))
            logger.info("freespec: recycle matrix loaded from %s (%d updates)", path, self.updates)
        else:
            logger.info("freespec: recycle matrix %s does not exist yet; starting cold, will save there", path)
        atexit.register(self.save)

    def save(self) -> None:
        """Write the matrix to ``matrix_path`` (atomically); a no-op without one."""
        if self.options.matrix_path is None or self.ids is None:
            return
        try:
            save_matrix(
                self.options.matrix_path,
                self.ids,
                self.probs,
                tokenizer=self._fingerprint,
                model=self._info.model if self._info else "",
                updates=self.updates,
            )
        except OSError:
            logger.exception("freespec: could not save the recycle matrix to %s", self.options.matrix_path)
        self._last_save = time.monotonic()

    # ---------------------------------------------------------------- learning
    def observe(self, scored: ScoredPositions) -> None:
        if self.ids is None or len(scored.tokens) == 0:
            return
        c = min(self.options.candidates, scored.topk_ids.shape[1])
        # Fancy assignment: when a token was scored twice in one step, the later row wins.
        self.ids[scored.tokens, :c] = scored.topk_ids[:, :c]
        self.probs[scored.tokens, :c] = scored.topk_probs[:, :c]
        self.updates += len(scored.tokens)

    # ---------------------------------------------------------------- drafting
    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        if self.ids is None:
            raise RuntimeError("recycle proposer used before bind()")
        for row in rows:
            self._learn(row)
        drafts: list[list[int]] = [[] for _ in rows]
        live = [i for i, row in enumerate(rows) if row.num_new > 0 and len(row.tokens)]
        if live and self.k > 0:
            roots = np.asarray([rows[i].tokens[-1] for i in live], dtype=np.int64)
            tokens, edge_probs = expand_tree(self.ids, self.probs, roots, self.parents, self.ranks)
            if self.options.adaptive:
                p = self.acceptance.estimate(np.broadcast_to(self.ranks, tokens.shape), edge_probs)
                chains = best_chains(
                    tokens, p, self.parents, self.depths, self.gain_threshold(self.options.min_token_gain), self.k
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
        if self.options.matrix_path and self.options.save_every_s and (
            time.monotonic() - self._last_save >= self.options.save_every_s
        ):
            self.save()
        return drafts

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

    def state_bytes(self) -> int:
        matrix = 0 if self.ids is None else self.ids.nbytes + self.probs.nbytes
        return matrix + sum(r.nbytes + b.nbytes for r, b in self._chains.values())
