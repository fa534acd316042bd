"""Power of the temperature-0.8 distribution check by sample size, and the check itself at that size.

The integration tests compare 160 samples with and without speculation (``assert_same_distribution``, with
the statistics of ``integration_tests/lossless.py``). This script asks how large a shift such a check can see,
and runs it with more samples:

1. Samples the check's prompt ``--samples`` times without speculation, twice (independent sets A and B), and
   its greedy text, in one offline vLLM engine; with ``--plugins``, ``--samples`` more with each config.
2. Power: for each sample size n and each share s of requests shifted to the draft's text (what a verification
   that accepts drafts without the rejection test produces on this copy-heavy prompt, where the context
   sources draft the greedy continuation), the share of trials in which each statistic exceeds its critical
   value at p <= 0.001 (the largest of 1000 permutations of A and B pooled; B shifted).
3. Each config's samples against set A, with both statistics (permutation p-values).

``--plugins`` takes ``freespec bench --configs`` entries (``copy``, ``pearl:{"draft_model": "DIR"}``); with
``--code-datastore DIR`` the test's datastore of the prompt's code is built at DIR first, for
``retrieval:{"datastore": "DIR"}``.

    .venv/bin/python scripts/distribution_power.py --samples 1000 --out results/distribution-power
    .venv/bin/python scripts/distribution_power.py --analyse results/distribution-power/samples.json
    .venv/bin/python scripts/distribution_power.py --reference OUT/samples.json --plugins hybrid --out OUT2

Writes OUT/samples.json and OUT/power.md. Sampling takes about 4 minutes per 1,000 samples on 2 cores
(float32, SmolLM2-135M); the analysis about a minute.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from integration_tests.conftest import (  # noqa: E402
    CODE_DOCUMENTS,
    SAMPLE_GREEDY_JOB,
    SAMPLE_JOB,
    SAMPLE_PREFIX_JOB,
    SAMPLE_PROMPT,
    SAMPLE_TOKENS,
    EngineRuns,
    K,
    build_datastore_of,
)
from integration_tests.lossless import (  # noqa: E402
    SAME_P,
    STATISTICS,
    detection_power,
    null_statistics,
    permutation_pvalue,
    prefix_lengths,
    statistic,
    token_matrix,
)

PERMUTATIONS = 1000
SHARES = (0.05, 0.1, 0.2, 0.3, 0.5)
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def collect(model: str, samples: int, configs: list, workdir: Path, max_num_seqs: int | None = None,
            reference: dict | None = None, engine_timeout_s: float = 900) -> dict:
    """Two no-speculation sample sets, the greedy text, and a set from each config (``max_num_seqs``: the
    configs' engines run at most this many requests at once; the reference runs at vLLM's default).
    ``reference``: an earlier run's samples, whose sets and greedy text are used instead of sampling them.
    ``engine_timeout_s``: how long one engine run (one config's samples) may take before it is killed."""
    engines = EngineRuns(model, workdir, engine_timeout_s)
    sample = {**SAMPLE_JOB, "prompts": [SAMPLE_PROMPT] * samples}
    if reference is not None:
        data = {"a": reference["a"][:samples], "b": reference["b"][:samples], "draft": reference["draft"],
                "plugins": {}}
    else:
        ref, _ = engines.run("none", None, [SAMPLE_PREFIX_JOB, {**sample, "name": "a"}, {**sample, "name": "b"},
                                            SAMPLE_GREEDY_JOB], env=ENV)
        data = {"a": ref["a"]["token_ids"], "b": ref["b"]["token_ids"],
                "draft": ref["sample_greedy"]["token_ids"][0], "plugins": {}}
    for i, config in enumerate(configs):
        print(f"sampling with {config.label}", flush=True)
        run, _ = engines.run(f"config{i}", config.speculative_config, [SAMPLE_PREFIX_JOB, sample], env=ENV,
                             engine_args={"max_num_seqs": max_num_seqs} if max_num_seqs else None)
        data["plugins"][config.label] = {"samples": run["sample"]["token_ids"], "spec": run["sample"]["spec"],
                                         "seconds": run["sample"]["seconds"]}
    return data


def analyse(data: dict, sizes: list[int], trials: int) -> str:
    rng = np.random.default_rng(0)
    a_all, b_all = token_matrix(data["a"], SAMPLE_TOKENS), token_matrix(data["b"], SAMPLE_TOKENS)
    draft = token_matrix([data["draft"]], SAMPLE_TOKENS)[0]
    agree = prefix_lengths(a_all, draft)
    out = [(f"Set A: {len(a_all)} samples without speculation follow the draft's text for {agree.mean():.1f} of "
           f"{SAMPLE_TOKENS} tokens on average (median {np.median(agree):.0f}; all {SAMPLE_TOKENS} in "
           f"{np.mean(agree == SAMPLE_TOKENS):.0%})."), "",
           "Power at p <= 0.001 (share of trials detected), by the share of requests that follow the draft:", "",
           "| statistic | samples a side | A vs B unshifted detected | "
           + " | ".join(f"{s:.0%}" for s in SHARES) + " |",
           "|---|---:|---|" + "---:|" * len(SHARES)]
    for name in STATISTICS:
        for n in sizes:
            if n > min(len(a_all), len(b_all)):
                continue
            a, b = a_all[:n], b_all[:n]
            critical = null_statistics(name, a, b, draft, PERMUTATIONS, rng).max()
            row = [f"{detection_power(name, a, b, draft, s, critical, trials, rng):.2f}" for s in SHARES]
            out.append(f"| {name} | {n} | {statistic(name, a, b, draft) > critical} | " + " | ".join(row) + " |")
            print(out[-1], flush=True)
    if data.get("plugins"):
        out += ["", (f"Each config's samples against set A ({PERMUTATIONS * 10} permutations; each statistic at "
                f"p <= {SAME_P}, so both together at p <= 0.001):"), "",
                "| config | samples | draft tokens accepted / drafted | chi2 p | prefix p | mean prefix (A) | verdict |",
                "|---|---:|---:|---:|---:|---:|---|"]
        for label, run in data["plugins"].items():
            b = token_matrix(run["samples"], SAMPLE_TOKENS)
            a = a_all[: len(b)]
            p = {name: permutation_pvalue(name, a, b, draft, PERMUTATIONS * 10, rng) for name in STATISTICS}
            spec = run["spec"]
            acc = (f"{spec.get('vllm:spec_decode_num_accepted_tokens', 0):.0f} / "
                   f"{spec.get('vllm:spec_decode_num_draft_tokens', 0):.0f}")
            verdict = "same distribution" if min(p.values()) > SAME_P else "DIFFERS"
            out.append(f"| `{label}` | {len(b)} | {acc} | {p['chi2']:.4f} | {p['prefix']:.4f} | "
                       f"{prefix_lengths(b, draft).mean():.2f} ({prefix_lengths(a, draft).mean():.2f}) | {verdict} |")
            print(out[-1], flush=True)
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=None,
                   help="samples per set (default 1000; with --reference, all of its sets)")
    p.add_argument("--plugins", nargs="*", default=["hybrid"],
                   help="configs whose samples are checked against set A, as freespec bench --configs entries "
                   "(default: hybrid, the default plugin; none: --plugins with no entry)")
    p.add_argument("--code-datastore", default=None,
                   help="build the test's datastore of the sampled prompt's code here first (for retrieval)")
    p.add_argument("--sizes", type=int, nargs="+", default=[160, 320, 640, 1000])
    p.add_argument("--trials", type=int, default=200, help="shifted trials per cell")
    p.add_argument("--model", default=None, help="model directory (default: the prepared SmolLM2 test model)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="the configs' engines run at most this many requests at once (pearl keeps a draft KV "
                   "cache for at most its max_requests, 64 by default; the offline engine otherwise runs "
                   "hundreds of the samples at once)")
    p.add_argument("--reference", default=None,
                   help="a samples.json from an earlier run: take its no-speculation sets A and B (their first "
                   "--samples) and greedy text from there, and sample only the --plugins")
    p.add_argument("--engine-timeout", type=float, default=900,
                   help="seconds one engine run (a config's samples) may take before it is killed (default 900; "
                   "pearl at 1,280 samples needs more)")
    p.add_argument("--analyse", default=None, help="a samples.json from an earlier run: analyse it, sample nothing")
    p.add_argument("--out", default="results/distribution-power")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.analyse:
        data = json.loads(Path(args.analyse).read_text())
    else:
        from freespec.bench.configs import parse_config_spec
        from freespec.model_store import prepare_model

        model = args.model or str(prepare_model())
        if args.code_datastore:
            target = Path(args.code_datastore)
            target.mkdir(parents=True, exist_ok=True)
            built = build_datastore_of(target, model, CODE_DOCUMENTS)
            print(f"code datastore: {built}", flush=True)
        configs = [parse_config_spec(entry, K) for entry in args.plugins]
        reference = json.loads(Path(args.reference).read_text()) if args.reference else None
        if reference is not None:
            args.samples = min(args.samples or len(reference["a"]), len(reference["a"]))
        elif args.samples is None:
            args.samples = 1000
        with tempfile.TemporaryDirectory() as tmp:
            data = collect(model, args.samples, configs, Path(tmp), args.max_num_seqs, reference,
                               args.engine_timeout)
        (out / "samples.json").write_text(json.dumps(data))
    command = "python scripts/distribution_power.py " + " ".join(sys.argv[1:])
    table = analyse(data, args.sizes, args.trials)
    (out / "power.md").write_text(f"# Power of the temperature-0.8 distribution check\n\n`{command}`\n\n{table}")
    print(table)


if __name__ == "__main__":
    main()
