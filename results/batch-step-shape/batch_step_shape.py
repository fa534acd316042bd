"""Target step time of a batch against the draft tokens it scores, through the real engine.

    python results/batch-step-shape/batch_step_shape.py --questions question.jsonl --rows 39 --plugin mixed --out p39.txt
    FS_FINE=1 python results/batch-step-shape/batch_step_shape.py --questions question.jsonl --rows 39 --plugin mixed --out f39.txt
    python results/batch-step-shape/batch_step_shape.py --questions question.jsonl --rows 16 --plugin totals --out t16.txt

One offline vLLM engine (float32, K = 8) with a plugin of batch_drafts.py; ``--rows`` Spec-Bench questions at
once (the 6th question of each category, then the 7th, ...), 256 tokens each (end of text ignored), twice.
Only steps with every request decoding are counted. Prints the median and mean step time per pattern (mixed)
or per scored-token count (totals). ``--plugin none``: the same requests without speculation (only the passes'
times); with ``FS_TOTALS=0`` and ``--plugin totals`` the speculative path runs and never drafts.
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--questions", required=True)
    p.add_argument("--rows", type=int, default=39)
    p.add_argument("--plugin", choices=("mixed", "totals", "none"), default="totals")  # none: no speculation
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=os.path.expanduser("~/.cache/freespec/models/smollm2-135m-instruct"))
    args = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = here + os.pathsep + os.environ.get("PYTHONPATH", "")  # the engine's processes
    sys.path.insert(0, here)
    out = os.path.abspath(args.out)
    os.environ["FS_CYCLE_OUT"] = out
    if os.path.exists(out):
        os.unlink(out)
    from vllm import LLM, SamplingParams

    by_category: dict[str, list] = {}
    for line in open(args.questions):
        q = json.loads(line)
        by_category.setdefault(q["category"], []).append(q)
    prompts, i = [], 5
    while len(prompts) < args.rows:
        for qs in by_category.values():
            if len(prompts) < args.rows:
                prompts.append(qs[i]["turns"][0])
        i += 1
    plugin = "batch_drafts:MixedWrong" if args.plugin == "mixed" else "batch_drafts:TotalsWrong"
    spec = {"plugin": plugin, "num_speculative_tokens": 8, "pad": "off", "policy": "fixed"}
    llm = LLM(model=args.model, dtype="float32", gpu_memory_utilization=0.3, max_model_len=2048, seed=0,
              speculative_config=None if args.plugin == "none" else spec)
    params = SamplingParams(max_tokens=256, temperature=0, ignore_eos=True)
    for rep in range(2):
        started = time.perf_counter()
        done = llm.chat([[{"role": "user", "content": prompt}] for prompt in prompts], params, use_tqdm=False)
        print(rep, sum(len(o.outputs[0].token_ids) for o in done), f"tokens in {time.perf_counter() - started:.1f} s")
    del llm
    if args.plugin == "none":
        return
    from batch_drafts import PATTERNS

    data = np.loadtxt(out)
    data = data[data[:, 2] == args.rows]  # steps with the whole batch
    head = "pattern (requests x tokens)" if args.plugin == "mixed" else "scored tokens"
    print(f"| {head} | steps | median ms | mean ms |\n|---|---:|---:|---:|")
    for key in sorted(set(data[:, 0].astype(int))):
        s = data[data[:, 0] == key, 1] * 1e3
        name = PATTERNS[key] if args.plugin == "mixed" else key + args.rows
        print(f"| {name} | {len(s)} | {np.median(s):.1f} | {s.mean():.1f} |")


if __name__ == "__main__":
    main()
