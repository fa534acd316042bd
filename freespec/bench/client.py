"""Streamed chat completions against an OpenAI-compatible server, with the latency figures of
``vllm bench serve`` (vllm/benchmarks/lib/endpoint_request_func.py, vllm/benchmarks/serve.py):

- TTFT: from sending the request to the first chunk that carries a choice;
- ITL: the gaps between consecutive such chunks (with speculative decoding one chunk may carry several
  tokens, as in vLLM's figures);
- TPOT: (latency - TTFT) / (output tokens - 1), latency being the time of the last such chunk.
"""
from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from freespec.bench.options import BenchOptions


def read_stream(lines: Iterable[bytes], start: float, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Output and timings of one server-sent-event stream of chat completion chunks.

    ``lines``: the response body line by line; ``start``: ``clock()`` when the request was sent.
    """
    text: list[str] = []
    itl: list[float] = []
    first = last = None
    finish_reason = usage = None
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators and SSE comments (pings)
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        choices = chunk.get("choices")
        if not choices:
            continue
        now = clock()
        if first is None:
            first = now
        else:
            itl.append(now - last)
        last = now
        choice = choices[0]
        text.append((choice.get("delta") or {}).get("content") or "")
        finish_reason = choice.get("finish_reason") or finish_reason
    if first is None:
        raise ValueError("the stream ended before its first token")
    usage = usage or {}
    tokens = usage.get("completion_tokens")
    ttft, latency = first - start, last - start
    return {
        "output": "".join(text),
        "finish_reason": finish_reason,
        "completion_tokens": tokens,
        "prompt_tokens": usage.get("prompt_tokens"),
        "latency_s": latency,
        "ttft_s": ttft,
        "tpot_s": (latency - ttft) / (tokens - 1) if tokens and tokens > 1 else None,
        "itl_s": itl,
        "error": None,
    }


def chat_request(base_url: str, model: str, prompt: str | list[dict[str, str]],
                 options: BenchOptions, cache_salt: str | None = None) -> dict[str, Any]:
    """One streamed chat completion of a prompt (one user turn) or a whole conversation (a list of chat
    messages, as a multi-turn client sends them); returns output, token counts, latency figures, or the error.
    ``cache_salt``: the tenant vLLM's prefix cache (and a plugin's ``scope: salt`` state) keeps it apart as;
    None sends no salt."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "seed": options.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    request = urllib.request.Request(
        base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=options.request_timeout) as resp:
            return read_stream(resp, start)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")[:500]
        error = f"HTTP {exc.code}: {detail}"
    except Exception as exc:  # noqa: BLE001 - recorded per request, the run goes on
        error = f"{type(exc).__name__}: {exc}"
    return {"output": None, "finish_reason": None, "completion_tokens": 0, "prompt_tokens": None,
            "latency_s": time.perf_counter() - start, "ttft_s": None, "tpot_s": None, "itl_s": [],
            "error": error}


def run_requests(
    prompts: Sequence[str],
    concurrency: int,
    send: Callable[[str], dict],
    on_done: Callable[[], None] | None = None,
) -> tuple[list[dict], float]:
    """Send ``prompts`` with at most ``concurrency`` in flight; results in prompt order and the wall time."""
    results: list[dict | None] = [None] * len(prompts)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency))
    start = time.perf_counter()
    try:
        futures = {pool.submit(send, p): i for i, p in enumerate(prompts)}
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
            if on_done:
                on_done()
        wall = time.perf_counter() - start
    except BaseException:
        # Ctrl-C: don't wait for requests in flight; stopping the server ends them.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [r for r in results if r is not None], wall
