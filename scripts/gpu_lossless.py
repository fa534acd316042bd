"""The lossless check on a GPU: greedy text with each speculative config is the text without speculation.

Run by scripts/gpu_check.sh (the GPU owner's one command); on its own:

    python scripts/gpu_lossless.py --model Qwen/Qwen2.5-0.5B-Instruct --out gpu_check/lossless

Each config is one offline vLLM engine in its own process (``freespec/testing/engine_run.py``, as the
integration tests run engines), on the same prompts with greedy decoding: first without speculation
(with the target's top-2 logprobs), then vLLM's own ``ngram`` (the control: vLLM's own method must pass
the same check) and each freespec plugin. A prompt passes when its token ids are identical, or when the
first difference sits on a numerical tie of the target's top-2 (``freespec/testing/lossless.py``: a
different batch shape may flip a tie). Writes ``lossless.json`` and ``lossless.md``; exit status 1 when a
config differs beyond a tie or its engine fails, 0 otherwise.

freespec itself is imported from the installed package (a PyPI install or the clone's); only
``integration_tests`` is read from this checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGINS = ("ngram", "copy", "recycle", "retrieval", "hybrid", "pearl")
K = 6

CODE = """def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def spread(values):
    m = mean(values)
    return max(values) - min(values), m
"""
# Prompts of the kinds Spec-Bench has (rewriting, code edits, extraction, summarization, QA, translation,
# open writing, arithmetic); the first two are copy-heavy, so drafts from the context are accepted there.
PROMPTS = (
    f"Rewrite this Python code exactly as it is, but rename the function `mean` to `average`:\n\n{CODE}",
    (
        "Repeat the following paragraph, correcting only its spelling mistakes:\n\nThe comittee met on tuesday "
        "to discus the new budjet. Most members agreed that the libary needs more funding, but the tresurer "
        "argued that the roof repairs must come first."
    ),
    (
        "From this text, list every person's name and the city they live in, one per line as `name: city`:\n\n"
        "Ana moved from Lisbon to Berlin last year. Her brother Tomas still lives in Porto, and their friend "
        "Mei, who grew up in Osaka, now works in Toronto."
    ),
    (
        "Summarize in two sentences: Solar panels convert sunlight into electricity using photovoltaic cells. "
        "Their output depends on the angle of the sun, the weather and the temperature of the cells. Prices "
        "fell steeply over the last decade, which made rooftop installations common in many countries."
    ),
    "What is the difference between a list and a tuple in Python? Answer briefly.",
    "Translate into French: The train leaves at eight o'clock, so we should have breakfast early.",
    "Write a short story of about one hundred words about a lighthouse keeper who finds a message in a bottle.",
    "A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost? Show your reasoning step by step.",
)


def spec_for(plugin: str, model_dir: str, datastore: str | None, pearl_device: str) -> dict:
    """The speculative config of one checked config (K draft tokens)."""
    if plugin == "ngram":
        return {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    spec: dict = {"plugin": plugin, "num_speculative_tokens": K}
    if plugin == "retrieval":
        spec["datastore"] = datastore
    if plugin == "pearl":
        spec.update({"draft_model": model_dir, "device": pearl_device})
    return spec


def resolve_model(model: str) -> str:
    """A local directory for ``model`` (a path, or a Hugging Face id downloaded into the HF cache)."""
    if Path(model).is_dir():
        return str(Path(model).resolve())
    from huggingface_hub import snapshot_download

    return snapshot_download(model)


def run_engine(name: str, model_dir: str, dtype: str, spec: dict | None, jobs: list, workdir: Path) -> tuple:
    """One engine in its own process; (results by job, log, seconds) — results None when it failed."""
    spec_in, spec_out, log_path = (workdir / f"{name}.in.json", workdir / f"{name}.out.json",
                                   workdir / f"{name}.log")
    spec_in.write_text(json.dumps({"model": model_dir, "dtype": dtype, "speculative_config": spec, "jobs": jobs}))
    # The checkout goes last on sys.path: the installed freespec wins over the clone's folders.
    launcher = (f"import sys; sys.path.append({str(REPO)!r}); from freespec.testing.engine_run import main; "
                f"main({str(spec_in)!r}, {str(spec_out)!r})")
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, "-c", launcher], stdout=log, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, "FREESPEC_STATS_INTERVAL_S": "0"}, timeout=1800)
    seconds = time.perf_counter() - started
    text = log_path.read_text(errors="replace")
    if proc.returncode != 0 or not spec_out.exists():
        return None, text, seconds
    return json.loads(spec_out.read_text()), text, seconds


def build_datastore(model_dir: str, texts: list[str], workdir: Path) -> str:
    """A retrieval datastore of the model's own answers without speculation (like one built from traffic)."""
    corpus = workdir / "answers.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = workdir / "datastore"
    freespec = Path(sys.executable).parent / "freespec"
    subprocess.run([str(freespec), "datastore", "build", "--tokenizer", model_dir, "--input", str(corpus),
                    "--out", str(out), "--force"], check=True, capture_output=True, text=True)
    return str(out)


def judge(baseline: dict, got: dict, epsilon: float) -> dict:
    """Identical prompts, tie divergences and real differences of one config against the baseline."""
    sys.path.append(str(REPO))
    from freespec.testing.lossless import first_divergence, greedy_mismatches

    base_ids, base_top2, ids = baseline["token_ids"], baseline["top_logprobs"], got["token_ids"]
    identical = sum(1 for a, b in zip(base_ids, ids) if first_divergence(a, b) is None)
    problems = greedy_mismatches(base_ids, base_top2, ids, epsilon)
    spec = got.get("spec", {})
    return {
        "prompts": len(base_ids),
        "identical": identical,
        "tie_divergences": len(base_ids) - identical - len(problems),
        "problems": problems,
        "output_tokens": sum(len(t) for t in ids),
        "draft_tokens": spec.get("vllm:spec_decode_num_draft_tokens", 0),
        "accepted_tokens": spec.get("vllm:spec_decode_num_accepted_tokens", 0),
        "seconds": got.get("seconds"),
        "ok": not problems,
    }


def markdown(result: dict) -> str:
    lines = [
        (f"Model {result['model']} ({result['dtype']}), {len(PROMPTS)} prompts, greedy, "
         f"{result['max_tokens']} tokens, K={K}; tie epsilon {result['tie_epsilon']}."),
        "",
        ("| config | verdict | identical | diverged on a tie | output tokens | draft tokens | accepted "
         "| engine s |"),
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["configs"].items():
        if "error" in r:
            lines.append(f"| {name} | ENGINE FAILED ({r['error']}) | | | | | | |")
            continue
        verdict = "NOT CHECKED (freespec stepped aside)" if r.get("disabled") else (
            "lossless" if r["ok"] else "DIFFERS")
        lines.append(f"| {name} | {verdict} | {r['identical']}/{r['prompts']} | {r['tie_divergences']} | "
                     f"{r['output_tokens']} | {r['draft_tokens']:.0f} | {r['accepted_tokens']:.0f} | "
                     f"{r['engine_seconds']:.0f} |")
    problems = [f"- {name}: {p}" for name, r in result["configs"].items() for p in r.get("problems", [])]
    return "\n".join(lines + ([""] + problems if problems else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="a model directory or hub id")
    parser.add_argument("--plugins", nargs="+", default=list(PLUGINS), choices=PLUGINS,
                        help=f"configs to check against no speculation (default: {' '.join(PLUGINS)})")
    parser.add_argument("--dtype", default="float32",
                        help="float32 (default: ties are rare and recognisable) or bfloat16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--tie-epsilon", type=float, default=None,
                        help="top-2 logprob gap counted as a tie (default: freespec/testing/lossless.py's)")
    parser.add_argument("--pearl-device", default="cuda:0", help="where pearl's draft model runs")
    parser.add_argument("--out", default="lossless", help="output folder")
    args = parser.parse_args(argv)
    sys.path.append(str(REPO))
    from freespec.testing.lossless import TIE_EPSILON

    epsilon = TIE_EPSILON if args.tie_epsilon is None else args.tie_epsilon
    out = Path(args.out)
    (out / "engines").mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(args.model)
    job = {"name": "greedy", "prompts": list(PROMPTS), "max_tokens": args.max_tokens}
    result = {"model": args.model, "model_dir": model_dir, "dtype": args.dtype, "max_tokens": args.max_tokens,
              "tie_epsilon": epsilon, "configs": {}}
    print(f"[lossless] none (baseline), {args.dtype}", flush=True)
    base, log, seconds = run_engine("none", model_dir, args.dtype, None, [{**job, "logprobs": 2}], out / "engines")
    if base is None:
        print(f"[lossless] the engine without speculation failed; log: {out / 'engines' / 'none.log'}\n{log[-3000:]}")
        result["configs"]["none"] = {"error": "baseline engine failed", "ok": False}
        (out / "lossless.json").write_text(json.dumps(result, indent=1) + "\n")
        return 1
    result["configs"]["none"] = {"prompts": len(PROMPTS), "identical": len(PROMPTS), "tie_divergences": 0,
                                 "problems": [], "ok": True, "engine_seconds": seconds, "draft_tokens": 0,
                                 "accepted_tokens": 0,
                                 "output_tokens": sum(len(t) for t in base["greedy"]["token_ids"])}
    datastore = None
    if "retrieval" in args.plugins:
        datastore = build_datastore(model_dir, base["greedy"]["texts"], out)
    for plugin in args.plugins:
        print(f"[lossless] {plugin}", flush=True)
        spec = spec_for(plugin, model_dir, datastore, args.pearl_device)
        got, log, seconds = run_engine(plugin, model_dir, args.dtype, spec, [job], out / "engines")
        if got is None:
            tail = log.strip().splitlines()[-1:] or ["no output"]
            result["configs"][plugin] = {"error": tail[0][:200], "ok": False, "engine_seconds": seconds}
            continue
        result["configs"][plugin] = {**judge(base["greedy"], got["greedy"], epsilon), "engine_seconds": seconds,
                                     "spec": spec, "disabled": "is disabled and vLLM decodes" in log}
    (out / "lossless.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (out / "lossless.md").write_text(table)
    print(table)
    disabled = [name for name, r in result["configs"].items() if r.get("disabled")]
    if disabled:
        print(f"[lossless] freespec stepped aside for {disabled} (see their logs): they were not checked")
    return 0 if all(r["ok"] and not r.get("disabled") for r in result["configs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
