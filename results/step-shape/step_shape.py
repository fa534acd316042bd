"""Target step time against the tokens a step scores, at concurrency 1, through the real engine.

    python results/step-shape/step_shape.py --questions question.jsonl --dtype float32 --out f32.txt

One offline vLLM engine with the ``wrong_drafts:CycleWrong`` plugin (drafts of 0..8 wrong tokens, cycling
step by step); one Spec-Bench question per category (the 6th, index 5), 128 tokens each, greedy.
Prints the median and mean step time per scored-token count.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--questions", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=os.path.expanduser("~/.cache/freespec/models/smollm2-135m-instruct"))
    args = p.parse_args()
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = here + os.pathsep + os.environ.get("PYTHONPATH", "")  # the engine's processes
    sys.path.insert(0, here)
    os.environ["FS_CYCLE_OUT"] = str(Path(args.out).resolve())
    Path(args.out).unlink(missing_ok=True)
    from vllm import LLM, SamplingParams

    by_category: dict[str, list] = {}
    for line in open(args.questions):
        q = json.loads(line)
        by_category.setdefault(q["category"], []).append(q)
    prompts = [qs[5]["turns"][0] for qs in by_category.values()]
    llm = LLM(model=args.model, dtype=args.dtype, gpu_memory_utilization=0.3, max_model_len=2048, seed=0,
              speculative_config={"plugin": "wrong_drafts:CycleWrong", "num_speculative_tokens": 8,
                                  "pad": "off"})  # the sizes as drafted, not padded
    params = SamplingParams(max_tokens=128, temperature=0)
    started, tokens = time.perf_counter(), 0
    for prompt in prompts:
        out = llm.chat([[{"role": "user", "content": prompt}]], params, use_tqdm=False)
        tokens += len(out[0].outputs[0].token_ids)
    print(f"{tokens} tokens in {time.perf_counter() - started:.1f} s")
    del llm
    data = np.loadtxt(args.out)
    print("| scored tokens | steps | median ms | mean ms |\n|---:|---:|---:|---:|")
    for n in sorted(set(data[:, 0].astype(int))):
        s = data[data[:, 0] == n, 1] * 1e3
        print(f"| {n + 1} | {len(s)} | {np.median(s):.1f} | {s.mean():.1f} |")


if __name__ == "__main__":
    main()
