"""Know which request sits in which batch row, step after step.

When the engine's request ids are known (the adapter reads them from vLLM's
input batch, ``FreespecProposer._request_ids``), a key belongs to one request id
for the request's whole life, so two requests can never exchange keys (and one
never drafts from another's per-request state). A key is kept only while the
request's length grows by exactly what the last step appended; otherwise (an id
reused by a new request) it gets a new key.

Without ids (the seam passes the batch as token rows only, and rows are
reordered between steps) a request is recognised by a fingerprint: its first
tokens (the prompt's head), its length, which grows by exactly the number of
tokens the last step appended, and its last token. Two requests that agree on
all three (a shared system prompt longer than the head, equal lengths and last
tokens) can exchange keys: then one drafts from state kept for the other. That
costs only speed (every draft is verified) but crosses requests;
docs/reliability.md says when it can happen and how to avoid it.

A request that is missing from a step has left the batch (finished, aborted or
preempted: vLLM drops unscheduled requests from its persistent batch); its key
is reported once so proposers can free its state. A preempted request that
comes back is simply seen as new.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Optional, Sequence

import numpy as np

HEAD_TOKENS = 64  # tokens of the sequence start used as the fingerprint


@dataclass
class _Tracked:
    key: int
    head_len: int
    head_hash: int
    length: int  # sequence length when last seen
    last_token: int
    req_id: Optional[str] = None  # the engine's request id, when known


def _head_hash(tokens: np.ndarray, head_len: int) -> int:
    return hash(tokens[:head_len].astype(np.int32, copy=False).tobytes())


class RequestTracker:
    """Map this step's rows to stable request keys; report requests that left."""

    def __init__(self) -> None:
        self._live: dict[int, _Tracked] = {}
        self._keys = count()

    def __len__(self) -> int:
        return len(self._live)

    def update(
        self, rows: Sequence[tuple[np.ndarray, int]], req_ids: Optional[Sequence[str]] = None
    ) -> tuple[list[int], list[int]]:
        """Assign a key to each ``(tokens, num_new)`` row (``req_ids``: the engine's id of each row, if known).

        Returns ``(keys, departed)``: one key per row, and the keys of requests
        tracked before that are not in this batch.
        """
        if req_ids is not None:
            return self._update_by_id(rows, req_ids)
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

    def _update_by_id(self, rows, req_ids) -> tuple[list[int], list[int]]:
        by_id = {t.req_id: t for t in self._live.values() if t.req_id is not None}
        keys: list[int] = []
        seen: dict[int, _Tracked] = {}
        for (tokens, num_new), req_id in zip(rows, req_ids):
            n = len(tokens)
            prev_len = n - num_new
            match = by_id.pop(req_id, None)
            if match is not None and not (
                match.length == prev_len and (prev_len == 0 or int(tokens[prev_len - 1]) == match.last_token)
            ):
                match = None  # the id now names another sequence: a new request
            if match is None:
                head_len = min(HEAD_TOKENS, prev_len if prev_len > 0 else n)
                match = _Tracked(next(self._keys), head_len, _head_hash(tokens, head_len), n, -1, req_id)
            match.length = n
            match.last_token = int(tokens[n - 1]) if n else -1
            match.req_id = req_id
            seen[match.key] = match
            keys.append(match.key)
        departed = [k for k in self._live if k not in seen]
        self._live = seen
        return keys, departed
