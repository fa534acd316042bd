"""Time the whole adapter call for a batch of ROWS requests, as the engine makes it at that load, against the
part the adapter counts as the proposer's (``propose_seconds``). Outside the engine, with warm caches.

    python adapter_time.py hybrid 39 100 greedy.jsonl   # greedy.jsonl: scripts/replay_drafts.py --generate

Each step, every row gains its answer's next token; a 0.2 s sleep between steps stands for the engine's
forward pass (about 200 ms at 39 requests on the 2-core EPYC), so the goodput policy sees such steps.
"""
from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import numpy as np

from freespec.vllm_plugins.adapter import FreespecProposer
from freespec.vllm_plugins.frontend import translate

plugin, n_rows, steps, greedy = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
_, extra = translate({"plugin": plugin, "num_speculative_tokens": 8}, None)
adapter = FreespecProposer(SimpleNamespace(
    additional_config=extra, speculative_config=SimpleNamespace(num_speculative_tokens=8),
    model_config=SimpleNamespace(get_vocab_size=lambda: 49152, max_model_len=4096, model="replay", tokenizer=None)))
answers = [json.loads(line) for line in open(greedy)][:n_rows]
tokens = np.zeros((n_rows, 4096), np.int32)  # vLLM's token_ids_cpu
lengths = np.array([len(a["prompt"]) for a in answers])
for i, a in enumerate(answers):
    tokens[i, :lengths[i]] = a["prompt"]


def step(t: int) -> float:
    """One engine step's call into the adapter; its seconds."""
    sampled = []
    for i, a in enumerate(answers):
        token = a["output"][t % len(a["output"])]
        tokens[i, lengths[i]] = token
        lengths[i] += 1
        sampled.append([token])
    started = time.perf_counter()
    adapter.propose(sampled, lengths.copy(), tokens)
    seconds = time.perf_counter() - started
    time.sleep(0.2)
    return seconds


for t in range(20):  # warm-up: the policy's fit, the suffix trees
    step(t)
adapter.stats.propose_seconds = 0.0
total = sum(step(t) for t in range(20, 20 + steps))
print(f"{n_rows} rows: the adapter call {1000 * total / steps:.2f} ms a step, "
      f"counted as the proposer's {1000 * adapter.stats.propose_seconds / steps:.2f} ms")
