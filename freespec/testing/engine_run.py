"""Run one offline vLLM engine on a list of jobs and write what it produced as JSON.

Used by ``EngineRuns`` (the kit and the integration tests) as ``python -m freespec.testing.engine_run IN.json OUT.json``:
each engine lives in its own process, so tests see vLLM's worker logs and no
engine outlives its test. IN.json: ``{"model", "dtype", "speculative_config", "engine_args"?,
"jobs": [{"name", "prompts": [chat text], "max_tokens", "temperature", "seeds"?, "logprobs"?}]}``.
Each job's result holds its texts, token ids, top-2 logprobs, spec-decode counters and wall seconds.
"""
from __future__ import annotations

import json
import sys
import time


def main(in_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    spec = json.load(open(in_path))
    llm = LLM(
        model=spec["model"],
        dtype=spec.get("dtype", "float32"),
        speculative_config=spec.get("speculative_config"),
        gpu_memory_utilization=0.3,
        max_model_len=2048,
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
        **spec.get("engine_args", {}),
    )
    results = {}
    for job in spec["jobs"]:
        messages = [[{"role": "user", "content": p}] for p in job["prompts"]]
        seeds = job.get("seeds") or [None] * len(messages)
        params = [
            SamplingParams(
                max_tokens=job["max_tokens"],
                temperature=job.get("temperature", 0.0),
                seed=seed,
                logprobs=job.get("logprobs"),
            )
            for seed in seeds
        ]
        before = spec_counters(llm)
        started = time.perf_counter()
        outputs = llm.chat(messages, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        after = spec_counters(llm)
        results[job["name"]] = {
            "texts": [o.outputs[0].text for o in outputs],
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "top_logprobs": [top2(o.outputs[0].logprobs) for o in outputs],
            "spec": {k: after[k] - before.get(k, 0) for k in after},
            "seconds": seconds,
        }
    json.dump(results, open(out_path, "w"))


def top2(logprobs) -> list[list[float]] | None:
    """The two highest logprobs at each position (the target's top-2, to recognise ties)."""
    if not logprobs:
        return None
    return [sorted((x.logprob for x in pos.values()), reverse=True)[:2] for pos in logprobs]


def spec_counters(llm) -> dict[str, float]:
    counters = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            counters[metric.name] = counters.get(metric.name, 0) + metric.value
    return counters


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
