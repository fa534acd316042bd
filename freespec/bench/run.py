"""One benchmark run: every config served by its own vLLM server subprocess, one at a time, with the same
model and engine settings (or servers already running, ``base_url``); the same prompts go to each in
blocks of one category at one concurrency level, vLLM's ``/metrics`` counters read before and after each
block. Results land in the output folder: ``results.json`` (every request, every block, the aggregates,
the command line, versions), ``results.md`` (the tables that are also printed), ``results.png`` (speed-up
over ``none`` per load) and ``results_tpot.png`` (time per output token against load).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import shlex
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from freespec.bench.client import chat_request, run_requests
from freespec.bench.configs import BASELINE, parse_config_list, split_config_list
from freespec.bench.errors import BenchError
from freespec.bench.options import BenchOptions
from freespec.bench.plots import draw_charts
from freespec.bench.prometheus import counter_delta, source_delta
from freespec.bench.report import (
    LATENCY_HEADER,
    failure_rows,
    SOURCES_HEADER,
    render_latency_markdown,
    render_markdown,
    render_sources_markdown,
    results_header,
    state_backends,
)
from freespec.bench.selection import select_questions_per_level, select_warmup_prompts
from freespec.bench.server import (
    RunningServer,
    Server,
    interleaved_options,
    raise_if_died,
)
from freespec.bench.serving import (
    SERVER_ERRORS,
    RunState,
    Target,
    collect_versions,
    config_info,
    finish_server,
    open_server,
    record_failure,
    round_order,
    save_results,
    select_targets,
    start_server,
    warm_up,
    write_json,
)
from freespec.bench.state_dirs import fresh_state
from freespec.bench.stats import MIXED_CATEGORY, aggregate
from freespec.bench.workloads import workload_names
from freespec.bench.workloads.runner import run_workloads
from freespec.machine import cpu_advice, default_dtype, describe_machine, is_cpu_vllm, machine_summary
from freespec.questions import Question, QuestionsError, resolve_questions


def _blocks(selected: OrderedDict[str, list[Question]], concurrency: int) -> list[tuple[str, list[Question]]]:
    """A level's blocks: at concurrency 1 each category is its own block (exact per-category counters); above
    it all questions are submitted together as one "mixed" block, or a category's few questions would never
    fill the requested concurrency."""
    if concurrency == 1:
        return [(category, qs) for category, qs in selected.items() if qs]
    return [(MIXED_CATEGORY, [q for qs in selected.values() for q in qs])]


def _measure_block(server: Server | RunningServer, target: Target, concurrency: int, category: str,
                   questions: list[Question], sample: dict[str, int], options: BenchOptions, state: RunState,
                   progress) -> None:
    """One block of requests on ``server``, its requests and its counters' change recorded in ``state``."""
    label = target.config.label
    before, sources_before = server.counters()
    results, wall = run_requests([q.prompt for q in questions], concurrency,
                                 lambda prompt: chat_request(server.base_url, target.model, prompt, options), progress)
    raise_if_died(server, results, f"{category} block at concurrency {concurrency}")
    after, sources_after = server.counters()
    for q, result in zip(questions, results):
        state.requests.append({"config": label, "concurrency": concurrency, "category": category,
                               "question_id": q.question_id, **sample, **result})
    state.blocks.append({"config": label, "concurrency": concurrency, "category": category, **sample,
                         "wall_s": wall, "spec_before": before, "spec_after": after,
                         "spec": counter_delta(before, after), "sources": source_delta(sources_before, sources_after)})


def _report_errors(label: str, concurrency: int, round_index: int, state: RunState) -> None:
    errors = [r for r in state.requests if r["config"] == label and r["concurrency"] == concurrency
              and r["round"] == round_index and r["error"]]
    if errors:
        print(f"[{label}] c={concurrency}: {len(errors)} request(s) failed, first: {errors[0]['error']}",
              file=sys.stderr, flush=True)


def _measure_session(
    server: Server | RunningServer, target: Target, session: list[int],
    selected_per_level: dict[int, OrderedDict[str, list[Question]]], warmup: list[str],
    options: BenchOptions, state: RunState, round_index: int, server_info: dict[str, Any],
) -> None:
    """Warm-up, then every concurrency x category block of ``session`` on ``server``, ``repeats`` times."""
    from tqdm import tqdm

    label = target.config.label
    warm_up(server, target, warmup, max(session), options, server_info)
    for concurrency in session:
        desc = f"{label} c={concurrency}" + (f" round {round_index + 1}" if options.rounds > 1 else "")
        blocks = _blocks(selected_per_level[concurrency], concurrency)
        n_prompts = sum(len(qs) for _, qs in blocks)
        with tqdm(total=n_prompts * options.repeats, desc=desc, unit="req", leave=True) as bar:
            for repeat in range(options.repeats):
                for category, questions in blocks:
                    bar.set_postfix_str(category + (f" repeat {repeat + 1}" if options.repeats > 1 else ""))
                    _measure_block(server, target, concurrency, category, questions,
                                   {"round": round_index, "repeat": repeat}, options, state, bar.update)
        _report_errors(label, concurrency, round_index, state)


def bench_config(
    target: Target, selected_per_level: dict[int, OrderedDict[str, list[Question]]], warmup: list[str],
    options: BenchOptions, out: Path, state: RunState, round_index: int = 0, cpu: bool = False,
) -> dict[str, Any]:
    """Serve one config (or attach to its running server) and run every concurrency x category block on it,
    ``options.repeats`` times.

    The repeats of a concurrency level follow each other on the same server after its warm-up; requests
    and blocks carry their ``round`` (``round_index``, see --rounds) and ``repeat``. A server that fails
    to start or dies marks its session (and the config) failed; the other sessions still run.
    """
    info = config_info(target, options, round_index, state)
    concurrencies = list(options.concurrency)
    sessions = [concurrencies] if options.reuse_server or target.base_url else [[c] for c in concurrencies]
    base_target = target
    for session in sessions:
        target = fresh_state(base_target, session, round_index, state.started_at)
        server, server_info = open_server(target, session, options, out, cpu, info)
        try:
            start_server(server, target, session, options, server_info)
            _measure_session(server, target, session, selected_per_level, warmup, options, state, round_index,
                             server_info)
            finish_server(server, target, server_info)
        except SERVER_ERRORS as exc:
            record_failure(server, target, session, exc, info, server_info)
        except KeyboardInterrupt:
            server_info["status"] = info["status"] = "interrupted"
            raise
        finally:
            if isinstance(server, Server):
                server.stop()
    return info


def bench_interleaved(
    targets: list[Target], selected_per_level: dict[int, OrderedDict[str, list[Question]]], warmup: list[str],
    options: BenchOptions, out: Path, state: RunState, round_index: int = 0, cpu: bool = False,
) -> list[dict[str, Any]]:
    """``--interleave``: every config's server up at once, and each block (a category at concurrency 1, the
    mixed set above it) run on every config in turn before the next block starts, so the configs' samples
    of a block are seconds apart and a machine that drifts (a neighbour, heat) slows them alike.

    The order within a block rotates by one config each block, so every config is measured first, second, ...
    equally often. One server per config for all concurrency levels (as ``--reuse-server``); each started
    server gets ``1/len(targets)`` of the default memory share (``interleaved_options``). A server that fails
    to start or is lost marks its config failed; the others go on. Returns the configs' entries.
    """
    from tqdm import tqdm

    levels = list(options.concurrency)
    live: list[tuple[Target, Server | RunningServer, dict[str, Any], dict[str, Any]]] = []
    opened, infos = [], []
    model = targets[0].model if targets else ""
    server_options, shortfall = interleaved_options(options, len(targets), cpu, model)
    if shortfall:
        _log(f"note: {shortfall}")
    try:
        for target in targets:
            info = config_info(target, options, round_index, state)
            infos.append(info)
            target = fresh_state(target, levels, round_index, state.started_at)
            server, server_info = open_server(target, levels, server_options, out, cpu, info)
            opened.append(server)
            try:
                start_server(server, target, levels, options, server_info)
                live.append((target, server, info, server_info))
            except SERVER_ERRORS as exc:
                record_failure(server, target, levels, exc, info, server_info)
                if isinstance(server, Server):
                    server.stop()
        for target, server, info, server_info in list(live):
            try:
                warm_up(server, target, warmup, max(levels), options, server_info)
            except SERVER_ERRORS as exc:
                _lose(live, target, exc)
        turn = 0
        for concurrency in levels:
            blocks = _blocks(selected_per_level[concurrency], concurrency)
            n_prompts = sum(len(qs) for _, qs in blocks)
            desc = f"interleaved c={concurrency}" + (f" round {round_index + 1}" if options.rounds > 1 else "")
            with tqdm(total=n_prompts * options.repeats * len(live), desc=desc, unit="req", leave=True) as bar:
                for repeat in range(options.repeats):
                    for category, questions in blocks:
                        shift = turn % len(live) if live else 0
                        turn += 1
                        for target, server, _, _ in live[shift:] + live[:shift]:
                            bar.set_postfix_str(f"{category} {target.config.label}")
                            try:
                                _measure_block(server, target, concurrency, category, questions,
                                               {"round": round_index, "repeat": repeat}, options, state, bar.update)
                            except SERVER_ERRORS as exc:
                                _lose(live, target, exc)
            for target, *_ in live:
                _report_errors(target.config.label, concurrency, round_index, state)
        for target, server, _, server_info in live:
            finish_server(server, target, server_info)
    except KeyboardInterrupt:
        for _, _, info, server_info in live:
            server_info["status"] = info["status"] = "interrupted"
        raise
    finally:  # every server started, the one being started when interrupted included
        for server in opened:
            if isinstance(server, Server):
                server.stop()
    return infos


def _lose(live: list, target: Target, exc: Exception) -> None:
    """Take ``target``'s server out of an interleaved round: recorded as failed and stopped."""
    for entry in live:
        if entry[0] is target:
            live.remove(entry)
            _, server, info, server_info = entry
            record_failure(server, target, server_info["concurrency"], exc, info, server_info)
            if isinstance(server, Server):
                server.stop()
            return


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (``timeout``, a job scheduler) ends the run like Ctrl-C: servers run in sessions of their own,
    so only the ``finally`` blocks that stop them keep them from outliving the benchmark."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(options: BenchOptions, argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; the exit code: 0 done, 1 some config failed, 2 bad input, 130 interrupted."""
    with sigterm_as_interrupt():
        return _run(options, list(sys.argv if argv is None else argv))


def _log(message: str) -> None:
    print(f"freespec bench: {message}", flush=True)


def _run(options: BenchOptions, argv: list[str]) -> int:
    t0 = time.monotonic()
    cpu = is_cpu_vllm()
    if options.dtype is None and not options.base_url:
        options = dataclasses.replace(options, dtype=default_dtype(cpu=cpu))
    try:
        names = workload_names(options.workload)
    except BenchError as exc:
        print(f"freespec bench: {exc}", file=sys.stderr)
        return 2
    if names:  # the workload suite (freespec.bench.workloads) instead of Spec-Bench's questions
        return run_workloads(options, argv, names, cpu)
    try:
        # The configs first: a typo fails before questions are downloaded or a model prepared.
        configs = [] if options.base_url else parse_config_list(options.configs, options.num_speculative_tokens)
        question_set = resolve_questions(options.questions, log=_log)
        questions = question_set.questions
        categories = split_config_list(options.categories) if options.categories else None
        selected_per_level = select_questions_per_level(
            questions, categories, options.per_category, options.concurrency, options.new_questions_per_level)
        targets, skipped = select_targets(options, configs)
    except (BenchError, QuestionsError) as exc:
        print(f"freespec bench: {exc}", file=sys.stderr)
        return 2
    _log(f"questions: {question_set.describe()}")
    selected = selected_per_level[options.concurrency[0]]
    measured = list({(q.category, q.question_id): q for level in selected_per_level.values()
                     for qs in level.values() for q in qs}.values())
    if not measured:
        print("freespec bench: no questions selected", file=sys.stderr)
        return 2
    warmup = select_warmup_prompts(questions, measured, options.warmup)
    model = targets[0].model if targets else (options.model or "")
    out = Path(options.out or Path("bench_results") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)

    settings = asdict(options)
    settings.update(model=model, questions=question_set.describe(), question_set=question_set.name,
                    questions_file=question_set.path,
                    categories=list(selected),
                    prompts_per_category={c: len(q) for c, q in selected.items()},
                    question_ids_per_level={str(c): {cat: [q.question_id for q in qs] for cat, qs in level.items()}
                                            for c, level in selected_per_level.items()},
                    warmup_prompts=warmup, baseline=BASELINE)
    state = RunState(
        started_at=_dt.datetime.now().isoformat(timespec="seconds"),
        command=shlex.join([os.path.basename(argv[0]) if argv else "freespec", *argv[1:]]),
        argv=argv, settings=settings, versions=collect_versions(),
        machine={} if options.base_url else describe_machine(),
    )
    state.configs.extend(skipped)
    where = f"servers {', '.join(t.base_url for t in targets)}" if options.base_url else f"model {model}"
    _log(f"{len(measured)} prompts in {len(selected)} categories ({', '.join(selected)}), concurrency "
         f"{' '.join(map(str, options.concurrency))}, configs {', '.join(t.config.label for t in targets)}; "
         f"{where}; results in {out}")
    # None with --base-url (no machine described). Stock vLLM and freespec are measured alike; the notes only say
    # what the machine could give both.
    for advice in cpu_advice(state.machine, ngram=any(t.config.method == "ngram" for t in targets)):
        _log(f"note: {advice}")
    if options.repeats > 1:
        _log(f"{options.repeats} repeats per level on each server; after the first, a server "
             "sees prompts it has answered, and proposers that remember earlier outputs (suffix, copy's "
             "pool, recycle, hybrid) replay them: compare their repeats' tok/fwd, or use --rounds")

    exit_code = 0
    try:
        # --rounds: the whole config list again on fresh servers, so the samples of a config are spread
        # over time and servers like the other configs' (one round: each config once, as before), in an
        # order that balances drift over the run (a neighbour, heat) across configs: round_order.
        for round_index in range(options.rounds):
            ordered = round_order(targets, round_index, options.rounds)
            if options.interleave:  # every config's server at once, each block on every config in turn
                infos = bench_interleaved(ordered, selected_per_level, warmup, options, out, state, round_index, cpu)
                save_results(out, state)
            else:  # one config after another, the results written after each
                infos = []
                for target in ordered:
                    infos.append(bench_config(target, selected_per_level, warmup, options, out, state, round_index,
                                              cpu))
                    save_results(out, state)
            if any(info["status"] != "ok" for info in infos):
                exit_code = 1
        state.status = "complete" if exit_code == 0 else "complete with failures"
    except KeyboardInterrupt:
        print("\nfreespec bench: interrupted; writing partial results", file=sys.stderr)
        state.status = "interrupted"
        exit_code = 130
    finally:
        state.aggregates = aggregate(state.requests, state.blocks)
        state.finished_at = _dt.datetime.now().isoformat(timespec="seconds")
        state.duration_s = time.monotonic() - t0
        write_json(out / "results.json", state)

    table = render_markdown(state.aggregates, failures=failure_rows(state.configs), dtype=options.dtype)
    latency = render_latency_markdown(state.aggregates)
    sources = render_sources_markdown(state.aggregates)
    notes = [f"- {c['label']}" + (f" (round {c['round'] + 1})" if "round" in c else "")
             + f": {c['status']}" + (f": {c['note']}" if c.get("note") else "")
             for c in state.configs if c["status"] != "ok"]
    header = results_header(
        model, options.dtype, options.max_tokens, options.temperature,
        None if options.base_url else options.num_speculative_tokens, len(measured), question_set.describe(),
        options.repeats, options.rounds, server=", ".join(options.base_url) if options.base_url else None,
        machine=machine_summary(state.machine) if state.machine else None) + state_backends(state.configs)
    footer = "\n" + "\n".join(notes) + "\n" if notes else ""
    (out / "results.md").write_text(
        header + table + LATENCY_HEADER + latency + (SOURCES_HEADER + sources if sources else "") + footer,
        encoding="utf-8")
    draw_charts(state.aggregates, out, model, options.dtype)
    print()
    print(table, end="")
    print("\n" + LATENCY_HEADER.strip().splitlines()[0])
    print(latency, end="")
    if sources:
        print("\n" + SOURCES_HEADER.strip().splitlines()[0])
        print(sources, end="")
    for note in notes:
        print(note)
    print(f"\nresults: {out / 'results.json'}, {out / 'results.md'} ({state.duration_s:.0f} s)")
    return exit_code
