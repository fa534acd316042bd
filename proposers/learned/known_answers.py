"""Answers given before, found by how their prompt ended: a prompt asked again has its earlier answer drafted whole.

The ``suffix`` source learns each output after its prompt's last ``prompt_tail`` tokens. A suffix tree drafts
from that by frequency: where an answer repeats its own structure (tool-call JSON, a list), the context it
matches occurs in several places and the tree takes the more frequent continuation, not the one of the answer
the request has been repeating. ``KnownAnswers`` keeps the learned sequences whole, keyed by their first
``key_tokens`` tokens (the prompt's tail and the answer's first token), so a request that begins as an earlier
one did can follow that answer token for token while it stays on it (``Follow``).

Bounds: at most ``max_answers`` sequences and ``max_tokens`` tokens over all scopes (4 bytes a token), the
oldest evicted first; per key the ``PER_KEY`` newest.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Optional

import numpy as np

PER_KEY = 4  # answers kept for one key (the newest): the same prompt may have been answered differently


class KnownAnswers:
    """Sequences learned per scope, found by their first ``key_tokens`` tokens."""

    def __init__(self, key_tokens: int, max_answers: int, max_tokens: int) -> None:
        self.key_tokens, self.max_answers, self.max_tokens = key_tokens, max_answers, max_tokens
        self._held: OrderedDict = OrderedDict()  # (scope, key, serial) -> tokens, oldest first
        self._by_key: dict[tuple[Hashable, bytes], list[tuple]] = {}  # (scope, key) -> entries, newest last
        self._serial = 0
        self.tokens = 0

    def add(self, scope: Hashable, tokens: np.ndarray) -> None:
        """Keep ``tokens`` (longer than the key) as the newest sequence of ``scope``."""
        if len(tokens) <= self.key_tokens or self.max_answers == 0 or len(tokens) > self.max_tokens:
            return
        tokens = np.array(tokens, dtype=np.int32)  # a private copy
        tokens.flags.writeable = False
        key = tokens[: self.key_tokens].tobytes()
        self._serial += 1
        entry = (scope, key, self._serial)
        self._held[entry] = tokens
        self.tokens += len(tokens)
        same = self._by_key.setdefault((scope, key), [])
        same.append(entry)
        if len(same) > PER_KEY:
            self._drop(same[0])
        while len(self._held) > self.max_answers or self.tokens > self.max_tokens:
            self._drop(next(iter(self._held)))

    def find(self, scope: Hashable, start: np.ndarray) -> list[np.ndarray]:
        """The sequences of ``scope`` that begin with ``start[:key_tokens]``, newest first."""
        if len(start) < self.key_tokens:
            return []
        entries = self._by_key.get((scope, np.asarray(start[: self.key_tokens], dtype=np.int32).tobytes()), ())
        return [self._held[e] for e in reversed(entries)]

    def forget(self, scope: Hashable) -> None:
        """Every sequence of ``scope`` (a purged tenant)."""
        for entry in [e for e in self._held if e[0] == scope]:
            self._drop(entry)

    def _drop(self, entry: tuple) -> None:
        self.tokens -= len(self._held.pop(entry))
        same = self._by_key[entry[:2]]
        same.remove(entry)
        if not same:
            del self._by_key[entry[:2]]


class Follow:
    """One live request's earlier answers that its sequence (from where the source began learning it) still
    repeats token for token; ``ahead`` is the newest one's continuation."""

    __slots__ = ("candidates", "seen")

    def __init__(self, candidates: list[np.ndarray]) -> None:
        self.candidates = candidates
        self.seen = 0  # tokens of the request's sequence checked against them

    def advance(self, sequence: np.ndarray) -> None:
        """Drop the candidates that the request's ``sequence`` (all of it so far) has left."""
        new = sequence[self.seen :]
        at = self.seen
        self.candidates = [c for c in self.candidates
                           if len(c) >= at + len(new) and np.array_equal(c[at : at + len(new)], new)]
        self.seen = len(sequence)

    def ahead(self, k: int) -> Optional[np.ndarray]:
        """The next ``k`` tokens of the newest answer still followed (None: none, or it ended here)."""
        for c in self.candidates:
            if len(c) > self.seen:
                return c[self.seen : self.seen + k]
        return None
