"""The lossless check on a GPU: greedy text with each speculative config is the text without speculation.

Run by scripts/gpu_check.sh (the GPU owner's one command); on its own:

    python scripts/gpu_lossless.py --model Qwen/Qwen2.5-0.5B-Instruct --out gpu_check/lossless

Each config is one offline vLLM engine in its own process (``freespec/testing/engine_run.py``, as the
integration tests run engines), on the same prompts with greedy decoding: first without speculation
(with the target's top-2 logprobs), then vLLM's own ``ngram`` (the control: vLLM's own method must pass
the same check) and each freespec plugin. A prompt passes when its token ids are identical, or when the
first difference sits on a numerical tie of the target's top-2 (``freespec/testing/lossless.py``: a
different batch shape may flip a tie). Writes ``lossless.json`` and ``lossless.md``; exit status 1 when a
config differs beyond a tie, its engine fails or the time budget left it out, 0 otherwise.

On vLLM >= 0.34 (Model Runner V2 only) ``gpu_check.sh`` adds ``--speed 1 16``: each engine runs with CUDA
graphs (not eager) and, after the greedy prompts, times other prompts (``freespec.builtin_prompts``, so no
corpus has seen their answers) at each concurrency: output tok/s of the same engine whose text was checked.
Configs there: vLLM's ``suffix`` (V2's GPU suffix decoding), each plugin as ``{"plugin": ...}`` and
``freespec_<plugin>``, the registered method by name. ``--check-configs`` builds every config's vLLM
``SpeculativeConfig`` (after freespec's rewrite of ``{"plugin": ...}``) without an engine or a GPU.

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
FREESPEC = ("copy", "recycle", "retrieval", "hybrid", "pearl")
PLUGINS = ("ngram", *FREESPEC)  # the default configs
# Every config this check knows: vLLM's methods, the plugins, and each plugin by its V2 method name.
CONFIGS = (*PLUGINS, "suffix", *(f"freespec_{p}" for p in FREESPEC))
K = 6
SPEED_REQUESTS = 4  # at least this many requests a concurrency level (waves of `level` requests)

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


def spec_for(config: str, model_dir: str, datastore: str | None, pearl_device: str) -> dict:
    """The speculative config of one checked config (K draft tokens): vLLM's ``ngram`` or ``suffix``, a plugin
    as ``{"plugin": ...}``, or ``freespec_<plugin>``: the V2 method by name, its options in speculator_options."""
    if config == "ngram":
        return {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if config == "suffix":
        return {"method": "suffix", "num_speculative_tokens": K}
    plugin = config.removeprefix("freespec_")
    options: dict = {}
    if plugin == "retrieval":
        options["datastore"] = datastore
    if plugin == "pearl":
        options.update({"draft_model": model_dir, "device": pearl_device})
    if config.startswith("freespec_"):
        return {"method": config, "num_speculative_tokens": K, "speculator_options": options}
    return {"plugin": plugin, "num_speculative_tokens": K, **options}


def speed_jobs(levels: list[int], max_tokens: int) -> list[dict]:
    """One job per concurrency level: waves of ``level`` requests, at least SPEED_REQUESTS in all, each level on
    prompts of its own that the greedy job did not use (categories interleaved)."""
    from freespec.builtin_prompts import builtin_prompts

    need = sum(level * -(-SPEED_REQUESTS // level) for level in levels)
    pool = builtin_prompts(per_category=-(-need // 7) + 1)
    by_category: dict[str, list[str]] = {}
    for category, prompt in pool:
        by_category.setdefault(category, []).append(prompt)
    interleaved = [p for group in zip(*by_category.values()) for p in group]
    jobs, used = [], 0
    for level in levels:
        count = level * -(-SPEED_REQUESTS // level)
        jobs.append({"name": f"speed_{level}", "prompts": interleaved[used: used + count], "max_tokens": max_tokens,
                     "wave": level})
        used += count
    return jobs


def engine_main(in_path: str, out_path: str) -> None:
    """One engine for ``--speed`` (run as ``gpu_lossless.py --engine IN OUT``): engine_run's jobs, with CUDA graphs
    and a job's ``wave`` (requests sent together, one ``chat`` call each): tok/s at that concurrency."""
    from vllm import LLM, SamplingParams

    spec = json.load(open(in_path))
    waves = [job.get("wave", len(job["prompts"])) for job in spec["jobs"]]
    llm = LLM(model=spec["model"], dtype=spec.get("dtype", "float32"), speculative_config=spec.get("speculative_config"),
              gpu_memory_utilization=spec.get("memory", 0.3), max_model_len=2048, max_num_seqs=max([16, *waves]),
              disable_log_stats=False, seed=0)
    results = {}
    for job, wave in zip(spec["jobs"], waves):
        messages = [[{"role": "user", "content": p}] for p in job["prompts"]]
        params = SamplingParams(max_tokens=job["max_tokens"], temperature=0.0, logprobs=job.get("logprobs"))
        before, outputs, started = spec_counters(llm), [], time.perf_counter()
        for i in range(0, len(messages), wave):
            outputs += llm.chat(messages[i: i + wave], params, use_tqdm=False)
        seconds = time.perf_counter() - started
        after = spec_counters(llm)
        ids = [list(o.outputs[0].token_ids) for o in outputs]
        results[job["name"]] = {"texts": [o.outputs[0].text for o in outputs], "token_ids": ids,
                                "top_logprobs": [top2(o.outputs[0].logprobs) for o in outputs],
                                "spec": {k: after[k] - before.get(k, 0) for k in after},
                                "seconds": seconds, "tok_s": sum(map(len, ids)) / seconds}
    json.dump(results, open(out_path, "w"))


def top2(logprobs) -> list[list[float]] | None:
    """The two highest logprobs at each position (as engine_run records them)."""
    if not logprobs:
        return None
    return [sorted((x.logprob for x in pos.values()), reverse=True)[:2] for pos in logprobs]


def spec_counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters (drafted, accepted tokens), as engine_run reads them."""
    counters: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            counters[metric.name] = counters.get(metric.name, 0) + metric.value
    return counters


def check_configs(configs: list[str], model_dir: str) -> int:
    """Each config as vLLM's own ``SpeculativeConfig`` builds it, after freespec's rewrite of ``{"plugin": ...}``
    (V2: ``freespec_<plugin>``; below 0.34: ``custom_class``); no engine, no GPU. Exit status 1 if one is refused."""
    import tempfile

    from vllm.config import SpeculativeConfig
    from vllm.plugins import load_general_plugins

    from freespec.proposers.retrieval.build import build_datastore
    from freespec.vllm_plugins.frontend import translate
    from freespec.vllm_plugins.probes import vllm_version
    from freespec.vllm_plugins.v2.spelling import v2_speculative_config
    from freespec.vllm_plugins.version_gate import runner_name, uses_v2_registry

    load_general_plugins()
    version = vllm_version()
    print(f"[configs] vLLM {version}: {runner_name(version)}")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"  # a tiny datastore for retrieval's option check
        corpus.write_text(json.dumps({"text": "1 2 3 4 5 6 7 8"}) + "\n")
        build_datastore([corpus], Path(tmp) / "ds", lambda texts: [[int(x) for x in t.split()] for t in texts],
                        tokenizer_name="check", fingerprint="check", vocab_size=16, progress=False)
        for config in configs:
            spec = spec_for(config, model_dir, str(Path(tmp) / "ds"), "cuda:0")
            try:
                if "plugin" in spec:
                    spec = v2_speculative_config(spec) if uses_v2_registry(version) else translate(spec, None)[0]
                built = SpeculativeConfig(**spec)
                method = getattr(built, "custom_method", None) or built.method
                print(f"[configs] {config}: ok, method {method}, K={built.num_speculative_tokens}")
            except Exception as e:  # a refused config names its field
                failed = 1
                print(f"[configs] {config}: REFUSED ({type(e).__name__}: {str(e)[:300]})")
    return failed


def resolve_model(model: str) -> str:
    """A local directory for ``model`` (a path, or a Hugging Face id downloaded into the HF cache)."""
    if Path(model).is_dir():
        return str(Path(model).resolve())
    from huggingface_hub import snapshot_download

    return snapshot_download(model)


def run_engine(name: str, model_dir: str, dtype: str, spec: dict | None, jobs: list, workdir: Path,
               graphs: bool = False, memory: float = 0.3) -> tuple:
    """One engine in its own process; (results by job, log, seconds) — results None when it failed. ``graphs``:
    this script's ``engine_main`` (CUDA graphs, timed waves), else engine_run's eager engine."""
    spec_in, spec_out, log_path = (workdir / f"{name}.in.json", workdir / f"{name}.out.json",
                                   workdir / f"{name}.log")
    spec_in.write_text(json.dumps({"model": model_dir, "dtype": dtype, "speculative_config": spec, "jobs": jobs,
                                   "memory": memory}))
    # The checkout goes last on sys.path: the installed freespec wins over the clone's folders.
    if graphs:
        body = (f"import runpy; sys.argv = ['gpu_lossless', '--engine', {str(spec_in)!r}, {str(spec_out)!r}]; "
                f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')")
    else:
        body = f"from freespec.testing.engine_run import main; main({str(spec_in)!r}, {str(spec_out)!r})"
    launcher = f"import sys; sys.path.append({str(REPO)!r}); {body}"
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
            lines.append(f"| {name} | {'NOT RUN' if r.get('not_run') else 'ENGINE FAILED'} ({r['error']}) "
                         "| | | | | | |")
            continue
        verdict = "NOT CHECKED (freespec stepped aside)" if r.get("disabled") else (
            "lossless" if r["ok"] else "DIFFERS")
        lines.append(f"| {name} | {verdict} | {r['identical']}/{r['prompts']} | {r['tie_divergences']} | "
                     f"{r['output_tokens']} | {r['draft_tokens']:.0f} | {r['accepted_tokens']:.0f} | "
                     f"{r['engine_seconds']:.0f} |")
    problems = [f"- {name}: {p}" for name, r in result["configs"].items() for p in r.get("problems", [])]
    lines += [""] + problems if problems else []
    levels = result.get("speed_levels")
    if levels:  # tok/s of each engine at each concurrency, and its ratio to no speculation's
        base = result["configs"].get("none", {}).get("tok_s", {})
        lines += ["", (f"Output tok/s (ratio to none), CUDA graphs, {SPEED_REQUESTS}+ other prompts a level "
                       f"(freespec.builtin_prompts), {result['max_tokens']} tokens each:"), "",
                  "| config | " + " | ".join(f"{level} at a time" for level in levels) + " |",
                  "|---|" + "---:|" * len(levels)]
        for name, r in result["configs"].items():
            cells = []
            for level in levels:
                value = r.get("tok_s", {}).get(str(level))
                ratio = f" ({value / base[str(level)]:.2f}x)" if value and base.get(str(level)) else ""
                cells.append(f"{value:.1f}{ratio}" if value else "")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="a model directory or hub id")
    parser.add_argument("--plugins", nargs="+", default=list(PLUGINS), choices=CONFIGS, metavar="CONFIG",
                        help=f"configs to check against no speculation (default: {' '.join(PLUGINS)}; "
                             f"all: {' '.join(CONFIGS)})")
    parser.add_argument("--dtype", default="float32",
                        help="float32 (default: ties are rare and recognisable) or bfloat16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--tie-epsilon", type=float, default=None,
                        help="top-2 logprob gap counted as a tie (default: freespec/testing/lossless.py's)")
    parser.add_argument("--pearl-device", default="cuda:0", help="where pearl's draft model runs")
    parser.add_argument("--speed", nargs="+", type=int, default=[], metavar="N",
                        help="also time each engine at these concurrencies (CUDA graphs on; e.g. 1 16)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no engine past this many seconds (the rest are reported NOT RUN)")
    parser.add_argument("--memory", type=float, default=0.3,
                        help="--speed engines' gpu_memory_utilization (on vLLM's CPU backend: of host memory)")
    parser.add_argument("--check-configs", action="store_true",
                        help="only build each config's vLLM SpeculativeConfig (no engine, no GPU)")
    parser.add_argument("--out", default="lossless", help="output folder")
    args = parser.parse_args(argv)
    sys.path.append(str(REPO))
    if args.check_configs:
        return check_configs(args.plugins, resolve_model(args.model))
    from freespec.testing.lossless import TIE_EPSILON

    started = time.monotonic()
    epsilon = TIE_EPSILON if args.tie_epsilon is None else args.tie_epsilon
    out = Path(args.out)
    (out / "engines").mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(args.model)
    job = {"name": "greedy", "prompts": list(PROMPTS), "max_tokens": args.max_tokens}
    speed = speed_jobs(args.speed, args.max_tokens) if args.speed else []
    graphs = bool(speed)
    result = {"model": args.model, "model_dir": model_dir, "dtype": args.dtype, "max_tokens": args.max_tokens,
              "tie_epsilon": epsilon, "speed_levels": args.speed, "configs": {}}

    def tok_s(got: dict) -> dict:
        return {str(j["wave"]): got[j["name"]]["tok_s"] for j in speed if j["name"] in got}

    print(f"[lossless] none (baseline), {args.dtype}", flush=True)
    base, log, seconds = run_engine("none", model_dir, args.dtype, None, [{**job, "logprobs": 2}, *speed],
                                    out / "engines", graphs, args.memory)
    if base is None:
        print(f"[lossless] the engine without speculation failed; log: {out / 'engines' / 'none.log'}\n{log[-3000:]}")
        result["configs"]["none"] = {"error": "baseline engine failed", "ok": False}
        (out / "lossless.json").write_text(json.dumps(result, indent=1) + "\n")
        return 1
    result["configs"]["none"] = {"prompts": len(PROMPTS), "identical": len(PROMPTS), "tie_divergences": 0,
                                 "problems": [], "ok": True, "engine_seconds": seconds, "draft_tokens": 0,
                                 "accepted_tokens": 0, "tok_s": tok_s(base),
                                 "output_tokens": sum(len(t) for t in base["greedy"]["token_ids"])}
    datastore = None
    if {"retrieval", "freespec_retrieval"} & set(args.plugins):
        datastore = build_datastore(model_dir, base["greedy"]["texts"], out)
    for plugin in args.plugins:
        # An engine takes about as long as the baseline's did: none is started that would end past the budget.
        if args.budget_s is not None and time.monotonic() - started + seconds > args.budget_s:
            print(f"[lossless] {plugin}: not run (time budget of {args.budget_s:.0f} s)", flush=True)
            result["configs"][plugin] = {"error": f"time budget {args.budget_s:.0f} s", "ok": False, "not_run": True}
            continue
        print(f"[lossless] {plugin}", flush=True)
        spec = spec_for(plugin, model_dir, datastore, args.pearl_device)
        got, log, seconds = run_engine(plugin, model_dir, args.dtype, spec, [job, *speed], out / "engines", graphs,
                                       args.memory)
        if got is None:
            tail = log.strip().splitlines()[-1:] or ["no output"]
            result["configs"][plugin] = {"error": tail[0][:200], "ok": False, "engine_seconds": seconds}
            continue
        result["configs"][plugin] = {**judge(base["greedy"], got["greedy"], epsilon), "engine_seconds": seconds,
                                     "spec": spec, "disabled": "is disabled and vLLM decodes" in log,
                                     "tok_s": tok_s(got)}
    (out / "lossless.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (out / "lossless.md").write_text(table)
    print(table)
    disabled = [name for name, r in result["configs"].items() if r.get("disabled")]
    if disabled:
        print(f"[lossless] freespec stepped aside for {disabled} (see their logs): they were not checked")
    return 0 if all(r["ok"] and not r.get("disabled") for r in result["configs"].values()) else 1


if __name__ == "__main__" and sys.argv[1:2] == ["--engine"]:
    engine_main(sys.argv[2], sys.argv[3])
    sys.exit(0)
if __name__ == "__main__":
    sys.exit(main())
