source "$(dirname "$0")/../../.venv/bin/activate"
M=~/.cache/freespec/models/smollm2-135m-instruct
start() { python -m freespec.vllm_plugins.vllm_cli serve $M --host 127.0.0.1 --port $1 --dtype bfloat16 --max-model-len 2048 --seed 0 --gpu-memory-utilization 0.1 > /tmp/srv$1.log 2>&1 & echo $!; }
wait_up() { for i in $(seq 300); do curl -sf http://127.0.0.1:$1/health >/dev/null && return 0; sleep 2; done; return 1; }
timeit() { python - $1 <<'PY'
import sys, time, json, urllib.request
port = sys.argv[1]
def req(p):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": p}], "max_tokens": 128, "temperature": 0}).encode()
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r))["usage"]["completion_tokens"]
models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
def req2(p):
    body = json.dumps({"model": models, "messages": [{"role": "user", "content": p}], "max_tokens": 128, "temperature": 0}).encode()
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r))["usage"]["completion_tokens"]
req2("hi")
t = time.perf_counter(); n = 0
for p in ["Write a story about a cat.", "Explain photosynthesis.", "List ten fruits.", "Describe Paris.", "How do planes fly?", "What is a prime number?"]:
    n += req2(p)
print(f"{n / (time.perf_counter() - t):.1f} tok/s")
PY
}
A=$(start 8101); wait_up 8101 || exit 1
echo "A alone: $(timeit 8101)"
echo "A alone: $(timeit 8101)"
B=$(start 8102); wait_up 8102 || exit 1; sleep 5
echo "A with B idle: $(timeit 8101)"
echo "A with B idle: $(timeit 8101)"
kill $B; sleep 10; pkill -f "port 8102"; sleep 5
echo "A alone again: $(timeit 8101)"
kill $A; sleep 5; pkill -f "port 8101"
