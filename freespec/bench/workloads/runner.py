"""``freespec bench --workload ...``: the workload suite measured on every config, a table per workload.

Per config (and per concurrency level, or once with ``--reuse-server``) one server: a warm-up, then each
workload's sessions, at most ``concurrency`` sessions in flight, each session turn after turn (a block per
workload; its counters read before and after). Then the *repeated traffic* passes, the same sessions again:
``same`` on the same server, ``restart`` after stopping and starting it again (what a persisted datastore
keeps), ``replica`` on a second server of the same config started beside the first (what a learning shared
between replicas gives), ``tenant`` on the same server right after the first pass but with another
``cache_salt`` (what one tenant's traffic gives another; the other passes then carry the first tenant's), and
``cold-tenant``, the tenant row's reference: the same sessions from a third tenant on a second, fresh
server that first served as many sessions of other material as the first tenant (what another tenant gets
from a server as busy, had the first tenant never asked these; a third salt, since the second tenant's
scope may already be in a shared state directory).
A server that dies is the config's failure, reported as a row of its own; the run goes on with the other
configs.
"""
from __future__ import annotations

import datetime as _dt
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from freespec.bench.client import chat_request
from freespec.bench.configs import BASELINE, parse_config_list
from freespec.bench.errors import BenchError
from freespec.bench.options import BenchOptions
from freespec.bench.plots import draw_charts
from freespec.bench.prometheus import counter_delta, source_delta
from freespec.bench.report import (
    LATENCY_HEADER,
    failure_rows,
    render_latency_markdown,
    results_header,
    state_backends,
)
from freespec.bench.selection import select_warmup_prompts
from freespec.bench.server import (
    RunningServer,
    Server,
    free_port,
    interleaved_options,
    raise_if_died,
    server_command,
)
from freespec.bench.serving import (
    SERVER_ERRORS,
    RunState,
    collect_versions,
    config_info,
    finish_server,
    open_server,
    record_failure,
    round_order,
    save_results,
    select_targets,
    slug,
    start_server,
    warm_up,
    write_json,
)
from freespec.bench.state_dirs import fresh_state, redacted_command
from freespec.bench.stats import aggregate
from freespec.bench.workloads import build_workloads
from freespec.bench.workloads.report import render_workload_tables
from freespec.bench.workloads.report import pass_category
from freespec.bench.workloads.sequencing import run_sessions
from freespec.bench.workloads.session import Workload
from freespec.machine import cpu_advice, describe_machine, machine_summary

REPEAT_MODES = ("same", "restart", "replica", "tenant", "cold-tenant")
SAME_SERVER_MODES = ("same", "tenant")  # the modes --base-url can run: they start no server
SECOND_SERVER_MODES = ("replica", "cold-tenant")  # a second server of the config is up beside the first
TENANT_MODES = ("tenant", "cold-tenant")  # sent as another tenant than the other passes
# The two tenants' cache_salt: only sent when a tenant mode is among the modes, so runs without one send the
# requests they always did and stay comparable with earlier results.
TENANT_SALT = "bench-tenant-a"
OTHER_TENANT_SALT = "bench-tenant-b"
COLD_TENANT_SALT = "bench-tenant-c"
CHARS_PER_TOKEN = 3.0  # a rough estimate, for the context-length note only


def check_options(options: BenchOptions) -> None:
    """BenchError for options the workload suite does not take."""
    unknown = [m for m in options.repeat_traffic if m not in REPEAT_MODES]
    if unknown:
        raise BenchError(f"--repeat-traffic: unknown mode {', '.join(unknown)}; choose from {', '.join(REPEAT_MODES)}")
    if options.base_url and set(options.repeat_traffic) - set(SAME_SERVER_MODES):
        raise BenchError("--repeat-traffic restart/replica/cold-tenant start servers; with --base-url only "
                         "'same' and 'tenant' are possible")
    if options.interleave:
        raise BenchError("--interleave is for Spec-Bench's questions; workloads run config after config")
    if options.repeats > 1:
        raise BenchError("--repeats is for Spec-Bench's questions; with workloads use --repeat-traffic same "
                         "(the sessions again on the same server) or --rounds")


def pass_order(modes: list[str]) -> list[str]:
    """The repeated passes in the order they run: ``tenant`` first, right after the first pass on the same
    server (another tenant asks what one tenant was just answered, before a restart or a replica can change
    what the server holds), then the others as given, ``cold-tenant`` last (its other material, learned into
    a shared state directory, then reaches no later pass)."""
    last = ("tenant", "cold-tenant")
    return ([m for m in modes if m == "tenant"] + [m for m in modes if m not in last]
            + [m for m in modes if m == "cold-tenant"])


def cache_salt(mode: str | None, modes: list[str]) -> str | None:
    """The ``cache_salt`` of every request of a pass (``mode`` None: the first pass): None unless a tenant
    mode is among ``modes``; then ``tenant`` is the second tenant, ``cold-tenant`` a third, and every other
    pass (the cold-tenant server's other material too) the first. The warm-up sends none, so it teaches no
    tenant."""
    if not set(TENANT_MODES) & set(modes):
        return None
    return {"tenant": OTHER_TENANT_SALT, "cold-tenant": COLD_TENANT_SALT}.get(mode or "", TENANT_SALT)


def context_estimate(workload: Workload, max_tokens: int, source_chars: int) -> int:
    """A rough upper estimate of a session's last context in tokens (all user turns, all answers at
    ``max_tokens``, a tool loop's file read into every result)."""
    most = 0
    for s in workload.sessions:
        turns = s.max_turns or len(s.turns)
        chars = len(s.system or "") + sum(len(t) for t in s.turns)
        if s.respond is not None:
            chars += (turns - 1) * source_chars
        most = max(most, int(chars / CHARS_PER_TOKEN) + turns * max_tokens)
    return most


def _log(message: str) -> None:
    print(f"freespec bench: {message}", flush=True)


def measure_workload(server: Server | RunningServer, label: str, model: str, concurrency: int, workload: Workload,
                     mode: str | None, sample: dict[str, int], options: BenchOptions, state: Any,
                     progress=None) -> None:
    """One pass of ``workload``'s sessions on ``server``: its turns and counters recorded in ``state``."""
    category = pass_category(workload.name, mode)
    salt = cache_salt(mode, options.repeat_traffic)
    before, sources_before = server.counters()
    records, wall = run_sessions(
        workload.sessions, concurrency,
        lambda messages: chat_request(server.base_url, model, messages, options, salt), progress)
    raise_if_died(server, records, f"{category} workload")
    after, sources_after = server.counters()
    for record in records:
        state.requests.append({"config": label, "concurrency": concurrency, "category": category,
                               "workload": workload.name, "pass": mode or "first", **sample,
                               **({"cache_salt": salt} if salt is not None else {}), **record})
    state.blocks.append({"config": label, "concurrency": concurrency, "category": category, **sample,
                         "wall_s": wall, "spec_before": before, "spec_after": after,
                         "spec": counter_delta(before, after), "sources": source_delta(sources_before, sources_after)})
    errors = [r for r in records if r.get("error")]
    if errors:
        print(f"[{label}] {category} c={concurrency}: {len(errors)} turn(s) failed, first: {errors[0]['error']}",
              file=sys.stderr, flush=True)


def _serve_other_material(server, target, concurrency: int, others: list[Workload], options: BenchOptions) -> None:
    """The cold-tenant server's first traffic, unmeasured: as many sessions of other material as the first
    pass had, sent as the first tenant, so that its server is as busy as the tenant pass's."""
    salt = cache_salt(None, options.repeat_traffic)
    print(f"[{target.config.label}] cold-tenant: serving other sessions as the first tenant", flush=True)
    for workload in others:
        records, _ = run_sessions(workload.sessions, concurrency,
                                  lambda messages: chat_request(server.base_url, target.model, messages, options,
                                                                salt))
        raise_if_died(server, records, f"{workload.name} other material")


def other_material(names: list[str], options: BenchOptions, measured: list[Workload]) -> list[Workload]:
    """For ``cold-tenant``: as many sessions as each measured workload has, on other material (the next
    files, documents or conversations), the same shape of turns."""
    both = build_workloads(names, 2 * options.sessions, options.turns, options.source_chars,
                           options.context_chars, options.chat_data)
    sizes = {w.name: len(w.sessions) for w in measured}
    return [Workload(w.name, w.description, w.sessions[sizes[w.name]:]) for w in both if w.name in sizes]


def _passes(server, target, levels, workloads, mode, options, state, round_index) -> None:
    from tqdm import tqdm

    turns = sum(w.turn_count() for w in workloads)
    for concurrency in levels:
        desc = f"{target.config.label} c={concurrency}" + (f" {mode}" if mode else "") + (
            f" round {round_index + 1}" if options.rounds > 1 else "")
        with tqdm(total=turns, desc=desc, unit="turn", leave=True) as bar:
            for workload in workloads:
                bar.set_postfix_str(workload.name)
                measure_workload(server, target.config.label, target.model, concurrency, workload, mode,
                                 {"round": round_index, "repeat": 0}, options, state, bar.update)


def bench_workload_config(target, workloads: list[Workload], warmup: list[str], options: BenchOptions, out: Path,
                          state, round_index: int = 0, cpu: bool = False,
                          others: list[Workload] | None = None) -> dict[str, Any]:
    """Serve one config and run every workload on it, then the repeated-traffic passes; the config's entry.
    ``others``: the cold-tenant server's other material (``other_material``)."""
    info = config_info(target, options, round_index, state)
    levels = list(options.concurrency)
    groups = [levels] if options.reuse_server or target.base_url else [[c] for c in levels]
    base_target = target
    for group in groups:
        target = fresh_state(base_target, group, round_index, state.started_at)
        server, server_info = open_server(target, group, options, out, cpu, info)
        replicas: list[Server] = []
        current = server
        try:
            start_server(server, target, group, options, server_info)
            warm_up(server, target, warmup, max(group), options, server_info)
            _passes(server, target, group, workloads, None, options, state, round_index)
            for mode in pass_order(options.repeat_traffic):
                current = server
                if mode == "restart" and isinstance(server, Server):
                    print(f"[{target.config.label}] restarting the server for the repeated pass", flush=True)
                    server.stop()
                    server.start()
                    server_info.setdefault("restart_s", []).append(server.wait_healthy(options.server_timeout))
                    warm_up(server, target, warmup, max(group), options, {})
                elif mode in SECOND_SERVER_MODES:
                    for earlier in replicas:  # at most two servers up: each was given half the memory share
                        earlier.stop()
                    current = _start_replica(target, group, options, out, cpu, info, mode)
                    replicas.append(current)
                    warm_up(current, target, warmup, max(group), options, {})
                    if mode == "cold-tenant":
                        _serve_other_material(current, target, max(group), others or [], options)
                _passes(current, target, group, workloads, mode, options, state, round_index)
            finish_server(server, target, server_info)
        except SERVER_ERRORS as exc:
            record_failure(current, target, group, exc, info, server_info)
        except KeyboardInterrupt:
            server_info["status"] = info["status"] = "interrupted"
            raise
        finally:
            for s in [server, *replicas]:
                if isinstance(s, Server):
                    s.stop()
    return info


def _start_replica(target, group: list[int], options: BenchOptions, out: Path, cpu: bool,
                   info: dict[str, Any], role: str = "replica") -> Server:
    """A second server of the same config beside the first (its own port and log), started; ``role``:
    ``replica`` or ``cold-tenant``."""
    port = free_port()
    log_path = out / f"server_{slug(target.config.label)}_{slug(role)}.log"
    cmd = server_command(target.model, port, target.config, options, cpu)
    replica = Server(cmd, port, log_path)
    replica_info: dict[str, Any] = {"command": redacted_command(cmd), "concurrency": group, "log": log_path.name,
                                    "role": role}
    info["servers"].append(replica_info)
    print(f"[{target.config.label}] starting a {role} server; log: {log_path}", flush=True)
    replica.start()
    try:
        replica_info["startup_s"] = replica.wait_healthy(options.server_timeout)
    except BenchError:
        replica.stop()
        raise
    replica_info["status"] = "ok"
    return replica


def run_workloads(options: BenchOptions, argv: list[str], names: list[str], cpu: bool) -> int:
    """The workload suite's run; the exit code as ``freespec.bench.run.run``'s."""
    t0 = time.monotonic()
    try:
        check_options(options)
        configs = [] if options.base_url else parse_config_list(options.configs, options.num_speculative_tokens)
        workloads = build_workloads(names, options.sessions, options.turns, options.source_chars,
                                    options.context_chars, options.chat_data)
        for w in workloads:
            if w.skipped:
                _log(f"workload {w.name} skipped: {w.skipped}")
        measured = [w for w in workloads if w.sessions]
        if not measured:
            raise BenchError("no workload could be built on this machine")
        others = other_material(names, options, measured) if "cold-tenant" in options.repeat_traffic else []
        targets, skipped = select_targets(options, configs)
    except BenchError as exc:
        print(f"freespec bench: {exc}", file=sys.stderr)
        return 2
    for w in measured:
        estimate = context_estimate(w, options.max_tokens, options.source_chars)
        if estimate > options.max_model_len:
            _log(f"note: a {w.name} session may reach about {estimate} tokens, past --max-model-len "
                 f"{options.max_model_len}; its later turns then fail (lower --turns, --source-chars or "
                 "--context-chars, or raise --max-model-len)")
    model = targets[0].model if targets else (options.model or "")
    if set(SECOND_SERVER_MODES) & set(options.repeat_traffic) and not options.base_url:
        # Two servers of a config are up at once: each gets half the memory share, as --interleave gives them.
        options, shortfall = interleaved_options(options, 2, cpu, model)
        if shortfall:
            _log(f"note: {shortfall}")
    warmup = select_warmup_prompts([], [], options.warmup)
    out = Path(options.out or Path("bench_results") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    settings = asdict(options)
    settings.update(model=model, baseline=BASELINE, warmup_prompts=warmup,
                    workloads=[{"name": w.name, "description": w.description, "skipped": w.skipped,
                                "sessions": [s.session_id for s in w.sessions]} for w in workloads])
    state = RunState(
        started_at=_dt.datetime.now().isoformat(timespec="seconds"),
        command=shlex.join([os.path.basename(argv[0]) if argv else "freespec", *argv[1:]]),
        argv=argv, settings=settings, versions=collect_versions(),
        machine={} if options.base_url else describe_machine())
    state.configs.extend(skipped)
    sessions = sum(len(w.sessions) for w in measured)
    _log(f"workloads {', '.join(w.name for w in measured)}: {sessions} sessions, concurrency "
         f"{' '.join(map(str, options.concurrency))}"
         + (f", repeated traffic {' '.join(pass_order(options.repeat_traffic))}" if options.repeat_traffic else "")
         + f", configs {', '.join(t.config.label for t in targets)}; results in {out}")
    for advice in cpu_advice(state.machine, ngram=any(t.config.method == "ngram" for t in targets)):
        _log(f"note: {advice}")
    exit_code = 0
    try:
        for round_index in range(options.rounds):
            for target in round_order(targets, round_index, options.rounds):
                info = bench_workload_config(target, measured, warmup, options, out, state, round_index, cpu,
                                             others)
                save_results(out, state)
                if info["status"] != "ok":
                    exit_code = 1
        state.status = "complete" if exit_code == 0 else "complete with failures"
    except KeyboardInterrupt:
        print("\nfreespec bench: interrupted; writing partial results", file=sys.stderr)
        state.status, exit_code = "interrupted", 130
    finally:
        state.aggregates = aggregate(state.requests, state.blocks)
        state.finished_at = _dt.datetime.now().isoformat(timespec="seconds")
        state.duration_s = time.monotonic() - t0
        write_json(out / "results.json", state)
    _write_report(options, state, workloads, model, sessions, out, machine_summary)
    return exit_code


def _write_report(options: BenchOptions, state, workloads: list[Workload], model: str, sessions: int, out: Path,
                  machine_summary) -> None:
    failures = failure_rows(state.configs)
    tables = render_workload_tables(state.aggregates, workloads, pass_order(options.repeat_traffic), failures,
                                    options.dtype)
    latency = render_latency_markdown(state.aggregates)
    notes = [f"- {c['label']}" + (f" (round {c['round'] + 1})" if "round" in c else "")
             + f": {c['status']}" + (f": {c['note']}" if c.get("note") else "")
             for c in state.configs if c["status"] != "ok"]
    measured = (f"{sessions} session{'' if sessions == 1 else 's'} of the workloads {', '.join(w.name for w in workloads if w.sessions)} "
                f"(up to {options.turns} turns each; a turn is sent once the previous answer has arrived, "
                "with the whole conversation; match compares every turn's text)")
    header = results_header(
        model, options.dtype, options.max_tokens, options.temperature,
        None if options.base_url else options.num_speculative_tokens, sessions, "", 1, options.rounds,
        server=", ".join(options.base_url) if options.base_url else None,
        machine=machine_summary(state.machine) if state.machine else None, measured=measured)
    footer = "\n" + "\n".join(notes) + "\n" if notes else ""
    backends = state_backends(state.configs)
    header += backends
    (out / "results.md").write_text(header + tables + LATENCY_HEADER + latency + footer, encoding="utf-8")
    draw_charts(state.aggregates, out, model, options.dtype)
    print()
    print(backends + tables, end="")
    print("\n" + LATENCY_HEADER.strip().splitlines()[0])
    print(latency, end="")
    for note in notes:
        print(note)
    print(f"\nresults: {out / 'results.json'}, {out / 'results.md'} ({state.duration_s:.0f} s)")

