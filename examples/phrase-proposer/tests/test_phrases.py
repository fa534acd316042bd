"""The phrases plugin, tested only with freespec's kit (freespec.testing), as a plugin author's CI would.

    pip install .                       # the plugin, as users get it (not editable)
    pytest -m "not engine"              # seconds: options, the circuit breaker, an offline replay
    pytest -m "engine and not slow"     # a few minutes on a CPU: greedy identity on a real vLLM engine
"""
from __future__ import annotations

import pytest

from freespec.testing import (
    assert_breaker_engages,
    assert_greedy_identity,
    assert_refuses,
    assert_sampling_distribution,
    replay_tokens_per_forward,
)
from freespec.testing.engines import CODE

PLUGIN = "phrases"  # the entry point this package registers: how vLLM's config names it
PHRASE = [11, 12, 13, 14, 15, 16, 17, 18]  # token ids (below the kit's stand-in vocabulary of 1000)


def test_bad_options_are_refused_at_start_naming_the_field():
    assert_refuses(PLUGIN, {}, "phrases")  # required
    assert_refuses(PLUGIN, {"phrases": []}, "phrases")
    assert_refuses(PLUGIN, {"phrases": [PHRASE], "min_match": 0}, "min_match")
    assert_refuses(PLUGIN, {"phrases": [PHRASE], "chance": 1.5}, "chance")
    assert_refuses(PLUGIN, {"phrases": [PHRASE], "min_mach": 2}, "min_mach")  # a typo: unknown option
    # checked when the engine starts (bind), against the model's vocabulary
    assert_refuses(PLUGIN, {"phrases": [[1, 5000]]}, "phrases", vocab_size=1000, match="outside")


def test_a_raising_or_stalling_plugin_never_stops_the_server():
    text = ([1, 2, 3] + PHRASE) * 40  # a request that keeps repeating the phrase, so the plugin drafts
    assert_breaker_engages(PLUGIN, {"phrases": [PHRASE]}, tokens=text)


def test_replay_saves_target_forwards_where_outputs_repeat_a_phrase():
    recorded = [{"prompt": [1, 2, 3], "output": ([4, 5] + PHRASE) * 6},
                {"prompt": [1, 2, 3], "output": [4, 5, 6, 7] * 12}]
    with_phrase = replay_tokens_per_forward(PLUGIN, {"phrases": [PHRASE]}, recorded, k=6, vocab_size=1000)
    elsewhere = replay_tokens_per_forward(PLUGIN, {"phrases": [[900, 901, 902]]}, recorded, k=6, vocab_size=1000)
    assert elsewhere == 1.0  # never drafts: one token per forward, as without speculation
    assert with_phrase > 1.4  # 1.48: 60 of its 108 tokens repeat the phrase
    # the policy's price of a draft token cuts drafts the plugin is not sure of (chance 0.5: 0.5, 0.25, ...)
    priced = replay_tokens_per_forward(PLUGIN, {"phrases": [PHRASE], "chance": 0.5}, recorded, k=6,
                                      token_cost=0.3, vocab_size=1000)
    assert 1.0 < priced < with_phrase


FOX = "The quick brown fox jumps over the lazy dog."


@pytest.mark.engine
def test_greedy_text_is_the_text_without_speculation():
    run = assert_greedy_identity(
        PLUGIN, {"phrases": [FOX]},
        prompts=[f"Repeat this sentence three times: {FOX}", "Name three colours."],
        max_tokens=48,
    )
    assert run["spec"].get("vllm:spec_decode_num_accepted_tokens", 0) > 0  # the phrase was drafted and accepted


@pytest.mark.engine
@pytest.mark.slow
def test_sampling_has_the_distribution_of_no_speculation():
    # The kit's sampled prompt asks to copy a short Python file (CODE): its lines are the phrases.
    lines = [line.strip() for line in CODE.splitlines() if line.strip()]
    assert_sampling_distribution(PLUGIN, {"phrases": lines})
