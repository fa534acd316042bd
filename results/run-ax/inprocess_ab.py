"""In-process engine, hybrid cold or warm: tok/s and per-scored-size step times (python inprocess_ab.py cold|warm bfloat16 question.jsonl)."""
import collections, json, os, sys, time, shutil
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import freespec.scorers.policy as P
LOG = []
_orig = P.GoodputPolicy.observe_step
def observe_step(self, scored_tokens, output_tokens, seconds, rows=1):
    LOG.append((scored_tokens, output_tokens, seconds))
    return _orig(self, scored_tokens, output_tokens, seconds, rows)
P.GoodputPolicy.observe_step = observe_step
from vllm import LLM, SamplingParams
mode, dtype = sys.argv[1], sys.argv[2]
qfile = sys.argv[3]  # Spec-Bench question.jsonl
by = {}
for line in open(qfile):
    q = json.loads(line); by.setdefault(q["category"], []).append(q)
idx = int(os.environ.get("QI", "0"))
prompts = [qs[idx]["turns"][0] for qs in by.values()]
spec = {"plugin": "hybrid", "num_speculative_tokens": 8}
if mode.startswith("warm"):
    shutil.copy(os.path.expanduser("~/.cache/freespec/responses/sharegpt-1000-smollm2-135m-instruct.bin"), "/tmp/warm.bin")
    spec["suffix"] = {"responses_path": "/tmp/warm.bin", "save_every_s": 0}
if mode == "none":
    spec = None
llm = LLM(model=os.path.expanduser("~/.cache/freespec/models/smollm2-135m-instruct"), dtype=dtype,
          gpu_memory_utilization=0.3, max_model_len=2048, seed=0, speculative_config=spec)
params = SamplingParams(max_tokens=128, temperature=0)
llm.chat([[{"role": "user", "content": "Say hello."}]], params, use_tqdm=False)
LOG.clear()
t0 = time.perf_counter(); tokens = 0; texts = []
for pr in prompts:
    out = llm.chat([[{"role": "user", "content": pr}]], params, use_tqdm=False)
    tokens += len(out[0].outputs[0].token_ids); texts.append(out[0].outputs[0].text)
wall = time.perf_counter() - t0
h = collections.defaultdict(lambda: [0, 0, 0.0])
for s, o, sec in LOG:
    h[s][0] += 1; h[s][1] += o; h[s][2] += sec
print(f"RESULT {mode} {dtype} {tokens} tok {wall:.2f}s {tokens/wall:.1f} tok/s steps {len(LOG)} tok/step {tokens/max(1,len(LOG)):.3f}")
for s in sorted(h):
    n, o, sec = h[s]
    print(f"  size {s}: steps {n} out/step {o/n:.2f} ms {sec/n*1e3:.1f}")
json.dump(texts, open(f"/tmp/texts-{mode}-{dtype}.json", "w"))
