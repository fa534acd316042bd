"""Measuring plugins, not product ones: every request of a batch decodes, and each step the batch is handed
wrong draft tokens (token 0, never accepted), so each step produces one token a request and its time is the
target's step time at that many scored tokens. They append (pattern or total, seconds from the end of one
propose() call to the start of the next, requests in the step, context length) to ``FS_CYCLE_OUT``.

``MixedWrong``: step by step through ``PATTERNS`` (how many requests get a draft, of how many tokens), or with
``FS_FINE=1`` through k requests drafting one token, k = 0..24, 28, 32, 39.
``TotalsWrong``: d draft tokens in all, spread one a request round-robin (at most 8 each), d cycling through
``FS_TOTALS`` (default 0..32).
"""
import os
import time

from freespec.proposers.base import Proposer, ProposerOptions

PATTERNS = ([(k, 1) for k in range(0, 25)] + [(28, 1), (32, 1), (39, 1)]) if os.environ.get("FS_FINE") else [
    (0, 0), (1, 1), (0, 0), (2, 1), (0, 0), (4, 1), (0, 0), (8, 1), (0, 0), (1, 4), (0, 0), (16, 1), (0, 0), (39, 1),
    (0, 0), (4, 4)]
TOTALS = [int(x) for x in os.environ.get("FS_TOTALS", ",".join(map(str, range(33)))).split(",")]


class _Logged(Proposer):
    Options = ProposerOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.last, self.last_key, self.last_rows, self.lines = 0, None, None, 0, []

    def propose(self, rows):
        now = time.perf_counter()
        if self.last is not None and all(r.num_new > 0 for r in rows):
            self.lines.append(f"{self.last_key} {now - self.last:.6f} {self.last_rows} {len(rows[0].tokens)}\n")
            if len(self.lines) >= 50:
                with open(os.environ["FS_CYCLE_OUT"], "a") as f:
                    f.writelines(self.lines)
                self.lines = []
        self.calls += 1
        key, counts = self.counts(len(rows))
        self.last, self.last_key, self.last_rows = time.perf_counter(), key, len(rows)
        return [[0] * n for n in counts]


class MixedWrong(_Logged):
    def counts(self, n_rows):
        p = self.calls % len(PATTERNS)
        m, n = PATTERNS[p]
        return p, [n if i < m else 0 for i in range(n_rows)]


class TotalsWrong(_Logged):
    def counts(self, n_rows):
        d = TOTALS[self.calls % len(TOTALS)]
        n = [0] * n_rows
        for i in range(min(d, 8 * n_rows)):
            n[i % n_rows] += 1
        return sum(n), n
