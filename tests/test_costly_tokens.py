"""Issue 69: the default (`hybrid`) must not draft worse than vLLM's `suffix` where a verified draft token is
expensive (a tenth of a plain step: a Zen 3 CPU in float32, results/hybrid-vs-suffix-costly-tokens).

A deterministic replay (scripts/replay_drafts.py, no engine) of SmolLM2-135M's greedy answers to 18 turns of
`freespec bench --workload agent-suite` (code edits, tool loops, RAG; tests/data/issue69_agent_turns.jsonl),
one proposer for all turns as one server. `hybrid` drafts at the bar the goodput policy settles on at that
price (``AtPolicyBar``); the modeled speed counts a step verifying d draft tokens as 1 + cost * d plain steps.
Source pricing is off: without an engine it times the sources against the replay's own loop and can pause
`suffix` at random, where in the engine `suffix` costs under ``CHEAP_SHARE`` of a step and is never paused.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script

pytest.importorskip("arctic_inference")
replay_drafts = load_script("replay_drafts")

from freespec.proposers.api import EngineInfo  # noqa: E402
from freespec.proposers.suffix_tree import available  # noqa: E402
from freespec.testing.replay import read_recorded  # noqa: E402

if not available()[0]:
    pytest.skip(f"the suffix source cannot run here: {available()[1]}", allow_module_level=True)

TURNS = Path(__file__).parent / "data" / "issue69_agent_turns.jsonl"
K = 8
COSTLY, CHEAP = 0.10, 0.03  # a draft token's cost in plain steps: Zen 3 float32 on one core; a cheap machine
# The proposed rule (issue 69): past its match, a suffix chain is accepted about one time in five, so the suffix
# source's cap on a chain's length (max_spec_factor, tokens per matched token) is PAST_MATCH / bar, between 1
# (vLLM's) and the option's value (4).
PAST_MATCH = 0.2


def modeled(make, cost: float) -> float:
    """Output tokens per modeled plain step over all turns, one proposer for them all."""
    proposer = make(cost)
    tokens = spent = 0.0
    for key, turn in enumerate(read_recorded(TURNS)):
        observed = getattr(proposer, "observed", None)
        n, _, steps = replay_drafts.replay(proposer, key, turn["prompt"], turn["output"], cost, on_draft=observed)
        tokens, spent = tokens + n, spent + steps
    return tokens / spent


def vllm_suffix(cost: float):
    return replay_drafts.VllmSuffix(K)


def hybrid(cost: float):
    """The default plugin at the policy's bar for ``cost``."""
    from freespec.proposers.hybrid import HybridProposer

    proposer = HybridProposer(HybridProposer.Options(price_sources=False), K)
    proposer.bind(EngineInfo(vocab_size=49152, model=""))
    return replay_drafts.AtPolicyBar(proposer, cost)


def hybrid_with_the_proposed_rule(cost: float):
    """``hybrid`` with the suffix source's cap set by the price (``PAST_MATCH / bar``), applied from outside."""
    at = hybrid(cost)
    source = at.proposer.sources["suffix"]
    speculate, most = source.cache.speculate, source.options.max_spec_factor

    def capped(key, context, max_spec_tokens=None, max_spec_factor=1.0, min_token_prob=0.1, **kw):
        factor = min(most, max(1.0, PAST_MATCH / max(at.token_cost, 1e-9)))
        return speculate(key, context, max_spec_tokens=max_spec_tokens, max_spec_factor=factor,
                         min_token_prob=min_token_prob, **kw)

    source.cache.speculate = capped
    return at


@pytest.mark.skip(reason="needs the issue-69 fix")
def test_the_default_drafts_at_least_as_well_as_vllm_suffix_where_tokens_are_expensive():
    # Today: 2.173 against 2.260 (0.96x): hybrid drafts 4.0 tokens a step at 52% accepted, suffix 3.3 at 63%.
    assert modeled(hybrid, COSTLY) >= modeled(vllm_suffix, COSTLY)


def test_the_proposed_rule_beats_vllm_suffix_where_tokens_are_expensive_and_keeps_the_cheap_gain():
    # The replay's evidence for the fix, pinned (results/hybrid-vs-suffix-costly-tokens): 2.281 against
    # vLLM suffix's 2.260 at a tenth of a step; 2.799 against today's 2.754 at 0.03.
    assert modeled(hybrid_with_the_proposed_rule, COSTLY) >= modeled(vllm_suffix, COSTLY)
    assert modeled(hybrid_with_the_proposed_rule, CHEAP) >= modeled(hybrid, CHEAP)
