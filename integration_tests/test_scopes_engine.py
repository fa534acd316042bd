"""Scopes on the real vLLM CPU engine: each prompt's ``cache_salt`` reaches the worker that drafts (patch
``cache_salt_scope``), and ``copy``'s recent outputs are kept per salt.

One engine (the test reads the adapter's proposer in the worker through ``collective_rpc``) serves
the same prompts under two salts and none; afterwards ``copy`` holds one pool per scope: the two salts' hashes and
the shared scope. With the patch disabled no scope can be read, so nothing is learned across requests (no pool):
the check can fail. The greedy text is the same whatever the salt.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from integration_tests.conftest import DRAFT_EVERY_STEP, REPO

pytestmark = pytest.mark.integration

SCRIPT = """
import gc, json, sys
from vllm import LLM, SamplingParams
from freespec.vllm_plugins.adapter import FreespecProposer

model, spec = sys.argv[1], json.loads(sys.argv[2])
llm = LLM(model=model, dtype="float32", speculative_config=spec, gpu_memory_utilization=0.3, max_model_len=1024,
          enforce_eager=True, seed=0)
greedy = SamplingParams(max_tokens=24, temperature=0.0)
texts = {}
for salt in ("tenant-a", "tenant-b", None):
    prompts = [{"prompt": p, **({"cache_salt": salt} if salt else {})}
               for p in ("Count from one to ten in words.", "Name three colours.")]
    texts[str(salt)] = [o.outputs[0].text for o in llm.generate(prompts, greedy, use_tqdm=False)]
# The adapter hears that a request left at the next step: one more request, so the last ones are released too.
llm.generate([{"prompt": "Hi.", "cache_salt": "tenant-a"}], SamplingParams(max_tokens=2), use_tqdm=False)


def pools(worker=None):
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    found = [drafter] if isinstance(drafter, FreespecProposer) else [
        o for o in gc.get_objects() if isinstance(o, FreespecProposer) and o.proposer is not None]
    if len(found) != 1:
        return f"{len(found)} adapters; worker {type(worker).__name__}, drafter {type(drafter).__name__}"
    return sorted(found[0].proposer._pools)


print("RESULT " + json.dumps({"texts": texts, "pools": llm.collective_rpc(pools)[0]}))
"""


def run(model: str, disable_patch: bool) -> dict:
    spec = {"plugin": "copy", "num_speculative_tokens": 4, **DRAFT_EVERY_STEP}
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # collective_rpc of the script's own function
    if disable_patch:
        env["FREESPEC_DISABLE_PATCHES"] = "cache_salt_scope"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, model, json.dumps(spec)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_each_salt_reaches_the_drafter_and_keeps_its_own_outputs(model_path):
    from freespec.vllm_plugins.request_ids import SHARED_SCOPE, scope_of

    got = run(model_path, disable_patch=False)
    assert got["pools"] == sorted([SHARED_SCOPE, scope_of("tenant-a"), scope_of("tenant-b")]), got
    texts = list(got["texts"].values())
    assert texts[0] == texts[1] == texts[2]  # lossless: the salt changes what is drafted, never the text
    off = run(model_path, disable_patch=True)
    assert off["pools"] == [] and off["texts"] == got["texts"], off
