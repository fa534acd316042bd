"""freespec's test kit for proposer plugins: plain functions to call from any pytest test.

    from freespec.testing import (assert_breaker_engages, assert_greedy_identity, assert_refuses,
                                  assert_sampling_distribution, replay_tokens_per_forward)

A plugin is given as its registered name (``freespec.proposers`` entry point), ``"module:Class"``, or the
class. Engine checks (real vLLM, the SmolLM2 fixture unless ``model=`` names another; minutes on a CPU):

- ``assert_greedy_identity``: greedy text identical to decoding without speculation (float32; a divergence on
  a numerical tie of the target's top-2 is allowed);
- ``assert_sampling_distribution``: at temperature > 0, the same distribution as without speculation.

Checks without an engine (milliseconds to seconds):

- ``assert_refuses``: bad options stop the server at start, with a message naming the field;
- ``assert_breaker_engages``: the plugin raising or stalling never stops the server, the circuit breaker
  switches it off, and it is tried again after its back-off;
- ``replay_tokens_per_forward``: tokens per target forward of the plugin's drafts over recorded greedy outputs.

Walk-through: docs/write-a-proposer.md; the contract: docs/proposer-api.md.
"""
from freespec.testing.adapter_checks import adapter_for, assert_breaker_engages, assert_refuses, fake_vllm_config
from freespec.testing.engines import (
    EngineRuns,
    assert_greedy_identity,
    assert_lossless_greedy,
    assert_same_distribution,
    assert_sampling_distribution,
    default_model,
)
from freespec.testing.replay import read_recorded, replay, replay_tokens_per_forward

__all__ = [
    "EngineRuns", "adapter_for", "assert_breaker_engages", "assert_greedy_identity", "assert_lossless_greedy",
    "assert_refuses", "assert_same_distribution", "assert_sampling_distribution", "default_model",
    "fake_vllm_config", "read_recorded", "replay", "replay_tokens_per_forward",
]
