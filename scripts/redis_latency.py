"""How long a response learned on one replica takes to be applied on another through Redis (issue 87's aim: 2 s
at p99), and what Redis holds per response.

A writer (this process) adds ``--responses`` responses of ``--tokens`` tokens at ``--rate`` a second, as a
source does when requests finish; a reader (another process) calls ``take`` every ``--step-ms``, as the engine's
thread does each step, and records for each response of the writer's the time from its stamp (taken when it was
added) to the ``take`` that applied it: the append's wait, Redis, the read and the wait for the next step. Both
on one host (one clock). Then ``MEMORY USAGE`` of the stream, per response.

    python scripts/redis_latency.py                      # starts its own redis-server on a free port
    python scripts/redis_latency.py --url redis://host:6379/0
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

READER = """
import sys, time
from freespec.proposers.learned.redis_stream import RedisResponses

b = RedisResponses(sys.argv[1], writer="reader.1.2", fingerprint="sha256:latency", vocab_size=50000,
                   max_responses=100000, max_tokens=100000000)
want, step = int(sys.argv[2]), float(sys.argv[3]) / 1000
print("ready", flush=True)
deadline = time.monotonic() + 600
while b.applied < want and time.monotonic() < deadline:
    b.take()
    time.sleep(step)
print(" ".join(str(x) for x in b.lags_ns), flush=True)
b.close()
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a Redis to use (default: a redis-server started here)")
    p.add_argument("--responses", type=int, default=500)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rate", type=float, default=50.0, help="responses a second")
    p.add_argument("--step-ms", type=float, default=20.0, help="the reader's engine step")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from redis_helpers import RedisServer

    from freespec.proposers.learned.redis_stream import RedisResponses

    server = None
    url = args.url
    if url is None:
        server = RedisServer(Path(tempfile.mkdtemp(prefix="fs-redis-"))).start()
        url = server.url
    try:
        reader = subprocess.Popen([sys.executable, "-c", READER, url, str(args.responses), str(args.step_ms)],
                                  stdout=subprocess.PIPE, text=True)
        assert reader.stdout.readline().strip() == "ready"
        writer = RedisResponses(url, writer="writer.1.1", fingerprint="sha256:latency", vocab_size=50000,
                                max_responses=100000, max_tokens=100000000)
        rng = np.random.default_rng(0)
        start = time.monotonic()
        for i in range(args.responses):
            writer.add("", rng.integers(0, 50000, args.tokens, dtype=np.int32))
            time.sleep(max(0.0, start + (i + 1) / args.rate - time.monotonic()))
        writer.wait_idle()
        lags = np.array([int(x) for x in reader.stdout.readline().split()], dtype=np.int64) / 1e6
        reader.wait(60)
        stream = writer.keys.stream("")
        c = writer._redis()
        per_response = int(c.memory_usage(stream, samples=0) or 0) / max(1, int(c.xlen(stream)))
        writer.close()
        print(f"{len(lags)} responses of {args.tokens} tokens at {args.rate:g}/s, reader step {args.step_ms:g} ms: "
              f"learned-to-applied p50 {np.percentile(lags, 50):.1f} ms, p99 {np.percentile(lags, 99):.1f} ms, "
              f"max {lags.max():.1f} ms")
        print(f"Redis memory per response: {per_response:.0f} bytes ({per_response - 4 * args.tokens:.0f} beyond "
              f"its {4 * args.tokens} bytes of tokens)")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
