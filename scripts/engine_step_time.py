"""Where an engine step's time goes, config against config: the target's forward, vLLM's sampling, the drafter's
call and the time between steps, over the same multi-turn work, each config in processes of its own, alternated.

Two configs that draft the same tokens (vLLM ``suffix``, and ``hybrid`` set to draft as it does) take the same
steps; what differs between them is then the path's own cost, and what differs between two processes of one
config is this machine's spread. Each process runs an engine in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
with the diagnosis patch ``step_times`` (``freespec.vllm_plugins.step_timer``), one request at a time; the
first session is a warm-up and not counted. Raw steps go to ``--out`` (one JSON file a process); the tables are
printed (results/issue69-zen3).

    python scripts/engine_step_time.py --configs suffix 'hybrid:{"sources":["suffix"]}' --repeats 3 --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

K = 8


def summary(run: dict, k: int = K) -> dict:
    """One process's figures: its wall time, steps, and the mean milliseconds of each part of a decode step
    (one request, at most ``k + 1`` tokens scored: no prefill)."""
    steps = run["steps"]
    decode = [s for s in steps if s["requests"] == 1 and s["tokens"] <= k + 1]
    gaps = [b["start"] - a["end"] for a, b in zip(steps, steps[1:]) if b["start"] - a["end"] < 1.0]

    def ms(values) -> float:
        values = list(values)
        return 1e3 * statistics.mean(values) if values else 0.0

    return {"label": run["label"], "round": run["round"], "wall_s": run["wall_s"], "steps": len(steps),
            "forward_ms": ms(s["forward_s"] for s in decode), "sampling_ms": ms(s["sample_s"] - s["draft_s"] for s in decode),
            "draft_ms": ms(s["draft_s"] for s in decode), "between_ms": ms(gaps)}


def tables(runs: list[dict], k: int = K) -> str:
    """Markdown: one row a process, then each config's mean and range; whether each took the first process's
    steps and gave its text."""
    first = runs[0]
    rows = ["| config | round | wall s | steps | same steps, text | forward ms | sampling ms | drafter ms | between ms "
            "| resident MB, in huge pages (anonymous, file) |", "|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    by: dict[str, list[dict]] = {}
    for run in runs:
        s = summary(run, k)
        by.setdefault(s["label"], []).append(s)
        same = [x["tokens"] for x in run["steps"]] == [x["tokens"] for x in first["steps"]]
        rows.append(f"| {s['label']} | {s['round']} | {s['wall_s']:.2f} | {s['steps']} | "
                    f"{'yes' if same else 'no'}, {'yes' if run['texts'] == first['texts'] else 'no'} | "
                    f"{s['forward_ms']:.2f} | {s['sampling_ms']:.2f} | {s['draft_ms']:.3f} | {s['between_ms']:.2f} | "
                    f"{_memory(run.get('memory_kb') or {})} |")
    rows += ["", "| config | processes | wall s, mean (min to max) | forward ms, mean (min to max) | drafter ms |",
             "|---|---:|---|---|---:|"]
    for label, ss in by.items():
        walls, fwd = [s["wall_s"] for s in ss], [s["forward_ms"] for s in ss]
        rows.append(f"| {label} | {len(ss)} | {statistics.mean(walls):.2f} ({min(walls):.2f} to {max(walls):.2f}) | "
                    f"{statistics.mean(fwd):.2f} ({min(fwd):.2f} to {max(fwd):.2f}) | "
                    f"{statistics.mean(s['draft_ms'] for s in ss):.3f} |")
    return "\n".join(rows)


def memory_kb(path: str = "/proc/self/smaps_rollup") -> dict[str, int]:
    """This process's resident memory and how much of it is mapped in huge pages (Linux; empty elsewhere):
    a forward's speed can depend on it."""
    keys = ("Rss", "AnonHugePages", "FilePmdMapped")
    try:
        with open(path, encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f.read(65536).splitlines() if ":" in line)
    except OSError:
        return {}
    return {k: int(fields[k].split()[0]) for k in keys if k in fields}


def _memory(kb: dict[str, int]) -> str:
    if "Rss" not in kb:
        return "not read"
    return (f"{kb['Rss'] // 1024:,} ({kb.get('AnonHugePages', 0) // 1024:,}, "
            f"{kb.get('FilePmdMapped', 0) // 1024:,})")


def child(a) -> int:
    """One process: one config's engine, the work, its steps written to ``a.child_out``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, where the timer is
    from vllm import LLM, SamplingParams

    from freespec.bench.configs import parse_config_spec
    from freespec.bench.workloads import build_workloads, workload_names
    from freespec.bench.workloads.session import run_session
    from freespec.model_store import model_dir
    from freespec.vllm_plugins.step_timer import StepTimes

    config = parse_config_spec(a.configs[a.child], a.k)
    os.environ.update(config.env)
    timer = StepTimes()
    timer.install()
    llm = LLM(model=a.model or str(model_dir("smollm2-135m-instruct")), dtype=a.dtype, max_model_len=a.max_model_len,
              seed=0, speculative_config=config.speculative_config)
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0)
    sessions = [s for w in build_workloads(workload_names(a.workload), a.sessions, a.turns, a.source_chars, 6000) for s in w.sessions]

    def send(messages):
        out = llm.chat([messages], params, use_tqdm=False)[0].outputs[0]
        return {"output": out.text}

    run_session(sessions[0], send)  # warm-up, not counted
    timer.steps.clear()
    start = time.perf_counter()
    texts = [r["output"] for s in sessions for r in run_session(s, send)]
    wall = time.perf_counter() - start
    run = {"label": config.label, "round": a.child_round, "wall_s": wall, "texts": texts,
           "steps": [vars(s) for s in timer.steps], "memory_kb": memory_kb()}
    Path(a.child_out).write_text(json.dumps(run), encoding="utf-8")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", required=True, help="freespec bench --configs entries (none, suffix, "
                    "'hybrid:{...}')")
    ap.add_argument("--repeats", type=int, default=3, help="processes a config, alternated (default 3)")
    ap.add_argument("--out", required=True, help="a folder for each process's steps (JSON)")
    ap.add_argument("--model", help="the target (default: the SmolLM2 test fixture)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--workload", nargs="+", default=["code-edit", "tool-loop"])
    ap.add_argument("--sessions", type=int, default=2, help="sessions a workload (default 2)")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--source-chars", type=int, default=3000)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("-k", type=int, default=K, help="num_speculative_tokens (default 8)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-round", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        return child(a)
    from freespec.bench.configs import parse_config_list
    from freespec.bench.workloads import workload_names

    parse_config_list(a.configs, a.k)  # a bad entry fails here, not in the first child
    workload_names(a.workload)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    plan = [(r, i) for r in range(1, a.repeats + 1) for i in range(len(a.configs))]
    for n, (r, i) in enumerate(plan, 1):
        path = out / f"run{r}-config{i}.json"
        print(f"[{n}/{len(plan)}] {a.configs[i]}, round {r}", file=sys.stderr, flush=True)
        with open(out / f"run{r}-config{i}.log", "w", encoding="utf-8") as log:
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", str(i), "--child-round", str(r),
                            "--child-out", str(path)], stdout=log, stderr=subprocess.STDOUT, check=True)
        runs.append(json.loads(path.read_text(encoding="utf-8")))
    print(tables(runs, a.k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
