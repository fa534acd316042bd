"""A stand-in for the vLLM config the adapter reads, for unit tests: freespec.testing's, the kit plugin authors use."""
from __future__ import annotations

from freespec.testing.adapter_checks import adapter_for, fake_vllm_config

__all__ = ["adapter_for", "fake_vllm_config"]
