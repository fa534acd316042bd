"""Shared pieces of the benchmark's unit tests: a question file, and a fake vLLM server for the run and
client tests (a subprocess speaking the OpenAI chat API, streamed, and /metrics)."""
from __future__ import annotations

import json


def write_questions(tmp_path):
    """question.jsonl with categories writing, math, rag of three questions each ("writing q0", ...)."""
    rows = []
    qid = 0
    for category in ("writing", "math", "rag"):
        for i in range(3):
            qid += 1
            rows.append({"question_id": qid, "category": category, "turns": [f"{category} q{i}", "second turn"]})
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def req(config, concurrency, category, qid, output, tokens, error=None):
    return {"config": config, "concurrency": concurrency, "category": category, "question_id": qid,
            "output": output, "completion_tokens": tokens, "latency_s": 1.0, "error": error}


def synthetic_run():
    requests = [
        req("none", 1, "a", 1, "alpha", 40), req("none", 1, "a", 2, "beta", 60),
        req("none", 1, "b", 3, "gamma", 100),
        req("ngram", 1, "a", 1, "alpha", 40), req("ngram", 1, "a", 2, "BETA", 60),
        req("ngram", 1, "b", 3, "gamma", 100),
    ]
    blocks = [
        {"config": "none", "concurrency": 1, "category": "a", "wall_s": 10.0, "spec": None},
        {"config": "none", "concurrency": 1, "category": "b", "wall_s": 10.0, "spec": None},
        {"config": "ngram", "concurrency": 1, "category": "a", "wall_s": 5.0,
         "spec": {"num_drafts": 10.0, "num_draft_tokens": 80.0, "num_accepted_tokens": 20.0}},
        {"config": "ngram", "concurrency": 1, "category": "b", "wall_s": 20.0,
         "spec": {"num_drafts": 30.0, "num_draft_tokens": 240.0, "num_accepted_tokens": 0.0}},
    ]
    return requests, blocks


def repeated_run():
    """none and ngram at concurrency 1, categories a and b, two repeats; ngram's 2nd repeat changes q2."""
    requests, blocks = [], []
    walls = {("none", 0): (10.0, 10.0), ("none", 1): (8.0, 12.5),
             ("ngram", 0): (5.0, 20.0), ("ngram", 1): (4.0, 10.0)}
    for (config, repeat), (wall_a, wall_b) in walls.items():
        beta = "BETA" if (config, repeat) == ("ngram", 1) else "beta"
        requests += [dict(req(config, 1, "a", 1, "alpha", 40), repeat=repeat),
                     dict(req(config, 1, "a", 2, beta, 60), repeat=repeat),
                     dict(req(config, 1, "b", 3, "gamma", 100), repeat=repeat)]
        spec = {"num_drafts": 10.0 * (repeat + 1), "num_draft_tokens": 80.0,
                "num_accepted_tokens": 20.0 * repeat}
        for category, wall in (("a", wall_a), ("b", wall_b)):
            blocks.append({"config": config, "concurrency": 1, "category": category, "round": 0,
                           "repeat": repeat, "wall_s": wall, "spec": None if config == "none" else spec})
    return requests, blocks


# The fake vLLM server: `python fake_server.py PORT plain|spec|die`; `spec` adds vLLM's counters to /metrics, `die`
# exits at the first chat request with an AssertionError in its log. With FAKE_SERVER_BODIES set it appends each
# chat request's body there, a JSON line, so tests can read what went over the wire.
FAKE_SERVER = r'''
import json, os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, spec, die = int(sys.argv[1]), sys.argv[2] == "spec", sys.argv[2] == "die"
counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
ACCEPTED = 4  # draft tokens accepted in each request with speculation
lock = threading.Lock()

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, "")
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": [{"id": "fake-model"}]}))
        if self.path == "/metrics":
            text = "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 1.0\n"
            if spec:
                with lock:
                    text += (
                        f'vllm:spec_decode_num_drafts_total{{engine="0"}} {counters["drafts"]}\n'
                        f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {counters["draft_tokens"]}\n'
                        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {counters["accepted"]}\n'
                        "# TYPE freespec:draft_tokens counter\n"
                        f'freespec:draft_tokens_total{{plugin="hybrid",source="copy"}} {6 * counters["drafts"] // 2}\n'
                        f'freespec:draft_tokens_total{{plugin="hybrid",source="recycle"}} {counters["drafts"]}\n'
                        "# TYPE freespec:accepted_tokens counter\n"
                        f'freespec:accepted_tokens_total{{plugin="hybrid",source="copy"}} {3 * counters["drafts"] // 2}\n'
                        f'freespec:accepted_tokens_total{{plugin="hybrid",source="recycle"}} {counters["drafts"] // 2}\n'
                        "# TYPE freespec:source_seconds counter\n"
                        f'freespec:source_seconds_total{{plugin="hybrid",source="copy"}} {0.01 * counters["drafts"]}\n'
                    )
            return self._send(200, text, "text/plain")
        self._send(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if os.environ.get("FAKE_SERVER_BODIES"):
            with lock, open(os.environ["FAKE_SERVER_BODIES"], "a", encoding="utf-8") as log:
                log.write(json.dumps(body) + "\n")
        if die:  # as vLLM's suffix decoding with a batch-size table does at its first request
            print('  File "/venv/site-packages/vllm/v1/spec_decode/suffix_decoding.py", line 43, in propose\n'
                  "    assert num_speculative_tokens == self.num_speculative_tokens\n"
                  "AssertionError", flush=True)
            os._exit(1)
        prompt = body["messages"][-1]["content"]
        if "FAIL" in prompt:
            return self._send(400, json.dumps({"error": "prompt too long"}))
        tokens = body["max_tokens"]
        if spec:
            with lock:
                counters["drafts"] += 2
                counters["draft_tokens"] += 8
                counters["accepted"] += ACCEPTED
        out = prompt.upper() if not (spec and "q1" in prompt) else "different"
        usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5}
        if not body.get("stream"):
            return self._send(200, json.dumps({
                "choices": [{"message": {"role": "assistant", "content": out}, "finish_reason": "length"}],
                "usage": usage}))
        # Streamed as vLLM does: a role chunk, then a chunk per engine step (the prefill's token, then each
        # step's accepted drafts and the target's own: ACCEPTED drafts a request with speculation), the
        # last with the finish reason, a usage chunk, [DONE].
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        steps = tokens - ACCEPTED if spec else tokens
        pieces = [{"role": "assistant", "content": ""}] + [
            {"content": out[i * len(out) // steps:(i + 1) * len(out) // steps]} for i in range(steps)]
        events = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in pieces]
        events[-1]["choices"][0]["finish_reason"] = "length"
        events.append({"choices": [], "usage": usage})
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def start_fake_server(script, mode: str = "spec"):
    """The fake server as a subprocess on a free port, answering /health; (process, base URL)."""
    import subprocess
    import sys
    import time
    import urllib.request

    from freespec.bench.server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(port), mode])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the fake server did not start")


def fake_server_script(tmp_path, monkeypatch):
    """The fake vLLM server's script, written under ``tmp_path``, with bench's polling made fast (tests point
    ``server_command`` at it)."""
    from freespec.bench import server

    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(server, "HEALTH_POLL_S", 0.05)
    monkeypatch.setattr(server, "METRICS_SETTLE_S", 0.01)
    return script
