"""What keeping the suffix source's learned responses in sync costs one replica as the fleet grows (issue 87's
first aim: per-replica sync CPU and bytes at 32 writers within 1.5x of 2 writers, at the same fleet-wide rate).

For each backend and fleet size N: one *observed replica* process learns its 1/N share of ``--rate`` responses a
second (``--tokens`` each) and syncs as the ``suffix`` source does (every ``--step-ms`` the engine thread's
``take_merged``/``take``; every ``--save-every`` seconds ``save_async`` and ``merge_async([FIND_PEERS])``), while
one driver process plays the other N-1 writers cheaply, appending the rest of the fleet's rate. Every writer
starts with a full store (``--store`` responses, ``max_saved_responses``' default) where the backend keeps one.

- ``snapshots``: today's state directory (``ResponseStore``, ``state_dir``; tmpfs under ``--folder``). The driver
  keeps the fleet's newest ``--store`` responses (what each writer holds once it has merged its peers; the
  observed replica's own are left out) and rewrites each simulated writer's whole file once a save interval,
  staggered across it, as a writer that learned or merged something does.
- ``folder-log``: the state directory as it is now (``FolderLog``, ``folder_log``; tmpfs under ``--folder``). The
  driver gives each simulated writer its own segment, starting with its share of the fleet's newest ``--store``
  responses, and appends each writer's records of a save interval once an interval, staggered across it, as its
  file thread does (the rates here never reach a compaction: twice ``--store`` records a writer).
- ``redis``: ``RedisResponses`` on one stream; the driver appends each simulated writer's records with the
  backend's own script (one record a call, as a writer's flush at these rates) and reads nothing (what the
  other replicas read costs the observed one nothing). The stream starts with ``--store`` records.

Measured in the observed process only, over ``--seconds`` after ``--warmup`` (the start's load and first
round excluded): the CPU of its background threads (named ``freespec-*``: ``/proc/self/task/<tid>/schedstat``,
ns on the CPU) plus the engine thread's sync calls (``time.thread_time`` around them; learning itself, ``add``,
is not counted); bytes read: the background threads' ``rchar`` (``/proc/self/task/<tid>/io``) for files, and for
Redis the TCP payload received on the backend's connections (``TCP_INFO`` ``tcpi_bytes_received``: ``rchar``
does not count ``recv``). Per minute of the window. The snapshots' cost is per round, so per minute it scales
with 1 / ``--save-every``: at the default 30 s it is ``--save-every``/30 of the figures (the ratios hold).

    python scripts/fleet_sync_cost.py                       # every backend at 2, 8 and 32 writers, 60 s each
    python scripts/fleet_sync_cost.py --quick               # a smoke run: 2 writers, a few seconds
    python scripts/fleet_sync_cost.py --backends redis --url redis://host:6379/0
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FP, VOCAB = "sha256:fleet-sync-cost", 50_000
BACKENDS = ("snapshots", "folder-log", "redis")
AIM = 1.5  # issue 87: 32 writers within 1.5x of 2 writers
_TCPI_BYTES_RECEIVED = 128  # offset in Linux's struct tcp_info (since 4.1)
_TCPI_BYTES_ACKED = 120


# ---------------------------------------------------------------- arguments and the table (pure; tested)
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    p.add_argument("--writers", nargs="+", type=int, default=[2, 8, 32], help="fleet sizes N (writers in all)")
    p.add_argument("--seconds", type=float, default=60.0, help="the measured window, per backend and N")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds after the start before the window")
    p.add_argument("--rate", type=float, default=20.0, help="the fleet's learned responses a second, in all")
    p.add_argument("--tokens", type=int, default=200, help="tokens a response")
    p.add_argument("--store", type=int, default=10_000, help="responses each writer holds (max_saved_responses)")
    p.add_argument("--save-every", type=float, default=5.0,
                   help="save_every_s (default 30 in a server; scaled down so a minute holds several rounds)")
    p.add_argument("--step-ms", type=float, default=20.0, help="the observed replica's engine step")
    p.add_argument("--folder", default="/dev/shm/freespec-fleet-sync", help="the state directories (tmpfs)")
    p.add_argument("--url", help="a Redis to use (default: a redis-server started here on a free port)")
    p.add_argument("--out", default=str(ROOT / "bench_results" / "fleet-sync" / "results.json"))
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 writers, 5 s, 1,000 responses a store")
    # the processes this script starts
    p.add_argument("--role", choices=("observed", "driver"), help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    p.add_argument("--fleet", type=int, help=argparse.SUPPRESS)
    p.add_argument("--where", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.writers, args.seconds, args.warmup, args.store, args.save_every = [2], 5.0, 3.0, 1_000, 2.0
    if min(args.writers) < 2:
        p.error("--writers: a fleet has at least 2 writers (the observed replica and a peer)")
    if args.rate <= 0 or args.tokens < 1 or args.store < 1 or args.save_every <= 0 or args.seconds <= 0:
        p.error("--rate, --tokens, --store, --save-every and --seconds must be positive")
    return args


def per_minute(value: float, seconds: float) -> float:
    return value * 60.0 / seconds


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row with ``cpu_x``/``read_x``: its per-minute sync CPU and bytes read over those of the smallest
    fleet of the same backend (None where that is zero or missing)."""
    base: dict[str, dict] = {}
    for r in rows:
        if r["backend"] not in base or r["writers"] < base[r["backend"]]["writers"]:
            base[r["backend"]] = r
    out = []
    for r in rows:
        b = base[r["backend"]]
        out.append({**r, "cpu_x": r["cpu_s_min"] / b["cpu_s_min"] if b["cpu_s_min"] > 0 else None,
                    "read_x": r["read_mb_min"] / b["read_mb_min"] if b["read_mb_min"] > 0 else None})
    return out


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def table(rows: list[dict]) -> str:
    """The rows (``with_ratios``) as a markdown table."""
    lines = ["| backend | writers | window s | sync CPU s/min: background | engine thread | total | x fewest "
             "writers | MB read/min | x fewest writers | MB written/min | work in the window |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['writers']} | {r['window_s']:.0f} | {r['bg_cpu_s_min']:.3f} | "
                     f"{r['engine_cpu_s_min']:.3f} | {r['cpu_s_min']:.3f} | {_x(r['cpu_x'])} | "
                     f"{r['read_mb_min']:.2f} | {_x(r['read_x'])} | {r['written_mb_min']:.2f} | {r['work']} |")
    return "\n".join(lines)


def verdicts(rows: list[dict], aim: float = AIM) -> list[str]:
    """Per backend, the largest fleet against the smallest: the aim's two ratios and whether both hold."""
    out = []
    for backend in dict.fromkeys(r["backend"] for r in rows):
        mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["writers"])
        if len(mine) < 2:
            continue
        lo, hi = mine[0], mine[-1]
        cpu, read = hi["cpu_x"], hi["read_x"]
        worst = max(v for v in (cpu, read) if v is not None) if (cpu, read) != (None, None) else None
        held = worst is not None and worst <= aim
        how = "within the aim" if held else (f"{worst / aim:.1f}x past the aim" if worst else "not comparable")
        out.append(f"{backend}: {hi['writers']} writers against {lo['writers']}: sync CPU {_x(cpu)}, bytes read "
                   f"{_x(read)} ({how} of {aim}x)")
    return out


# ---------------------------------------------------------------- measuring inside a process
def thread_cpu_ns(tid: int) -> int | None:
    """Nanoseconds thread ``tid`` of this process has run (``schedstat``), None once it is gone."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def thread_io(tid: int) -> tuple[int, int]:
    """(rchar, wchar) of thread ``tid``: bytes passed to read()/write() calls (files; not ``recv``)."""
    got = {}
    try:
        with open(f"/proc/self/task/{tid}/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                got[key] = int(value)
    except (OSError, ValueError):
        pass
    return got.get("rchar", 0), got.get("wchar", 0)


def tcp_bytes(sock) -> tuple[int, int]:
    """(received, sent and acknowledged) TCP payload bytes of ``sock`` (Linux ``TCP_INFO``)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return (struct.unpack_from("<Q", info, _TCPI_BYTES_RECEIVED)[0], struct.unpack_from("<Q", info, _TCPI_BYTES_ACKED)[0])


def sync_threads() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.name.startswith("freespec-") and t.native_id}


def _sample(backend_obj, kind: str) -> dict:
    threads = {tid: (thread_cpu_ns(tid), *thread_io(tid)) for tid in sync_threads()}
    net = {}
    if kind == "redis" and backend_obj._client is not None:
        pool = backend_obj._client.connection_pool
        for conn in [*pool._available_connections, *pool._in_use_connections]:
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                try:
                    net[id(conn)] = tcp_bytes(sock)
                except OSError:
                    pass
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"threads": threads, "net": net, "process_cpu": ru.ru_utime + ru.ru_stime, "at": time.monotonic()}


def _delta(a: dict, b: dict) -> dict:
    cpu = rchar = wchar = 0
    for tid, (c1, r1, w1) in b["threads"].items():
        c0, r0, w0 = a["threads"].get(tid, (0, 0, 0))
        cpu += (c1 or 0) - (c0 or 0)
        rchar += r1 - r0
        wchar += w1 - w0
    recv = sent = 0
    for key, (r1, s1) in b["net"].items():
        r0, s0 = a["net"].get(key, (0, 0))
        recv += r1 - r0
        sent += s1 - s0
    lost = [tid for tid in a["threads"] if tid not in b["threads"]]
    return {"bg_cpu_s": cpu / 1e9, "rchar": rchar, "wchar": wchar, "tcp_received": recv, "tcp_sent": sent,
            "threads": len(b["threads"]), "threads_gone": len(lost), "connections": len(b["net"]),
            "process_cpu_s": b["process_cpu"] - a["process_cpu"], "window_s": b["at"] - a["at"]}


def observed(args) -> dict:
    """The observed replica: learn its share, sync as the suffix source does, measure the window."""
    import numpy as np

    from freespec.proposers.api import SHARED_SCOPE

    rng = np.random.default_rng(os.getpid())
    n = args.fleet
    if args.backend == "snapshots":
        from freespec.proposers.learned import state_dir
        from freespec.proposers.learned.purges import PurgeLog
        from freespec.proposers.learned.response_store import FIND_PEERS, ResponseStore

        own = state_dir.own_file(args.where, "suffix", "bin")
        purges = PurgeLog(args.where)
        store = ResponseStore(own, fingerprint=FP, vocab_size=VOCAB, max_responses=args.store,
                              max_tokens=args.store * args.tokens, perms=state_dir.FILE_MODE,
                              find_peers=lambda: tuple(state_dir.peer_files(own)[-state_dir.START_FILES:]),
                              purged=purges.current)
        store.load()  # the start, as the source's bind: its own file, then its peers' (not measured)
        for peer in state_dir.peer_files(own)[-state_dir.START_FILES:]:
            store.merge_from(peer)
        obj = store
    elif args.backend == "folder-log":
        from freespec.proposers.learned.folder_log import FolderLog

        obj = FolderLog(args.where, writer="observed.0.1", fingerprint=FP, vocab_size=VOCAB, max_responses=args.store,
                        max_tokens=args.store * args.tokens, interval_s=args.save_every)  # its start: not measured
    else:
        from freespec.proposers.learned.redis_stream import RedisResponses

        obj = RedisResponses(args.where, writer="observed.0.1", fingerprint=FP, vocab_size=VOCAB,
                             max_responses=args.store, max_tokens=args.store * args.tokens)
    step, learn_every = args.step_ms / 1000, n / args.rate
    start = time.monotonic()
    window_at, end = start + args.warmup, start + args.warmup + args.seconds
    next_learn, next_save = start, start + args.save_every
    engine_cpu = 0.0
    counts = {"learned": 0, "peer_merges": 0, "applied": 0}
    first = None
    measuring = False
    while True:
        now = time.monotonic()
        if not measuring and now >= window_at:
            measuring, engine_cpu = True, 0.0
            counts = dict.fromkeys(counts, 0)
            saves0 = getattr(obj, "saves", 0)
            appended0 = getattr(obj, "appended", 0)
            first = _sample(obj, args.backend)
        if now >= end:
            break
        while now >= next_learn:  # learning itself: not counted as sync
            obj.add(rng.integers(0, VOCAB, args.tokens, dtype=np.int32)) if args.backend == "snapshots" else \
                obj.add(SHARED_SCOPE, rng.integers(0, VOCAB, args.tokens, dtype=np.int32))
            counts["learned"] += 1
            next_learn += learn_every
        c0 = time.thread_time()
        if args.backend == "snapshots":  # _files_tick with a state directory
            if obj._files is not None and obj._files.has_ready():
                counts["peer_merges"] += 1
            obj.take_merged()
            if now >= next_save:
                next_save += args.save_every
                obj.save_async()
                obj.merge_async((FIND_PEERS,))
        else:
            counts["applied"] += len(obj.take().new)
        engine_cpu += time.thread_time() - c0
        time.sleep(max(0.0, min(next_learn, now + step) - time.monotonic()))
    last = _sample(obj, args.backend)
    d = _delta(first, last)
    if args.backend == "snapshots":
        read, written = d["rchar"], d["wchar"]
        due = int(d["window_s"] / args.save_every) * (n - 1)
        work = f"{counts['peer_merges']} peer files merged (about {due} due), {obj.saves - saves0} saves"
        obj.close()
    elif args.backend == "folder-log":
        read, written = d["rchar"], d["wchar"]
        work = f"{counts['applied']} records applied, {obj.appended - appended0} appended"
        obj.close()
    else:
        read, written = d["tcp_received"], d["tcp_sent"]
        work = f"{counts['applied']} records applied, {obj.appended - appended0} appended"
        obj.close()
    w = d["window_s"]
    return {"backend": args.backend, "writers": n, "window_s": w, "work": work, **counts, **d,
            "bg_cpu_s_min": per_minute(d["bg_cpu_s"], w), "engine_cpu_s_min": per_minute(engine_cpu, w),
            "cpu_s_min": per_minute(d["bg_cpu_s"] + engine_cpu, w), "read_mb_min": per_minute(read, w) / 1e6,
            "written_mb_min": per_minute(written, w) / 1e6,
            "bytes_how": "rchar of the freespec-* threads" if args.backend != "redis"
            else "TCP bytes received on the backend's connections (TCP_INFO)"}


# ---------------------------------------------------------------- the other N-1 writers
class _Stop(Exception):
    pass


def _stop(*_):
    raise _Stop


def driver(args) -> None:
    """The other N-1 writers: a full store each at start, then the rest of the fleet's rate until SIGTERM;
    prints ``ready`` once set up, and a JSON line of what it did at the end."""
    import numpy as np

    signal.signal(signal.SIGTERM, _stop)
    rng = np.random.default_rng(12345)
    others = args.fleet - 1
    every = args.fleet / (args.rate * others)
    stats = {"learned": 0, "saves": 0, "max_late_s": 0.0}

    def tokens():
        return rng.integers(0, VOCAB, args.tokens, dtype=np.int32)

    if args.backend == "snapshots":
        from collections import deque

        from freespec.proposers.learned import state_dir
        from freespec.proposers.learned.response_store import NO_HORIZON, Stored, _digest, _Entry, write_store

        state_dir.open_root(args.where)
        folder = state_dir.source_dir(args.where, "suffix")
        paths = [os.path.join(folder, f"sim.0.{i}.bin") for i in range(others)]
        entries: deque = deque()
        horizon = [NO_HORIZON]
        last = [0]

        def learn() -> None:
            arr = tokens()
            arr.flags.writeable = False
            last[0] = max(time.time_ns(), last[0] + 1)
            entries.append(_Entry(last[0], _digest(arr), arr))
            if len(entries) > args.store:
                horizon[0] = entries.popleft().key

        def save(i: int) -> None:
            write_store(paths[i], Stored(list(entries), horizon[0]), fingerprint=FP, vocab_size=VOCAB,
                        perms=state_dir.FILE_MODE)

        for _ in range(args.store):
            learn()
        for i in range(others):
            save(i)
    elif args.backend == "folder-log":
        from freespec.proposers.learned import state_dir
        from freespec.proposers.learned.folder_log import EXT, SUM_BYTES, encode_record, segment_header

        state_dir.open_root(args.where)
        folder = state_dir.source_dir(args.where, "suffix")
        headers = [segment_header(FP, VOCAB, f"sim.0.{i}", "") for i in range(others)]
        paths = [os.path.join(folder, f"sim.0.{i}.1{EXT}") for i in range(others)]
        waiting: list[list[bytes]] = [[] for _ in range(others)]
        k = [0]

        def learn() -> None:  # each simulated writer learns in turn; its file thread appends once an interval
            i = k[0] % others
            waiting[i].append(encode_record(headers[i][-SUM_BYTES:], tokens(), time.time_ns()))
            k[0] += 1

        def save(i: int) -> None:
            if waiting[i]:
                fd = os.open(paths[i], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, b"".join(waiting[i]))
                finally:
                    os.close(fd)
                waiting[i] = []

        for i in range(others):
            with open(paths[i], "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(headers[i])
        for _ in range(args.store):
            learn()
        for i in range(others):
            save(i)
    else:
        from freespec.proposers.learned.redis_stream import _APPEND, NAMESPACES, Keys, connect, namespace

        client = connect(args.where, socket_timeout=30)
        script = client.register_script(_APPEND)
        keys = Keys(namespace(FP, VOCAB))
        kk = [keys.stream(""), keys.generations, keys.registry, NAMESPACES, keys.announce]
        k = [0]

        def append(batch: int) -> None:
            argv = ["", "", args.store, keys.ns]
            for _ in range(batch):
                argv += [tokens().astype("<i4").tobytes(), f"sim.0.{k[0] % others}", str(time.time_ns())]
                k[0] += 1
            script(keys=kk, args=argv)

        def learn() -> None:
            append(1)

        for i in range(0, args.store, 256):
            append(min(256, args.store - i))
    print("ready", flush=True)
    start = time.monotonic()
    next_learn = start
    gap = args.save_every / others
    next_save, writer = start + gap, 0
    try:
        while True:
            now = time.monotonic()
            if now >= next_learn:
                stats["max_late_s"] = max(stats["max_late_s"], now - next_learn)
                learn()
                stats["learned"] += 1
                next_learn += every
            if args.backend != "redis" and now >= next_save:
                stats["max_late_s"] = max(stats["max_late_s"], now - next_save)
                save(writer)
                stats["saves"] += 1
                writer = (writer + 1) % others
                next_save += gap
            upcoming = min(next_learn, next_save) if args.backend != "redis" else next_learn
            time.sleep(max(0.0, upcoming - time.monotonic()))
    except _Stop:
        pass
    stats["seconds"] = time.monotonic() - start
    print("DRIVER " + json.dumps(stats), flush=True)


# ---------------------------------------------------------------- the run
def machine() -> dict:
    out = {"cpus": os.cpu_count()}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU family", "Model"):
                out[key.strip()] = value.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        out["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def one(args, backend: str, n: int, where: str) -> dict:
    common = [sys.executable, __file__, "--backend", backend, "--fleet", str(n), "--where", where,
              "--rate", str(args.rate), "--tokens", str(args.tokens), "--store", str(args.store),
              "--save-every", str(args.save_every)]
    drv = subprocess.Popen([*common, "--role", "driver"], stdout=subprocess.PIPE, text=True)
    try:
        line = drv.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the driver did not start ({line!r})")
        obs = subprocess.run([*common, "--role", "observed", "--seconds", str(args.seconds), "--warmup",
                              str(args.warmup), "--step-ms", str(args.step_ms)],
                             capture_output=True, text=True, timeout=args.warmup + args.seconds + 600)
        result = next((json.loads(x[7:]) for x in obs.stdout.splitlines() if x.startswith("RESULT ")), None)
        if result is None:
            raise RuntimeError(f"the observed replica failed (rc {obs.returncode}): {obs.stderr[-2000:]}")
    finally:
        drv.terminate()
        out, _ = drv.communicate(timeout=60)
    result["driver"] = next((json.loads(x[7:]) for x in out.splitlines() if x.startswith("DRIVER ")), None)
    if obs.stderr.strip():  # the backends' warnings (a peer's file skipped, Redis failing): kept with the row
        result["stderr_tail"] = obs.stderr[-1000:]
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "observed":
        print("RESULT " + json.dumps(observed(args)), flush=True)
        return 0
    if args.role == "driver":
        driver(args)
        return 0
    rows = []
    server = None
    try:
        for backend in args.backends:
            url = None
            if backend == "redis":
                url = args.url
                if url is None:
                    sys.path.insert(0, str(ROOT / "tests"))
                    from redis_helpers import RedisServer

                    server = RedisServer(Path(tempfile.mkdtemp(prefix="fs-fleet-redis-"))).start()
                    url = server.url
            for n in args.writers:
                where = url
                if backend == "redis":
                    from freespec.proposers.learned.redis_stream import connect

                    connect(url).flushdb()
                else:
                    where = os.path.join(args.folder, f"{backend}-{n}")
                    shutil.rmtree(where, ignore_errors=True)
                    os.makedirs(where, mode=0o700)
                row = one(args, backend, n, where)
                if backend != "redis":
                    shutil.rmtree(where, ignore_errors=True)
                rows.append(row)
                print(f"{backend} at {n} writers: sync CPU {row['cpu_s_min']:.3f} s/min, read "
                      f"{row['read_mb_min']:.2f} MB/min ({row['work']}; driver {row['driver']})", flush=True)
    finally:
        if server is not None:
            server.stop()
    rows = with_ratios(rows)
    print()
    print(table(rows))
    for line in verdicts(rows):
        print(line)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("role", "backend", "fleet", "where")}
    out.write_text(json.dumps({"settings": settings, "machine": machine(), "rows": rows}, indent=1) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
