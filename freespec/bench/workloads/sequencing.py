"""Sessions in flight: at most ``concurrency`` sessions at once, each one sequential (turn after turn)."""
from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from typing import Any

from freespec.bench.workloads.session import Send, Session, run_session


def run_sessions(sessions: Sequence[Session], concurrency: int, send: Send,
                 on_turn: Callable[[], None] | None = None) -> tuple[list[dict[str, Any]], float]:
    """Run ``sessions`` with at most ``concurrency`` in flight; the turns' records (session by session, in
    the sessions' order, each session's turns in order) and the wall time."""
    results: list[list[dict[str, Any]] | None] = [None] * len(sessions)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency))
    start = time.perf_counter()
    try:
        futures = {pool.submit(run_session, s, send, on_turn): i for i, s in enumerate(sessions)}
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
        wall = time.perf_counter() - start
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # Ctrl-C: stopping the server ends what is in flight
        raise
    pool.shutdown(wait=True)
    return [record for records in results if records for record in records], wall
