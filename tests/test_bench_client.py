"""Streamed chat requests and their latency figures (TTFT, TPOT, ITL as `vllm bench serve` defines them)."""
from __future__ import annotations

import json

import pytest
from bench_helpers import FAKE_SERVER, start_fake_server

from freespec.bench import client
from freespec.bench.options import BenchOptions


def _events(*chunks, usage=None):
    lines = []
    for chunk in chunks:
        lines += [f"data: {json.dumps(chunk)}".encode(), b""]
    if usage:
        lines += [f"data: {json.dumps({'choices': [], 'usage': usage})}".encode(), b""]
    return lines + [b": ping", b"data: [DONE]", b""]


def _delta(text, finish=None):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def test_read_stream_times_chunks_as_vllm_bench_serve_does():
    clock = iter([1.5, 1.75, 2.25, 2.5]).__next__  # the moments the four chunks with a choice arrive
    lines = _events(_delta(""), _delta("Hel"), _delta("lo"), _delta("!", "stop"),
                    usage={"prompt_tokens": 7, "completion_tokens": 6})
    result = client.read_stream(lines, start=1.0, clock=clock)
    assert result["output"] == "Hello!" and result["finish_reason"] == "stop"
    assert (result["completion_tokens"], result["prompt_tokens"]) == (6, 7)
    assert result["ttft_s"] == pytest.approx(0.5)
    assert result["itl_s"] == [pytest.approx(0.25), pytest.approx(0.5), pytest.approx(0.25)]
    assert result["latency_s"] == pytest.approx(1.5)
    assert result["tpot_s"] == pytest.approx((1.5 - 0.5) / 5)  # (latency - TTFT) / (tokens - 1)


def test_read_stream_without_usage_or_tokens():
    result = client.read_stream(_events(_delta("x")), start=0.0, clock=lambda: 0.25)
    assert result["completion_tokens"] is None and result["tpot_s"] is None and result["itl_s"] == []
    with pytest.raises(ValueError, match="before its first token"):
        client.read_stream([b"data: [DONE]"], start=0.0)


def test_chat_request_streams_from_a_server_and_records_errors(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    proc, url = start_fake_server(script, "plain")
    try:
        options = BenchOptions(max_tokens=9, request_timeout=30)
        result = client.chat_request(url, "m", "say hi", options)
        assert result["error"] is None and result["output"] == "SAY HI" and result["completion_tokens"] == 9
        assert 0 < result["ttft_s"] <= result["latency_s"] and len(result["itl_s"]) == 9  # a role chunk, then one a step
        failed = client.chat_request(url, "m", "FAIL please", options)
        assert failed["error"].startswith("HTTP 400") and failed["output"] is None and failed["ttft_s"] is None
    finally:
        proc.kill()
        proc.wait()
