"""Power of the temperature-0.8 distribution check by sample size, and the check itself at that size.

integration_tests/test_distribution.py compares 160 samples with and without speculation. This script asks
how large a shift such a check can see, and runs it with more samples:

1. Samples the check's prompt ``--samples`` times without speculation, twice (independent sets A and B), and
   its greedy text, in one offline vLLM engine; with ``--plugins``, ``--samples`` more with each plugin.
2. Power: for each sample size n and each share s of requests shifted to the draft's text (what a verification
   that accepts drafts without the rejection test produces on this copy-heavy prompt, where the context
   sources draft the greedy continuation), the share of trials in which each statistic exceeds its critical
   value at p <= 0.001 (the largest of 1000 permutations of A and B pooled; B shifted).
3. Each plugin's samples against set A, with both statistics (permutation p-values).

The statistics:
- ``chi2``: the sum over positions of the two-sample chi-square of the token at each position (the check's);
- ``prefix``: the difference in mean length of the common prefix with the draft's text, B's minus A's
  (one-sided: accepting drafts too often raises it).

    .venv/bin/python scripts/distribution_power.py --samples 1000 --out results/distribution-power
    .venv/bin/python scripts/distribution_power.py --analyse results/distribution-power/samples.json

Writes OUT/samples.json and OUT/power.md. Sampling takes about 4 minutes per 1,000 samples on 2 cores
(float32, SmolLM2-135M); the analysis about a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from integration_tests.conftest import (
    SAMPLE_JOB,
    SAMPLE_PREFIX_JOB,
    SAMPLE_PROMPT,
    SAMPLE_TOKENS,
    K,
)
from integration_tests.lossless import positionwise_chi2

PERMUTATIONS = 1000
SHARES = (0.05, 0.1, 0.2, 0.3, 0.5)


def engine_samples(model: str, speculative_config: dict | None, jobs: list[dict]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_in, spec_out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        spec_in.write_text(json.dumps({"model": model, "speculative_config": speculative_config, "jobs": jobs}))
        subprocess.run([sys.executable, "-m", "integration_tests.engine_run", str(spec_in), str(spec_out)],
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"},
                       check=True)
        return json.loads(spec_out.read_text())


def collect(model: str, samples: int, plugins: list[str]) -> dict:
    """Two no-speculation sample sets, the greedy text, and a set from each plugin."""
    sample = {**SAMPLE_JOB, "prompts": [SAMPLE_PROMPT] * samples}
    ref = engine_samples(model, None, [
        SAMPLE_PREFIX_JOB, {**sample, "name": "a"}, {**sample, "name": "b"},
        {"name": "greedy", "prompts": [SAMPLE_PROMPT], "max_tokens": SAMPLE_TOKENS}])
    data = {"a": ref["a"]["token_ids"], "b": ref["b"]["token_ids"], "draft": ref["greedy"]["token_ids"][0],
            "plugins": {}}
    for plugin in plugins:
        print(f"sampling with {plugin}", flush=True)
        run = engine_samples(model, {"plugin": plugin, "num_speculative_tokens": K}, [SAMPLE_PREFIX_JOB, sample])
        data["plugins"][plugin] = {"samples": run["sample"]["token_ids"], "spec": run["sample"]["spec"],
                                   "seconds": run["sample"]["seconds"]}
    return data


def as_array(samples: list[list[int]]) -> np.ndarray:
    """(n, SAMPLE_TOKENS) token ids, -1 past a sample's end (as positionwise_chi2 counts them)."""
    out = np.full((len(samples), SAMPLE_TOKENS), -1, dtype=np.int64)
    for i, s in enumerate(samples):
        out[i, : min(len(s), SAMPLE_TOKENS)] = s[:SAMPLE_TOKENS]
    return out


class Chi2:
    """positionwise_chi2 over a pooled set, vectorised so that permutations are cheap."""

    def __init__(self, pooled: np.ndarray) -> None:
        self.inverse = [np.unique(pooled[:, p], return_inverse=True)[1] for p in range(pooled.shape[1])]
        self.totals = [np.bincount(inv) for inv in self.inverse]
        self.n = len(pooled)

    def statistic(self, first: np.ndarray) -> float:
        """The statistic of the rows ``first`` (indices) against the rest."""
        na, total = len(first), 0.0
        for inv, tot in zip(self.inverse, self.totals):
            ca = np.bincount(inv[first], minlength=len(tot)).astype(float)
            cb = tot - ca
            ea, eb = tot * na / self.n, tot * (self.n - na) / self.n
            total += float(((ca - ea) ** 2 / ea).sum() + ((cb - eb) ** 2 / eb).sum())
        return total


def chi2_stat(a: np.ndarray, b: np.ndarray, draft: np.ndarray) -> float:
    return Chi2(np.vstack([a, b])).statistic(np.arange(len(a)))


def prefix_lengths(samples: np.ndarray, draft: np.ndarray) -> np.ndarray:
    return np.cumprod(samples == draft[None, :], axis=1).sum(axis=1)


def prefix_stat(a: np.ndarray, b: np.ndarray, draft: np.ndarray) -> float:
    return float(prefix_lengths(b, draft).mean() - prefix_lengths(a, draft).mean())


def null_statistics(name: str, a: np.ndarray, b: np.ndarray, draft: np.ndarray, permutations: int, rng) -> np.ndarray:
    """The statistic under ``permutations`` random relabellings of A and B pooled."""
    pooled, na = np.vstack([a, b]), len(a)
    orders = [rng.permutation(len(pooled)) for _ in range(permutations)]
    if name == "chi2":
        chi2 = Chi2(pooled)
        return np.array([chi2.statistic(o[:na]) for o in orders])
    lengths = prefix_lengths(pooled, draft)
    return np.array([lengths[o[na:]].mean() - lengths[o[:na]].mean() for o in orders])


STATISTICS = {"chi2": chi2_stat, "prefix": prefix_stat}


def power(name: str, a, b, draft, share: float, critical: float, trials: int, rng) -> float:
    hits = 0
    for _ in range(trials):
        shifted = b.copy()
        shifted[rng.choice(len(b), size=round(share * len(b)), replace=False)] = draft
        hits += STATISTICS[name](a, shifted, draft) > critical
    return hits / trials


def pvalue(name: str, a, b, draft, permutations: int, rng) -> float:
    observed = STATISTICS[name](a, b, draft)
    null = null_statistics(name, a, b, draft, permutations, rng)
    return float((np.sum(null >= observed) + 1) / (permutations + 1))


def analyse(data: dict, sizes: list[int], trials: int) -> str:
    rng = np.random.default_rng(0)
    a_all, b_all = as_array(data["a"]), as_array(data["b"])
    draft = as_array([data["draft"]])[0]
    check = min(160, len(a_all))  # the vectorised statistic is the check's own
    assert abs(chi2_stat(a_all[:check], b_all[:check], draft)
               - positionwise_chi2(data["a"][:check], data["b"][:check], SAMPLE_TOKENS)) < 1e-6
    agree = prefix_lengths(a_all, draft)
    out = [(f"Set A: {len(a_all)} samples without speculation follow the draft's text for {agree.mean():.1f} of "
           f"{SAMPLE_TOKENS} tokens on average (median {np.median(agree):.0f}; all {SAMPLE_TOKENS} in "
           f"{np.mean(agree == SAMPLE_TOKENS):.0%})."), "",
           "Power at p <= 0.001 (share of trials detected), by the share of requests that follow the draft:", "",
           "| statistic | samples a side | A vs B unshifted detected | "
           + " | ".join(f"{s:.0%}" for s in SHARES) + " |",
           "|---|---:|---|" + "---:|" * len(SHARES)]
    for name, stat in STATISTICS.items():
        for n in sizes:
            if n > min(len(a_all), len(b_all)):
                continue
            a, b = a_all[:n], b_all[:n]
            critical = null_statistics(name, a, b, draft, PERMUTATIONS, rng).max()
            row = [f"{power(name, a, b, draft, s, critical, trials, rng):.2f}" for s in SHARES]
            out.append(f"| {name} | {n} | {stat(a, b, draft) > critical} | " + " | ".join(row) + " |")
            print(out[-1], flush=True)
    if data.get("plugins"):
        out += ["", (f"Each plugin's samples against set A ({PERMUTATIONS * 10} permutations; each statistic at "
                "p <= 0.0005, so both together at p <= 0.001):"), "",
                "| plugin | samples | draft tokens accepted / drafted | chi2 p | prefix p | mean prefix (A) | verdict |",
                "|---|---:|---:|---:|---:|---:|---|"]
        for plugin, run in data["plugins"].items():
            b = as_array(run["samples"])
            a = a_all[: len(b)]
            p = {name: pvalue(name, a, b, draft, PERMUTATIONS * 10, rng) for name in STATISTICS}
            spec = run["spec"]
            acc = f"{spec.get('vllm:spec_decode_num_accepted_tokens', 0):.0f} / {spec.get('vllm:spec_decode_num_draft_tokens', 0):.0f}"
            verdict = "same distribution" if min(p.values()) > 0.0005 else "DIFFERS"
            out.append(f"| {plugin} | {len(b)} | {acc} | {p['chi2']:.4f} | {p['prefix']:.4f} | "
                       f"{prefix_lengths(b, draft).mean():.2f} ({prefix_lengths(a, draft).mean():.2f}) | {verdict} |")
            print(out[-1], flush=True)
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1000, help="samples per set")
    p.add_argument("--plugins", nargs="*", default=["hybrid"],
                   help="plugins whose samples are checked against set A (default: hybrid, the default plugin; "
                   "none: --plugins with no name)")
    p.add_argument("--sizes", type=int, nargs="+", default=[160, 320, 640, 1000])
    p.add_argument("--trials", type=int, default=200, help="shifted trials per cell")
    p.add_argument("--model", default=None, help="model directory (default: the prepared SmolLM2 test model)")
    p.add_argument("--analyse", default=None, help="a samples.json from an earlier run: analyse it, sample nothing")
    p.add_argument("--out", default="results/distribution-power")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.analyse:
        data = json.loads(Path(args.analyse).read_text())
    else:
        from freespec.model_store import prepare_model

        data = collect(args.model or str(prepare_model()), args.samples, args.plugins)
        (out / "samples.json").write_text(json.dumps(data))
    command = "python scripts/distribution_power.py " + " ".join(sys.argv[1:])
    table = analyse(data, args.sizes, args.trials)
    (out / "power.md").write_text(f"# Power of the temperature-0.8 distribution check\n\n`{command}`\n\n{table}")
    print(table)


if __name__ == "__main__":
    main()
