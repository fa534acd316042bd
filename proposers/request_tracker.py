"""Infer which request sits in which batch row, step after step.

vLLM's ``custom_class`` seam passes the batch as token rows with no request
ids, and rows are reordered between steps. A request is recognised by what
cannot change while it runs: its first tokens (the prompt's head) and its
length, which grows by exactly the number of tokens the last step appended.
Two requests that agree on both are indistinguishable here, and also hold the
same tokens, so mapping either to either gives every proposer the same view.

A request that is missing from a step has left the batch (finished, aborted or
preempted: vLLM drops unscheduled requests from its persistent batch); its key
is reported once so proposers can free its state. A preempted request that
comes back is simply seen as new.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Sequence

import numpy as np

HEAD_TOKENS = 64  # tokens of the sequence start used as the fingerprint


@dataclass
class _Tracked:
    key: int
    head_len: int
    head_hash: int
    length: int  # sequence length when last seen
    last_token: int


def _head_hash(tokens: np.ndarray, head_len: int) -> int:
    return hash(tokens[:head_len].astype(np.int32, copy=False).tobytes())


class RequestTracker:
    """Map this step's rows to stable request keys; report requests that left."""

    def __init__(self) -> None:
        self._live: dict[int, _Tracked] = {}
        self._keys = count()

    def __len__(self) -> int:
        return len(self._live)

    def update(self, rows: Sequence[tuple[np.ndarray, int]]) -> tuple[list[int], list[int]]:
        """Assign a key to each ``(tokens, num_new)`` row.

        Returns ``(keys, departed)``: one key per row, and the keys of requests
        tracked before that are not in this batch.
        """
        # Group candidates by (head_len, head_hash, expected length).
        by_sig: dict[tuple[int, int, int], list[_Tracked]] = {}
        head_lens = set()
        for t in self._live.values():
            by_sig.setdefault((t.head_len, t.head_hash, t.length), []).append(t)
            head_lens.add(t.head_len)

        keys: list[int] = []
        seen: dict[int, _Tracked] = {}
        for tokens, num_new in rows:
            n = len(tokens)
            prev_len = n - num_new
            match = None
            for head_len in head_lens:
                if head_len > prev_len or head_len == 0 and prev_len == 0:
                    continue
                cands = by_sig.get((head_len, _head_hash(tokens, head_len), prev_len), [])
                for i, t in enumerate(cands):
                    if prev_len == 0 or tokens[prev_len - 1] == t.last_token:
                        match = cands.pop(i)  # each tracked request takes one row at most
                        break
                if match is not None:
                    break
            if match is None:
                head_len = min(HEAD_TOKENS, prev_len if prev_len > 0 else n)
                match = _Tracked(next(self._keys), head_len, _head_hash(tokens, head_len), n, -1)
            match.length = n
            match.last_token = int(tokens[n - 1]) if n else -1
            seen[match.key] = match
            keys.append(match.key)

        departed = [k for k in self._live if k not in seen]
        self._live = seen
        return keys, departed
