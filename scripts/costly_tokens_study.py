"""Issue 69's replay: hybrid against vLLM `suffix` where a verified draft token costs a real share of a step.

For each rule it replays recorded greedy outputs (scripts/replay_drafts.py's inputs) and prints tokens per
forward, drafted tokens per step, the share of them accepted and the modeled speed at --cost (a step verifying
d tokens costs 1 + cost * d plain steps), and for freespec plugins the claimed chance of each kept draft token
against how often it was accepted. ``policy`` bars are the goodput policy's converged bar at this price
(cost * max(1, output per step / step cost), from the replay's own running averages, as
``GoodputPolicy.token_cost`` computes it with an exact step-time fit).

    python scripts/costly_tokens_study.py GREEDY --cost 0.1 [--fresh] [--limit N]
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np

from freespec.proposers.api import EngineInfo, StepContext
from freespec.proposers.registry import load_proposer_class
from freespec.scorers.policy import cut
from freespec.proposers import suffix_tree
from freespec.scorers.calibration import TokenCalibration
from freespec.scorers.tuning import CALIBRATION_DEPTH_EDGES, CALIBRATION_MATCH_EDGES, CALIBRATION_PROB_EDGES

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("replay_drafts", ROOT / "scripts" / "replay_drafts.py")
rd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rd)

KEEP = 0.5 ** (1 / 32)  # GoodputPolicy.observe_step's weighting of output and scored per step


class PolicyBar:
    """The goodput policy's bar with an exact step-time fit: cost * max(1, N / (1 + cost * d))."""

    def __init__(self, cost: float, fixed: float | None = None) -> None:
        self.cost, self.fixed, self.out, self.drafted, self.seen = cost, fixed, 1.0, 0.0, False

    def bar(self) -> float:
        if self.fixed is not None:
            return self.fixed
        return self.cost * max(1.0, self.out / (1.0 + self.cost * self.drafted))

    def observe(self, drafted: int, accepted: int) -> None:
        keep = KEEP if self.seen else 0.0
        self.seen = True
        self.out = keep * self.out + (1 - keep) * (accepted + 1)
        self.drafted = keep * self.drafted + (1 - keep) * drafted


class Freespec:
    """A freespec plugin drafting at the policy's bar; its chances kept for the calibration table.
    ``rule``: a proposed change to the cut (None: today's ``policy.cut``)."""

    def __init__(self, plugin: str, options: dict, k: int, vocab: int, bar: PolicyBar, rule=None) -> None:
        cls = load_proposer_class(plugin)
        self.p = cls(cls.Options(**options), k)
        self.p.bind(EngineInfo(vocab_size=vocab, model=""))
        self.bar, self.rule, self.last_chances = bar, rule, []

    def propose(self, rows):
        bar = self.bar.bar()
        d = self.p.draft(rows, StepContext(token_cost=bar))[0]
        kept = cut(d, bar) if self.rule is None else self.rule(d, bar, self.bar.cost)
        self.last_chances = list(kept.chances or [])
        return [list(kept.tokens)]

    def release(self, key):
        self.p.release(key)


DISAGREE = {"steps": 0, "differ": 0}


def anchored(proposer, factor: float = 1.0, min_prob: float = 0.1, empty_long: bool = True):
    """The proposed rule: the suffix source's chain is the one arctic chooses under vLLM's cap (``factor``,
    ``min_prob``), extended by the looser-cap chain only where that one starts with it; else the capped chain.
    The looser cap then lengthens a chain but never changes which one is drafted."""
    cache = proposer.p.sources["suffix"].cache
    orig = cache.speculate

    def speculate(req, ctx, max_spec_tokens=None, max_spec_factor=1.0, min_token_prob=0.1, **kw):
        short = orig(req, ctx, max_spec_tokens=max_spec_tokens, max_spec_factor=factor, min_token_prob=min_prob)
        long = orig(req, ctx, max_spec_tokens=max_spec_tokens, max_spec_factor=max_spec_factor,
                    min_token_prob=min_token_prob)
        s, lo = list(short.token_ids), list(long.token_ids)
        if s:
            DISAGREE["steps"] += 1
            DISAGREE["differ"] += lo[: len(s)] != s
            DISAGREE["match"] = DISAGREE.get("match", 0) + (short.match_len != long.match_len)
            DISAGREE["shorter"] = DISAGREE.get("shorter", 0) + (long.match_len < short.match_len)
        if not s:
            return long if empty_long else short
        return long if lo[: len(s)] == s else short

    cache.speculate = speculate
    return proposer


BEYOND: list = []  # (claimed, accepted, beyond the match length) per kept token, with --calib


def track_match(proposer):
    """Records each suffix chain's match length, so the calibration can be split at vLLM's cap (factor 1)."""
    cache = proposer.p.sources["suffix"].cache
    orig = cache.speculate

    def speculate(*a, **kw):
        d = orig(*a, **kw)
        proposer.match_len = int(d.match_len)
        return d

    cache.speculate = speculate
    proposer.match_len = 0
    return proposer


class PastTheMatch(TokenCalibration):
    """The proposed estimate: each cell split by whether the token lies past the end of the match that found it
    (depth >= match length, where vLLM's cap stops): there acceptance falls, and today's cells cannot see it."""

    def __init__(self) -> None:
        super().__init__()
        self.half = len(self.successes)
        self.successes, self.failures = self.successes * 2, self.failures * 2

    @classmethod
    def cells(cls, cond, match_len: int) -> list[int]:
        half = ((len(CALIBRATION_PROB_EDGES) + 1) * (len(CALIBRATION_MATCH_EDGES) + 1)
                * (len(CALIBRATION_DEPTH_EDGES) + 1))
        return [cls.cell(c, match_len, depth) + (half if depth >= match_len else 0) for depth, c in enumerate(cond)]


class PastBackoff(PastTheMatch):
    """PastTheMatch whose cells past the match start from the learned acceptance of all tokens past a match at
    that depth (pooled), not from the tree's probability: a continuation seen once after a short match has tree
    probability 1, and those cells see too little evidence (the cut stops the chain) to unlearn it."""

    STRENGTH = 2.0

    def __init__(self) -> None:
        super().__init__()
        for c in range(self.half, 2 * self.half):
            self.successes[c] = self.failures[c] = 0.0
        # per depth bucket: successes, failures
        self.pooled = [[1.0, 1.0] for _ in range(len(CALIBRATION_DEPTH_EDGES) + 1)]

    def estimate(self, cells):
        out = []
        for c in cells:
            s, f = self.successes[c], self.failures[c]
            if c >= self.half:
                ps, pf = self.pooled[c % (len(CALIBRATION_DEPTH_EDGES) + 1)]
                out.append((s + self.STRENGTH * ps / (ps + pf)) / (s + f + self.STRENGTH))
            else:
                out.append(s / (s + f))
        return out

    def observe(self, cells, matched: int, compared: int) -> None:
        super().observe(cells, matched, compared)
        if compared <= 0:
            return
        for i, c in enumerate(cells[: min(matched + 1, compared)]):
            if c >= self.half:
                self.pooled[c % (len(CALIBRATION_DEPTH_EDGES) + 1)][0 if i < matched else 1] += 1.0


RECAL_EDGES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


class Recalibrated(Freespec):
    """The proposed rule: the chance the policy cuts on (each prefix's, ``Draft.chances``) checked against outcomes.
    A Beta estimate per (claimed-chance bucket, whether the token lies past its match's length), starting at the
    bucket's claimed chance (``STRENGTH`` pseudo-observations), learns how often such a prefix was accepted
    (every offered token up to the one after the kept draft is compared with what the target produced), and
    the draft is cut on that estimate instead of the claim."""

    STRENGTH = 4.0

    def __init__(self, *a, split: bool = True, **kw) -> None:
        super().__init__(*a, **kw)
        track_match(self)
        self.split = split
        mids = [(lo + hi) / 2 for lo, hi in zip((0.0,) + RECAL_EDGES, RECAL_EDGES + (1.0,))]
        self.s = [[self.STRENGTH * m for m in mids] for _ in range(2)]
        self.n = [[self.STRENGTH for _ in mids] for _ in range(2)]
        self.pending = None

    def _key(self, chance: float, depth: int, match_len: int) -> tuple[int, int]:
        from bisect import bisect_right

        return int(self.split and depth >= match_len), bisect_right(RECAL_EDGES, chance)

    def propose(self, rows):
        row = rows[0]
        if self.pending is not None and self.pending[0] == row.key:
            _, start, chain, keys = self.pending
            produced = row.tokens[start: start + len(chain)].tolist()
            compared = min(len(chain), len(produced))
            for i in range(compared):
                ok = all(chain[j] == produced[j] for j in range(i + 1))
                past, b = keys[i]
                self.s[past][b] += ok
                self.n[past][b] += 1
        self.pending = None
        bar = self.bar.bar()
        d = self.p.draft(rows, StepContext(token_cost=bar))[0]
        if not d.tokens or d.chances is None:
            self.last_chances = []
            return [list(d.tokens)]
        keys = [self._key(float(c), i, self.match_len) for i, c in enumerate(d.chances)]
        est = [self.s[p][b] / self.n[p][b] for p, b in keys]
        for i in range(1, len(est)):  # a prefix cannot be likelier than a shorter one
            est[i] = min(est[i], est[i - 1])
        from freespec.proposers.api import Draft

        kept = cut(Draft(list(d.tokens), est), bar)
        n = len(kept.tokens)
        self.pending = (row.key, len(row.tokens), list(d.tokens[: n + 1]), keys[: n + 1])
        self.last_chances = list(d.chances[:n])
        return [list(kept.tokens)]


def price_capped(proposer, factor_at):
    """The proposed rule: the suffix source's cap on a chain's length (max_spec_factor: tokens per matched token)
    chosen by the step's price of a draft token, ``factor_at(bar)``."""
    cache = proposer.p.sources["suffix"].cache
    orig = cache.speculate

    def speculate(req, ctx, max_spec_tokens=None, max_spec_factor=1.0, min_token_prob=0.1, **kw):
        return orig(req, ctx, max_spec_tokens=max_spec_tokens, max_spec_factor=factor_at(proposer.bar.bar()),
                    min_token_prob=min_token_prob)

    cache.speculate = speculate
    return proposer


def step_at(threshold: float, low: float = 4.0, high: float = 1.0):
    return lambda bar: low if bar < threshold else high


def inverse(scale: float, lo: float = 1.0, hi: float = 4.0):
    return lambda bar: max(lo, min(hi, scale / max(bar, 1e-9)))


class LowerPrior(TokenCalibration):
    """A cell's starting guess lowered to ``SCALE`` of the tree's probability (a cold server's first drafts)."""

    SCALE = 0.8

    def __init__(self) -> None:
        super().__init__()
        for c in range(len(self.successes)):
            n = self.successes[c] + self.failures[c]
            self.successes[c] *= self.SCALE
            self.failures[c] = n - self.successes[c]


class Plain:
    def __init__(self, inner, bar: PolicyBar) -> None:
        self.inner, self.bar, self.last_chances = inner, bar, []

    def propose(self, rows):
        return self.inner.propose(rows)

    def release(self, key):
        self.inner.release(key)


def run(data, make, memory: bool, cost: float):
    """Totals and the calibration records: (claimed chance, accepted 0/1, position) per kept draft token."""
    tot = dict(tokens=0, steps=0, spent=0.0, drafted=0, accepted=0, calls=0)
    calib: list[tuple[float, int, int]] = []
    shared = make() if memory else None
    for key, (_, prompt, output) in enumerate(data):
        proposer = shared or make()

        def on_draft(draft, accepted, proposer=proposer):
            proposer.bar.observe(len(draft), accepted)
            tot["drafted"] += len(draft)
            tot["calls"] += 1
            tot["accepted"] += accepted
            chances = list(proposer.last_chances[: len(draft)])
            chances += [float("nan")] * (len(draft) - len(chances))
            for i, c in enumerate(chances):
                calib.append((float(c), int(i < accepted), i))
                if hasattr(proposer, "match_len"):
                    BEYOND.append((float(c), int(i < accepted), i >= proposer.match_len))

        n, steps, spent = rd.replay(proposer, key, prompt, output, cost, on_draft=on_draft)
        tot["tokens"] += n
        tot["steps"] += steps
        tot["spent"] += spent
    return tot, calib


def row(name, tot) -> str:
    share = tot["accepted"] / tot["drafted"] if tot["drafted"] else 0.0
    return (f"| {name} | {tot['tokens'] / tot['steps']:.3f} | {tot['drafted'] / max(1, tot['calls']):.2f} | "
            f"{share:.0%} | {tot['tokens'] / tot['spent']:.3f} |")


def calib_table(calib) -> list[str]:
    if not calib:
        return []
    c = np.array([x[0] for x in calib])
    a = np.array([x[1] for x in calib])
    pos = np.array([x[2] for x in calib])
    out = ["| claimed | tokens | mean claimed | accepted |", "|---|---:|---:|---:|"] if np.isfinite(c).any() else []
    edges = [0, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 0.9, 1.01]
    for lo, hi in zip(edges, edges[1:]):
        m = (c >= lo) & (c < hi)
        if m.any() and np.isfinite(c).any():
            out.append(f"| {lo:.2f}-{min(hi, 1):.2f} | {m.sum()} | {c[m].mean():.3f} | {a[m].mean():.3f} |")
    out.append("")
    out.append("| position | tokens | mean claimed | accepted |")
    out.append("|---|---:|---:|---:|")
    for i in range(int(pos.max()) + 1):
        m = pos == i
        out.append(f"| {i + 1} | {m.sum()} | {c[m].mean():.3f} | {a[m].mean():.3f} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("greedy")
    ap.add_argument("--cost", type=float, default=0.1)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--rules", default="all", help="comma-separated rule names (default all)")
    ap.add_argument("--calib", action="store_true", help="print hybrid's calibration tables")
    ap.add_argument("-k", type=int, default=8)
    args = ap.parse_args()
    model, data = rd.read_greedy(Path(args.greedy))
    data = data[: args.limit] if args.limit else data
    vocab = 1 + max(max(p + o) for _, p, o in data)
    c, k = args.cost, args.k

    rules = {
        "vllm-suffix": lambda: Plain(rd.VllmSuffix(k), PolicyBar(c)),
        "hybrid": lambda: Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c)),
        "hybrid-suffix-only": lambda: Freespec("hybrid", {"sources": ["suffix"], "price_sources": False}, k, vocab, PolicyBar(c)),
        "hybrid-f1-p0.1": lambda: Freespec(
            "hybrid", {"suffix": {"max_spec_factor": 1, "min_token_prob": 0.1}, "price_sources": False}, k, vocab, PolicyBar(c)),
        "hybrid-f1": lambda: Freespec(
            "hybrid", {"suffix": {"max_spec_factor": 1}, "price_sources": False}, k, vocab, PolicyBar(c)),
        "hybrid-f2": lambda: Freespec("hybrid", {"suffix": {"max_spec_factor": 2}, "price_sources": False}, k, vocab, PolicyBar(c)),
        "hybrid-anchored": lambda: anchored(Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c))),
        "hybrid-anchored-strict": lambda: anchored(Freespec("hybrid", {"price_sources": False}, k, vocab,
                                                            PolicyBar(c)), empty_long=False),
        "hybrid-track": lambda: track_match(Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c))),
        "hybrid-past": lambda: Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c)),
        "hybrid-past-track": lambda: track_match(Freespec("hybrid", {"price_sources": False}, k, vocab,
                                                          PolicyBar(c))),
        "hybrid-f2-past": lambda: Freespec("hybrid", {"suffix": {"max_spec_factor": 2}, "price_sources": False}, k,
                                           vocab, PolicyBar(c)),
        "hybrid-backoff": lambda: Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c)),
        "hybrid-backoff-track": lambda: track_match(Freespec("hybrid", {"price_sources": False}, k, vocab,
                                                             PolicyBar(c))),
        "hybrid-recal": lambda: Recalibrated("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c)),
        "hybrid-recal-nosplit": lambda: Recalibrated("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c),
                                                     split=False),
        "hybrid-step0.10": lambda: price_capped(Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c)),
                                                step_at(0.10)),
        "hybrid-step0.12": lambda: price_capped(Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c)),
                                                step_at(0.12)),
        "hybrid-inv0.2": lambda: price_capped(Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c)),
                                              inverse(0.2)),
        "hybrid-inv0.15": lambda: price_capped(Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c)),
                                               inverse(0.15)),
        "hybrid-inv0.2-p0.1": lambda: price_capped(Freespec("hybrid", {"suffix": {"min_token_prob": 0.1},
                                                                   "price_sources": False}, k, vocab, PolicyBar(c)),
                                                   inverse(0.2)),
        "hybrid-inv0.2-prior": lambda: price_capped(Freespec("hybrid", {"price_sources": False}, k, vocab,
                                                             PolicyBar(c)), inverse(0.2)),
        "hybrid-bar0.20": lambda: Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c, 0.20)),
        "hybrid-bar0.30": lambda: Freespec("hybrid", {"price_sources": False}, k, vocab, PolicyBar(c, 0.30)),
    }
    chosen = list(rules) if args.rules == "all" else args.rules.split(",")
    print(f"{args.greedy}: {len(data)} outputs, cost {c}, {'fresh' if args.fresh else 'memory'}")
    print("| rule | tok/fwd | drafted/step | accepted | modeled |")
    print("|---|---:|---:|---:|---:|")
    for name in chosen:
        suffix_tree.TokenCalibration = (PastBackoff if "backoff" in name else PastTheMatch if "past" in name
                                        else LowerPrior if "prior" in name else TokenCalibration)
        tot, calib = run(data, rules[name], not args.fresh, c)
        print(row(name, tot), flush=True)
        if DISAGREE["steps"]:
            print(f"  (capped chain not a prefix of the loose one: {DISAGREE['differ']} of {DISAGREE['steps']} steps; "
                  f"another match length: {DISAGREE['match']}, a shorter one: {DISAGREE['shorter']})")
            DISAGREE.update(steps=0, differ=0, match=0, shorter=0)
        if args.calib and calib:
            print("\n".join(calib_table(calib)))
        if args.calib and BEYOND:
            x = np.array(BEYOND)
            print("| tokens | kept | mean claimed | accepted |\n|---|---:|---:|---:|")
            for label, m in (("within the match length (vLLM's cap)", x[:, 2] == 0), ("beyond it", x[:, 2] == 1)):
                print(f"| {label} | {int(m.sum())} | {x[m, 0].mean():.3f} | {x[m, 1].mean():.3f} |")
                for lo, hi in ((0, 0.3), (0.3, 0.5), (0.5, 1.01)):
                    mm = m & (x[:, 0] >= lo) & (x[:, 0] < hi)
                    if mm.any():
                        print(f"| .. claimed {lo}-{min(hi, 1)} | {int(mm.sum())} | {x[mm, 0].mean():.3f} | "
                              f"{x[mm, 1].mean():.3f} |")
            BEYOND.clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
