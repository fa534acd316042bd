"""Patch ``last_step_cache`` on the real vLLM CPU engine: a conversation's next turn finds every block of the
previous answer in the prefix cache.

Each case is two requests to one engine, as a chat client sends them: a repetitive first turn (greedy,
``hybrid`` drafting every step, ending 1 to 3 tokens past a block boundary), then a second turn whose prompt
is the first turn's prompt, its answer and a few more tokens. vLLM reports how many of the second turn's
tokens came from the prefix cache. Without speculation that is every full block of the first turn but the
last token's (whose KV is never computed): ``block * floor((tokens - 1) / block)``. With the patch the
speculative engine must reach it in every case; with the patch disabled (``FREESPEC_DISABLE_PATCHES``) some
case falls a block short, where the last step's accepted tokens completed a block — so the check can fail.
Blocks of 32 tokens, the CPU backend's smallest.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from integration_tests.conftest import DRAFT_EVERY_STEP, REPO

pytestmark = [pytest.mark.integration, pytest.mark.long]  # two engines, about 3 minutes: CI's matrix job

BLOCK = 32

SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

model, block, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
llm = LLM(model=model, dtype="float32", speculative_config=spec, block_size=block, enable_prefix_caching=True,
          gpu_memory_utilization=0.3, max_model_len=2048, enforce_eager=True, seed=0)
tok = llm.get_tokenizer()
rows = []
for blocks in (5, 6):
    for past in (1, 2, 3):
        # A different first line per case keeps one case's blocks out of another's.
        ask = f"Case {blocks}.{past}. Write the word 'hello' forty times, separated by commas."
        text = tok.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        # The first turn ends 1 to 3 tokens past a block boundary, so a last step that accepted 2 or more
        # drafted tokens completed that block.
        greedy = SamplingParams(max_tokens=blocks * block + past - len(ids), temperature=0.0)
        out = list(llm.generate(TokensPrompt(prompt_token_ids=ids), greedy, use_tqdm=False)[0].outputs[0].token_ids)
        follow = ids + out + tok.encode("\\nNow the same in capitals.", add_special_tokens=False)
        second = llm.generate(TokensPrompt(prompt_token_ids=follow), SamplingParams(max_tokens=1), use_tqdm=False)[0]
        rows.append({"tokens": len(ids) + len(out), "cached": second.num_cached_tokens})
print("RESULT " + json.dumps(rows))
"""


def second_turns(model: str, disable_patch: bool) -> list[dict]:
    spec = {"plugin": "hybrid", "num_speculative_tokens": 8, **DRAFT_EVERY_STEP}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if disable_patch:
        env["FREESPEC_DISABLE_PATCHES"] = "last_step_cache"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, model, str(BLOCK), json.dumps(spec)],
        capture_output=True, text=True, timeout=900, env=env, cwd=REPO,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def without_speculation(tokens: int) -> int:
    """What a second turn finds cached without speculation: every full block but the last token's."""
    return BLOCK * ((tokens - 1) // BLOCK)


def test_every_block_of_the_previous_turn_is_cached_with_the_patch_and_not_without(model_path):
    from freespec.vllm_plugins.probes import last_step_cache_state

    state, detail = last_step_cache_state()  # "fixed": installed in this test process; the engines start afresh
    if state in ("moved", "absent"):
        pytest.skip(f"patch last_step_cache does not apply to this vLLM: {detail}")
    patched = second_turns(model_path, disable_patch=False)
    short = [r for r in patched if r["cached"] < without_speculation(r["tokens"])]
    assert not short, patched
    unpatched = second_turns(model_path, disable_patch=True)
    assert [r["tokens"] for r in unpatched] == [r["tokens"] for r in patched]  # the same greedy text
    assert any(r["cached"] < without_speculation(r["tokens"]) for r in unpatched), unpatched
