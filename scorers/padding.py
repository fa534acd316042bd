"""Filler tokens for a draft padded to a faster step size (``scorers.policy.shape_drafts``).

Padding is verified like any draft token, so it never changes the output; it only has to be cheap and,
where it can, right. The filler continues the request the way it went on after the latest earlier
occurrence of the draft's last token (a one-token copy), within the last ``SEARCH_TOKENS`` tokens, and
repeats that token where the copy runs out. Work: one vectorised comparison over at most
``SEARCH_TOKENS`` token ids.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from freespec.scorers.tuning import SEARCH_TOKENS


def context_padding(tokens: np.ndarray, draft: Sequence[int], n: int) -> list[int]:
    """``n`` tokens to append to ``draft`` (the request's ``tokens`` so far come before it)."""
    if n <= 0:
        return []
    if draft:
        last, window = int(draft[-1]), tokens[-SEARCH_TOKENS:]
    else:  # the request's last token: look before it
        last, window = int(tokens[-1]), tokens[-SEARCH_TOKENS - 1 : -1]
    hits = np.flatnonzero(window == last)
    out = window[hits[-1] + 1 : hits[-1] + 1 + n].tolist() if len(hits) else []
    return [int(t) for t in out] + [last] * (n - len(out))
