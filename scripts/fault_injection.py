"""Fault injection: faults a plugin or its files can suffer while `freespec serve` is under load.

Each scenario starts a server on 127.0.0.1 (SmolLM2, float32, k=4), asks a fixed greedy probe alone, runs a
mixed load (``integration_tests/mixed_load.py``, concurrency 4) for ``--phase-seconds``, injects the fault,
keeps the load on, and where the fault can be undone undoes it. Reported per scenario: requests sent /
served / cancelled by the client / failed while the fault was on and after; whether the probe's text (asked
alone, during the fault and after) is the text from before; draft counts (vLLM's
``spec_decode_num_drafts``) before, during and after; and the time to recover: from the fault's end (or,
for faults that stay, from the injection) until drafting resumed (the counter rose again; for the
read-only matrix directory: until the matrix file was written again).

Scenarios (``--scenarios``, default all):

- ``raises``: a proposer raising in 10% of steps (``integration_tests.faulty:FaultInjector``);
- ``overruns``: a proposer sleeping 300 ms a step, past ``step_budget_ms: 100`` (the circuit breaker);
- ``datastore``: ``retrieval``'s datastore files overwritten in place (``cp`` over them), read into memory
  at start (the default); ``datastore-mapped``: the same with ``in_memory_mb: 0`` (memory-mapped);
- ``matrix-read-only``: ``recycle``'s matrix directory made read-only (``save_every_s: 2``), then writable;
- ``pearl-killed``: ``pearl``'s draft process (SmolLM2 drafting for itself) killed with SIGKILL.

    .venv/bin/python scripts/fault_injection.py --out bench_results/faults
    .venv/bin/python scripts/fault_injection.py --dry-run   # the plan and the configs, without vLLM
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # integration_tests: the server helper, the load, the faulty proposers

from integration_tests.faulty import read_only_dir
from integration_tests.mixed_load import PROBE_PROMPT, MixedLoad, first_difference, probe, summarize

K = 4
FAULTY = "integration_tests.faulty:FaultInjector"


@dataclass
class Run:
    """One scenario's server and what the scenario keeps between its steps."""

    work: Path
    model: str
    server: object = None
    state: dict = field(default_factory=dict)


@dataclass
class Scenario:
    name: str
    what: str
    spec: Callable[[Run], dict]
    inject: Callable[[Run], None]
    heal: Callable[[Run], None] | None = None
    # Recovered, given the draft counter at the last poll and now (default: it rose).
    recovered: Callable[[Run, float, float], bool] = lambda run, before, now: now > before


# ---------------------------------------------------------------- the faults
def fault_file(run: Run) -> Path:
    return run.work / "fault-on"


def switch_on(run: Run) -> None:
    fault_file(run).touch()


def switch_off(run: Run) -> None:
    fault_file(run).unlink()


def build_store(run: Run, name: str, texts: list[str]) -> Path:
    corpus = run.work / f"{name}.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = run.work / name
    freespec = str(Path(sys.executable).with_name("freespec"))
    subprocess.run([freespec, "datastore", "build", "--tokenizer", run.model, "--input", str(corpus),
                    "--out", str(out)], check=True, capture_output=True)
    return out


def datastore_spec(run: Run, in_memory_mb: int | None) -> dict:
    """A datastore holding the probe's code (drafts get accepted), and a smaller one to copy over it."""
    code = PROBE_PROMPT.split("\n\n", 1)[1]
    run.state["store"] = build_store(run, "store", [code.replace("total", "column_sum"), code] * 4)
    run.state["other"] = build_store(run, "other", ["Another text entirely, of another length."])
    extra = {} if in_memory_mb is None else {"in_memory_mb": in_memory_mb}
    return {"plugin": "retrieval", "num_speculative_tokens": K, "datastore": str(run.state["store"]), **extra}


def overwrite_store(run: Run) -> None:
    """``cp`` the other datastore's files over the served one's: same paths, same inodes, other sizes."""
    for path in sorted(run.state["store"].iterdir()):
        if path.suffix in (".tokens", ".sa"):
            shutil.copyfile(run.state["other"] / path.name, path)


def matrix_spec(run: Run) -> dict:
    run.state["dir"] = run.work / "matrices"
    run.state["dir"].mkdir()
    return {"plugin": "recycle", "num_speculative_tokens": K, "matrix_path": str(run.state["dir"] / "matrix.npz"),
            "save_every_s": 2}


def make_read_only(run: Run) -> None:
    run.state["stack"] = contextlib.ExitStack()
    run.state["stack"].enter_context(read_only_dir(run.state["dir"]))


def make_writable(run: Run) -> None:
    run.state["stack"].close()
    run.state["healed_at"] = time.time()


def matrix_written(run: Run, before: float, now: float) -> bool:
    path = run.state["dir"] / "matrix.npz"
    return path.exists() and path.stat().st_mtime > run.state["healed_at"]


def draft_processes(run: Run) -> list[psutil.Process]:
    """pearl's draft children (``python -m ...pearl...``) among the server's processes."""
    found = []
    for p in psutil.Process(run.server.proc.pid).children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.NoSuchProcess:
            continue
        if any(a == "-m" and i + 1 < len(cmd) and "pearl" in cmd[i + 1] for i, a in enumerate(cmd)):
            found.append(p)
    return found


def kill_draft(run: Run) -> None:
    victims = draft_processes(run)
    if not victims:
        raise RuntimeError("no pearl draft process found under the server")
    run.state["killed"] = {p.pid for p in victims}
    for p in victims:
        p.send_signal(signal.SIGKILL)


def new_draft_drafts(run: Run, before: float, now: float) -> bool:
    return now > before and any(p.pid not in run.state["killed"] for p in draft_processes(run))


SCENARIOS = [
    Scenario("raises", "a proposer that raises in 10% of steps",
             lambda run: {"plugin": FAULTY, "num_speculative_tokens": K, "fault_file": str(fault_file(run)),
                          "raise_rate": 0.1},
             switch_on, switch_off),
    Scenario("overruns", "a proposer that sleeps 300 ms a step, past `step_budget_ms: 100`",
             lambda run: {"plugin": FAULTY, "num_speculative_tokens": K, "fault_file": str(fault_file(run)),
                          "sleep_ms": 300, "step_budget_ms": 100},
             switch_on, switch_off),
    Scenario("datastore", "`retrieval`'s datastore files overwritten in place (`cp`), read into memory (default)",
             lambda run: datastore_spec(run, None), overwrite_store),
    Scenario("datastore-mapped", "the same, memory-mapped (`in_memory_mb: 0`)",
             lambda run: datastore_spec(run, 0), overwrite_store),
    Scenario("matrix-read-only", "`recycle`'s matrix directory read-only, then writable (`save_every_s: 2`)",
             matrix_spec, make_read_only, make_writable, matrix_written),
    Scenario("pearl-killed", "`pearl`'s draft process killed (SIGKILL)",
             lambda run: {"plugin": "pearl", "num_speculative_tokens": K, "draft_model": run.model,
                          "sync_feed_tokens": 4096},
             kill_draft, None, new_draft_drafts),
]


# ---------------------------------------------------------------- running a scenario
def drafts(run: Run) -> float:
    from freespec.bench.prometheus import SPEC_COUNTERS
    from integration_tests.serving import metric

    return metric(run.server, SPEC_COUNTERS["num_drafts"])


def alone(load: MixedLoad, run: Run) -> str:
    """The probe asked with no other request in flight (the same batch shape each time)."""
    load.pause()
    try:
        return probe(run.server.base_url, run.model)
    finally:
        load.resume()


SUSTAINED_POLLS = 3  # recovered only when it holds this many polls in a row (a late step is not a recovery)


def wait_recovery(scenario: Scenario, run: Run, since: float, timeout: float) -> float | None:
    """Seconds from ``since`` until ``scenario.recovered`` first held for ``SUSTAINED_POLLS`` polls in a row,
    polled every 0.5 s (None: not within ``timeout``). A single count after a fault can be a step that was
    already under way (pearl: a chain computed before the kill; a new draft process exists before it has loaded)."""
    before = drafts(run)
    streak, first = 0, None
    while time.monotonic() - since < timeout:
        time.sleep(0.5)
        now = drafts(run)
        if scenario.recovered(run, before, now):
            streak += 1
            first = first if first is not None else time.monotonic() - since
            if streak >= SUSTAINED_POLLS:
                return first
        else:
            streak, first = 0, None
        before = now
    return None


def run_scenario(scenario: Scenario, model: str, out: Path, phase_s: float, prompts: list[str], memory: float) -> dict:
    from integration_tests.serving import start_server

    work = out / scenario.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run = Run(work, model)
    spec = scenario.spec(run)
    print(f"[{scenario.name}] {json.dumps(spec)}", flush=True)
    try:
        run.server = start_server(model, spec, out / f"{scenario.name}.log", memory)
    except Exception as e:  # noqa: BLE001 - reported; the other scenarios still run
        print(f"[{scenario.name}] the server did not start: {e}"[:2000], flush=True)
        return {"scenario": scenario.name, "what": scenario.what, "spec": spec, "alive": False,
                "error": f"the server did not start: {str(e).splitlines()[0]}"}
    load = MixedLoad(run.server.base_url, model, prompts, max_concurrency=4, max_tokens=(16, 64),
                     seed=len(scenario.name))
    result: dict = {"scenario": scenario.name, "what": scenario.what, "spec": spec}
    try:
        probes = {"before": probe(run.server.base_url, model)}
        load.level = 4
        load.start()
        time.sleep(phase_s)
        d0 = drafts(run)
        t_fault = time.monotonic()
        scenario.inject(run)
        print(f"[{scenario.name}] fault injected", flush=True)
        timeout = max(120.0, 4 * phase_s)
        if scenario.heal is None:  # the fault stays: recovery counts from the injection
            recovery = wait_recovery(scenario, run, t_fault, timeout)
            time.sleep(max(0.0, t_fault + phase_s - time.monotonic()))
            d1 = drafts(run)
            probes["during"] = alone(load, run)
        else:
            time.sleep(phase_s)
            d1 = drafts(run)
            probes["during"] = alone(load, run)
            scenario.heal(run)
            print(f"[{scenario.name}] fault removed", flush=True)
            recovery = wait_recovery(scenario, run, time.monotonic(), timeout)
        time.sleep(phase_s / 2)
        probes["after"] = alone(load, run)
        d2 = drafts(run)
        load.stop()
        alive = run.server.proc is not None and run.server.proc.poll() is None
        result.update(
            requests_before=summarize([r for r in load.records if r.started < t_fault]),
            requests_from_fault=summarize(load.since(t_fault)),
            probes=probes,
            probes_unchanged={k: v == probes["before"] for k, v in probes.items()},
            probe_first_difference={k: first_difference(probes["before"], v) for k, v in probes.items()},
            drafts={"before": d0, "during": d1 - d0, "after": d2 - d1},
            recovery_s=recovery, recovery_from="fault removed" if scenario.heal else "fault injected",
            alive=alive,
        )
    except Exception as e:  # noqa: BLE001 - the scenario's failure is its result; the others still run
        result["error"] = f"{type(e).__name__}: {e}"
        result["alive"] = run.server.proc is not None and run.server.proc.poll() is None
    finally:
        load.stop(timeout=30)
        if "stack" in run.state:
            run.state["stack"].close()
        run.server.stop()
    result["log_warnings"] = warnings_of(out / f"{scenario.name}.log")
    print(f"[{scenario.name}] {row(result)}", flush=True)
    return result


def warnings_of(log: Path, limit: int = 5) -> list[str]:
    """freespec's first warning lines in the server log (distinct)."""
    seen: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if "WARNING" in line and "freespec" in line:
            text = line.split("freespec", 1)[1][:240]
            if text not in seen:
                seen.append(text)
        if len(seen) >= limit:
            break
    return seen


def row(r: dict) -> str:
    if "error" in r:
        return f"| {r['scenario']} | {r['what']} | scenario failed: `{r['error']}` | | | | {r['alive']} |"
    q = r["requests_from_fault"]
    ok = q["served"] + q["cancelled"]
    probes = ", ".join(f"{k} {'=' if v else '≠'}" for k, v in r["probes_unchanged"].items() if k != "before")
    rec = "not within the wait" if r["recovery_s"] is None else f"{r['recovery_s']:.1f} s"
    d = r["drafts"]
    return (f"| {r['scenario']} | {r['what']} | {ok}/{q['sent']} ({q['cancelled']} cancelled by the client), "
            f"{q['failed']} failed | {probes} | {d['before']:.0f} / {d['during']:.0f} / {d['after']:.0f} | "
            f"{rec} (from {r['recovery_from']}) | {r['alive']} |")


def render_markdown(results: list[dict], command: str) -> str:
    lines = [
        f"`{command}`", "",
        ("| scenario | fault | requests from the fault on: served/sent | greedy probe vs before | "
        "drafts before / during / after | time to recover | server alive |"),
        "|---|---|---|---|---|---|---|",
    ]
    return "\n".join(lines + [row(r) for r in results]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [s.name for s in SCENARIOS]
    p.add_argument("--scenarios", nargs="+", choices=names, default=names)
    p.add_argument("--phase-seconds", type=float, default=30.0, help="load before the fault, with it, after it")
    p.add_argument("--model", default=None, help="model directory (default: the prepared SmolLM2 test model)")
    p.add_argument("--questions", default=None, help="prompt file (default: as `freespec bench` finds them)")
    p.add_argument("--memory", type=float, default=0.1, help="--gpu-memory-utilization (on a CPU build: the share of "
                   "RAM reserved for the KV cache)")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="the servers' KV cache (vLLM's VLLM_CPU_KVCACHE_SPACE on a "
                   "CPU build: a fixed size instead of a share of RAM that must be free at start)")
    p.add_argument("--out", default="bench_results/faults")
    p.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    args = p.parse_args(argv)
    from freespec.questions import resolve_questions

    prompts = [q.prompt for q in resolve_questions(args.questions).questions]
    chosen = [s for s in SCENARIOS if s.name in args.scenarios]
    out = Path(args.out)
    if args.dry_run:
        for s in chosen:
            print(f"{s.name}: {s.what}; heal: {s.heal.__name__ if s.heal else 'none (the fault stays)'}")
        print(f"{len(prompts)} prompts; phases of {args.phase_seconds:g} s; writes {out / 'fault_injection.json'}")
        return 0
    from freespec.model_store import prepare_model

    model = args.model or str(prepare_model())
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    out.mkdir(parents=True, exist_ok=True)
    # The server's processes import the faulty proposers from this checkout: only integration_tests goes on
    # their path (the checkout's root would put its top-level `kernels` folder over the `kernels` package
    # transformers imports, and vLLM's workers then fail at start).
    path_dir = out / "pythonpath"
    path_dir.mkdir(exist_ok=True)
    if not (path_dir / "integration_tests").exists():
        (path_dir / "integration_tests").symlink_to(REPO / "integration_tests")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path_dir), os.environ.get("PYTHONPATH")]))
    results = [run_scenario(s, model, out, args.phase_seconds, prompts, args.memory) for s in chosen]
    command = "python scripts/fault_injection.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "fault_injection.json").write_text(json.dumps({"command": command, "results": results}, indent=1))
    (out / "fault_injection.md").write_text(render_markdown(results, command))
    print(render_markdown(results, command))
    bad = [r["scenario"] for r in results if "error" in r or not r["alive"]
           or r["requests_from_fault"]["failed"] or not all(r["probes_unchanged"].values())]
    if bad:
        print(f"not as expected: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
