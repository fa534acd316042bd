"""A bounded mixed load on an OpenAI-compatible server, for the soak and fault-injection scripts.

Requests mix chat and completion, streamed and not, greedy and sampled; a share of the streamed ones
is cancelled after a few chunks (the client closes the connection, as a user pressing stop does).
Concurrency follows a level that can change while the load runs (at most ``max_concurrency`` threads).
Every request is recorded: kind, whether it was cancelled, served (a finish reason came back) or failed.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import asdict, dataclass

import psutil
from openai import OpenAI

PROBE_PROMPT = (
    "Rewrite this Python code exactly as it is, but rename the function `total` to `column_sum`:\n\n"
    "def load(path):\n    with open(path) as f:\n        rows = [line.strip().split(\",\") for line in f]\n"
    "    return [r for r in rows if r and r[0]]\n\n\ndef total(rows, column):\n"
    "    return sum(float(r[column]) for r in rows)\n"
)


def client_for(base_url: str, timeout: float = 300.0) -> OpenAI:
    return OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def probe(base_url: str, model: str, max_tokens: int = 96, prompt: str = PROBE_PROMPT) -> str:
    """The fixed greedy probe's text (chat, temperature 0)."""
    out = client_for(base_url).chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0,
    )
    return out.choices[0].message.content or ""


def first_difference(a: str, b: str) -> int | None:
    """Index of the first differing character (None: equal)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass
class Record:
    kind: str  # "chat" or "completion"
    stream: bool
    temperature: float
    max_tokens: int
    started: float  # monotonic seconds
    seconds: float = 0.0
    cancelled: bool = False  # closed by the client on purpose, after at least one chunk
    served: bool = False  # a finish reason came back
    error: str | None = None


class MixedLoad:
    """Threads sending requests at the current concurrency ``level`` until ``stop``."""

    def __init__(self, base_url: str, model: str, prompts: list[str], *, max_concurrency: int = 16,
                 max_tokens: tuple[int, int] = (16, 96), cancel_share: float = 0.15, seed: int = 0) -> None:
        self.base_url, self.model, self.prompts = base_url, model, prompts
        self.max_concurrency, self.max_tokens, self.cancel_share = max_concurrency, max_tokens, cancel_share
        self.level = 1
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._seed = seed
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.max_concurrency):
            t = threading.Thread(target=self._worker, args=(i,), name=f"load-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 300.0) -> None:
        self._stop.set()
        self._running.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def pause(self, timeout: float = 300.0) -> None:
        """No new requests; returns when those in flight have finished (or after ``timeout``)."""
        self._running.clear()
        deadline = time.monotonic() + timeout
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.1)

    def resume(self) -> None:
        self._running.set()

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for r in self.records if r.seconds == 0.0)

    def since(self, t: float) -> list[Record]:
        with self._lock:
            return [r for r in self.records if r.started >= t]

    def _worker(self, index: int) -> None:
        rng = random.Random(self._seed * 1000 + index)
        client = client_for(self.base_url)
        while not self._stop.is_set():
            if index >= self.level or not self._running.is_set():
                self._stop.wait(0.2)
                continue
            stream = rng.random() < 0.5
            record = Record(
                kind="chat" if rng.random() < 0.5 else "completion", stream=stream,
                temperature=rng.choice((0.0, 0.8)), max_tokens=rng.randint(*self.max_tokens),
                started=time.monotonic(),
            )
            cancel_after = rng.randint(1, 8) if stream and rng.random() < self.cancel_share else None
            with self._lock:
                self.records.append(record)
            try:
                self._send(client, record, rng.choice(self.prompts), cancel_after)
            except Exception as e:  # noqa: BLE001 - a failed request is what the load counts
                record.error = f"{type(e).__name__}: {e}"[:300]
            record.seconds = time.monotonic() - record.started

    def _send(self, client: OpenAI, record: Record, prompt: str, cancel_after: int | None) -> None:
        common = {"model": self.model, "max_tokens": record.max_tokens, "temperature": record.temperature,
                  "stream": record.stream}
        if record.kind == "chat":
            out = client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
        else:
            out = client.completions.create(prompt=prompt, **common)
        if not record.stream:
            record.served = out.choices[0].finish_reason is not None
            return
        for chunks, chunk in enumerate(out, 1):
            if chunk.choices and chunk.choices[0].finish_reason is not None:
                record.served = True
            if cancel_after is not None and chunks >= cancel_after and not record.served:
                out.close()  # the client goes away mid-stream
                record.cancelled = True
                return
        if not record.served:
            record.error = "stream ended without a finish reason"


def summarize(records: list[Record]) -> dict:
    """Counts of a list of records: sent, served, cancelled, failed, and the first errors."""
    done = [r for r in records if r.seconds > 0.0]
    failed = [r for r in done if r.error is not None]
    return {
        "sent": len(done),
        "served": sum(r.served for r in done),
        "cancelled": sum(r.cancelled and r.error is None for r in done),
        "failed": len(failed),
        "errors": sorted({r.error for r in failed})[:5],
        "by_kind": {
            f"{k}{' stream' if s else ''}": sum(1 for r in done if r.kind == k and r.stream == s)
            for k in ("chat", "completion") for s in (False, True)
        },
    }


def records_json(records: list[Record]) -> list[dict]:
    return [asdict(r) for r in records]


def tree_rss(pid: int) -> list[dict]:
    """Resident memory (MiB) of ``pid`` and every process below it."""
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in procs:
        try:
            out.append({"pid": p.pid, "name": p.name(), "rss_mib": round(p.memory_info().rss / 2**20, 1)})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out
