"""Target step time against the tokens a step scores, at concurrency 1 or a batch, through the real engine.

    python results/step-shape/step_shape.py --questions question.jsonl --dtype float32 --out f32.txt
    python results/step-shape/step_shape.py --questions question.jsonl --dtype float32 --out c4.txt --batch 4

One offline vLLM engine with the ``wrong_drafts:CycleWrong`` plugin (drafts of 0..8 wrong tokens, cycling
step by step); one Spec-Bench question per category (the 6th, index 5), 128 tokens each, greedy.
Prints the median and mean step time per scored-token count. ``--batch N``: N questions at a time (the 6th
to the (5+N)th of each category), each request drafting its own random 0..8 wrong tokens a step; only
steps with all N requests are counted.
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
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--model", default=os.path.expanduser("~/.cache/freespec/models/smollm2-135m-instruct"))
    args = p.parse_args()
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = here + os.pathsep + os.environ.get("PYTHONPATH", "")  # the engine's processes
    sys.path.insert(0, here)
    os.environ["FS_CYCLE_OUT"] = str(Path(args.out).resolve())
    Path(args.out).unlink(missing_ok=True)
    if args.batch > 1:
        os.environ["FS_RANDOM"] = "1"
    from vllm import LLM, SamplingParams

    by_category: dict[str, list] = {}
    for line in open(args.questions):
        q = json.loads(line)
        by_category.setdefault(q["category"], []).append(q)
    prompts = [[q["turns"][0] for q in qs[5 : 5 + args.batch]] for qs in by_category.values()]
    llm = LLM(model=args.model, dtype=args.dtype, gpu_memory_utilization=0.3, max_model_len=2048, seed=0,
              speculative_config={"plugin": "wrong_drafts:CycleWrong", "num_speculative_tokens": 8,
                                  "pad": "off"})  # the sizes as drafted, not padded
    params = SamplingParams(max_tokens=128, temperature=0)
    started, tokens = time.perf_counter(), 0
    for batch in prompts:
        out = llm.chat([[{"role": "user", "content": prompt}] for prompt in batch], params, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in out)
    print(f"{tokens} tokens in {time.perf_counter() - started:.1f} s")
    del llm
    data = np.loadtxt(args.out)
    data = data[data[:, 3] == args.batch]  # steps with the whole batch (not its last requests finishing)
    print("| scored tokens | steps | median ms | mean ms |\n|---:|---:|---:|---:|")
    for n in sorted(set(data[:, 0].astype(int))):
        s = data[data[:, 0] == n, 1] * 1e3
        print(f"| {n} | {len(s)} | {np.median(s):.1f} | {s.mean():.1f} |")


if __name__ == "__main__":
    main()
