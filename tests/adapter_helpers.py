"""A stand-in for the vLLM config the adapter reads (the fields it uses, nothing else), for unit tests."""
from __future__ import annotations

from types import SimpleNamespace

from freespec.vllm_plugins.adapter import FreespecProposer
from freespec.vllm_plugins.frontend import translate


def fake_vllm_config(additional_config: dict, k: int = 4) -> SimpleNamespace:
    return SimpleNamespace(
        additional_config=additional_config,
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(get_vocab_size=lambda: 1000, max_model_len=4096, model="m", tokenizer=None),
    )


def adapter_for(spec: dict) -> FreespecProposer:
    """The adapter vLLM would build for the speculative config ``spec`` (freespec's spelling)."""
    _, extra = translate(spec, None)
    return FreespecProposer(fake_vllm_config(extra, spec["num_speculative_tokens"]))
