"""A recycle proposer that checks the target_topk row mapping against ground truth (a ``module:Class`` plugin).

Greedy decoding makes the ground truth visible: every token vLLM appends is the
target's argmax at the position before it. So at every scored position whose
next token was accepted (or was the bonus token), the top-1 candidate the
adapter attributed to that position must be exactly that next token, and the
token it says sat at that position must be the token that is there. An
off-by-one, a row attributed to the wrong request after a reorder, or a prefill
chunk counted wrongly breaks this. Counts go to the JSON file named by
``FREESPEC_TOPK_CHECK_OUT`` after every step.
"""
import json
import os

from freespec.proposers.recycle.proposer import RecycleProposer


class MappingCheckProposer(RecycleProposer):
    def __init__(self, options, k):
        super().__init__(options, k)
        self.pending = None
        self.drafted: dict[int, list[int]] = {}
        self.counts = {"steps": 0, "observed_steps": 0, "checked": 0, "wrong": 0, "rows_seen": 0, "reordered": 0}
        self.last_order: list[int] = []
        self.examples: list[str] = []

    def observe(self, scored):
        self.pending = scored
        super().observe(scored)

    def draft(self, rows, step):
        c = self.counts
        c["steps"] += 1
        c["rows_seen"] += len(rows)
        order = [r.key for r in rows]
        common = [k for k in order if k in self.last_order]
        if common != [k for k in self.last_order if k in order]:
            c["reordered"] += 1
        self.last_order = order
        scored, self.pending = self.pending, None
        if scored is not None:
            c["observed_steps"] += 1
            offset = 0
            for row in rows:
                if row.num_new == 0:
                    continue  # partial prefill rows carry no scored position
                n, a = len(row.tokens), row.num_new
                for t in range(a):
                    i = offset + t
                    c["checked"] += 1
                    want = (int(row.tokens[n - a - 1 + t]), int(row.tokens[n - a + t]))
                    got = (int(scored.tokens[i]), int(scored.topk_ids[i, 0]))
                    if want != got:
                        c["wrong"] += 1
                        if len(self.examples) < 5:
                            self.examples.append(f"step {c['steps']} row {row.key} pos {t}: want {want} got {got}")
                offset += 1 + len(self.drafted.get(row.key, []))
        drafts = super().draft(rows, step)
        self.drafted = {row.key: d.tokens for row, d in zip(rows, drafts)}
        with open(os.environ["FREESPEC_TOPK_CHECK_OUT"], "w") as f:
            json.dump({**c, "examples": self.examples}, f)
        return drafts
