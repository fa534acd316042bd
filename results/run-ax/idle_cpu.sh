source "$(dirname "$0")/../../.venv/bin/activate"
M=~/.cache/freespec/models/smollm2-135m-instruct
python -m freespec.vllm_plugins.vllm_cli serve $M --host 127.0.0.1 --port 8111 --dtype bfloat16 --max-model-len 2048 --seed 0 --gpu-memory-utilization 0.07 --speculative-config '{"plugin": "hybrid", "num_speculative_tokens": 8}' > /tmp/srv8111.log 2>&1 &
P=$!
for i in $(seq 300); do curl -sf http://127.0.0.1:8111/health >/dev/null && break; sleep 2; done
curl -s http://127.0.0.1:8111/v1/chat/completions -H 'Content-Type: application/json' -d '{"model":"'$M'","messages":[{"role":"user","content":"Say hi"}],"max_tokens":16}' > /dev/null
sleep 15
cpu() { for p in $(pgrep -f "port 8111") $(pgrep -f "VLLM::"); do awk '{print $14+$15}' /proc/$p/stat 2>/dev/null; done | paste -sd+ | bc; }
a=$(cpu); sleep 30; b=$(cpu)
echo "idle server CPU ticks in 30 s: $((b - a)) (100 ticks = 1 core-second)"
top -b -d 5 -n 2 | grep -A8 "PID USER" | tail -8
kill $P; sleep 10; pkill -f "port 8111"
