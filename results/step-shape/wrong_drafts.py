"""A measuring plugin, not a product one: drafts n tokens that are never right (token 0), n cycling step by
step through ``FS_CYCLE`` (default 0..8), and appends (tokens the step scored, seconds from the end of one
propose() call to the start of the next, context length, requests in the step) to ``FS_CYCLE_OUT``. With
every draft rejected each step produces one token per request, so the seconds are the target's step time at
that many scored tokens, interleaved so that drift and context length fall on every size alike. With
``FS_RANDOM=1`` each request of a batch drafts its own n, drawn uniformly from ``FS_CYCLE`` (seeded), so a
batch's steps cover every total."""
import os
import random
import time

from freespec.proposers.base import Proposer, ProposerOptions

SIZES = [int(x) for x in os.environ.get("FS_CYCLE", "0,1,2,3,4,5,6,7,8").split(",")]


class CycleWrong(Proposer):
    Options = ProposerOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.last, self.last_n, self.last_rows, self.lines = 0, None, None, 0, []
        self.rng = random.Random(0) if os.environ.get("FS_RANDOM") == "1" else None

    def propose(self, rows):
        now = time.perf_counter()
        if self.last is not None and all(r.num_new > 0 for r in rows):
            self.lines.append(f"{self.last_n} {now - self.last:.6f} {len(rows[0].tokens)} {self.last_rows}\n")
            if len(self.lines) >= 100:
                with open(os.environ["FS_CYCLE_OUT"], "a") as f:
                    f.writelines(self.lines)
                self.lines = []
        self.calls += 1
        if self.rng is not None:
            ns = [min(self.rng.choice(SIZES), self.k) for _ in rows]
        else:
            ns = [min(SIZES[self.calls % len(SIZES)], self.k)] * len(rows)
        self.last, self.last_n, self.last_rows = time.perf_counter(), sum(1 + n for n in ns), len(rows)
        return [[0] * n for n in ns]
