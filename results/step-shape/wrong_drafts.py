"""A measuring plugin, not a product one: drafts n tokens that are never right (token 0), n cycling step by
step through ``FS_CYCLE`` (default 0..8), and appends (n verified, seconds from the end of one propose()
call to the start of the next, context length) to ``FS_CYCLE_OUT``. With every draft rejected each step
produces one token, so the seconds are the target's step time at 1 + n scored tokens, interleaved so that
drift and context length fall on every n alike."""
import os
import time

from freespec.proposers.base import Proposer, ProposerOptions

SIZES = [int(x) for x in os.environ.get("FS_CYCLE", "0,1,2,3,4,5,6,7,8").split(",")]


class CycleWrong(Proposer):
    Options = ProposerOptions

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.last, self.last_n, self.lines = 0, None, None, []

    def propose(self, rows):
        now = time.perf_counter()
        if self.last is not None and all(r.num_new > 0 for r in rows):
            self.lines.append(f"{self.last_n} {now - self.last:.6f} {len(rows[0].tokens)}\n")
            if len(self.lines) >= 100:
                with open(os.environ["FS_CYCLE_OUT"], "a") as f:
                    f.writelines(self.lines)
                self.lines = []
        self.calls += 1
        n = min(SIZES[self.calls % len(SIZES)], self.k)
        self.last, self.last_n = time.perf_counter(), n
        return [[0] * n for _ in rows]
