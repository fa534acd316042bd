"""Where a step's time goes at concurrency 1: one offline vLLM engine run in this process under cProfile.

    python results/step-profile/profile_step.py --questions question.jsonl --config none --dtype bfloat16
    python results/step-profile/profile_step.py --questions question.jsonl --config hybrid --dtype bfloat16

VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine core in this process, so the profile sees the model runner,
the sampler and the plugin. The 8th question of the first 8 categories, greedy, 128 tokens each, one at a time,
after one warm-up request. Prints tok/s and, per engine step, the milliseconds of the step's parts (cumulative
times: cProfile's own overhead is in them, more for the Python-heavy parts); --pstats keeps the raw profile.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time

# (label, function name, file it is defined in): cumulative seconds of each, divided by the engine's steps.
PARTS = (
    ("engine step", "step", "v1/engine/core.py"),
    ("model forward", "_model_forward", "gpu_model_runner.py"),
    ("logits (lm head)", "compute_logits", "models/llama.py"),
    ("sampling (with rejection sampling)", "sample_tokens", "gpu_model_runner.py"),
    ("rejection sampler", "forward", "v1/sample/rejection_sampler.py"),
    ("inputs prepared", "_prepare_inputs", "gpu_model_runner.py"),
    ("scheduler", "schedule", "sched/scheduler.py"),
    ("freespec's propose (all of it)", "propose", "vllm_plugins/adapter.py"),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", required=True)
    p.add_argument("--config", default="hybrid", help="none, or a freespec plugin name (default hybrid)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--model", default=os.path.expanduser("~/.cache/freespec/models/smollm2-135m-instruct"))
    p.add_argument("--pstats", help="also write the raw profile here")
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    by_category: dict[str, list] = {}
    for line in open(args.questions):
        q = json.loads(line)
        by_category.setdefault(q["category"], []).append(q)
    prompts = [qs[7]["turns"][0] for qs in list(by_category.values())[:8]]
    spec = None if args.config == "none" else {"plugin": args.config, "num_speculative_tokens": 8}
    llm = LLM(model=args.model, dtype=args.dtype, gpu_memory_utilization=0.3, max_model_len=2048, seed=0,
              speculative_config=spec)
    params = SamplingParams(max_tokens=128, temperature=0)
    llm.chat([[{"role": "user", "content": "Say hello."}]], params, use_tqdm=False)
    profile = cProfile.Profile()
    started, tokens = time.perf_counter(), 0
    profile.enable()
    for prompt in prompts:
        out = llm.chat([[{"role": "user", "content": prompt}]], params, use_tqdm=False)
        tokens += len(out[0].outputs[0].token_ids)
    profile.disable()
    wall = time.perf_counter() - started
    if args.pstats:
        profile.dump_stats(args.pstats)
    stats = pstats.Stats(profile).stats
    seconds = {}
    steps = 0
    for (path, _, name), (_, calls, _, cumulative, _) in stats.items():
        for label, function, where in PARTS:
            if name == function and path.endswith(where):
                seconds[label] = cumulative
                if label == "engine step":
                    steps = calls
    print(f"{args.config}, {args.dtype}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tok/s, {steps} engine "
          f"steps, {tokens / max(steps, 1):.2f} tokens a step")
    print("| part | ms per step |\n|---|---:|")
    for label, _, _ in PARTS:
        if label in seconds:
            print(f"| {label} | {seconds[label] / max(steps, 1) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
