"""One ``SpeculatorConfig`` per freespec plugin: vLLM 0.34's registry seam (``speculator_config.py``).

vLLM builds a method's config in every process that parses a speculative config (front-end, engine core,
workers), so this module stays light: it names the speculator by qualified name and never imports it.
``configure`` refuses a bad ``num_speculative_tokens`` and ``apply_options`` a bad ``speculator_options``,
naming the field, before any engine starts (``options.checked_speculator_options``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

from freespec.vllm_plugins.v2.options import PREFIX, check_k, normalized_speculator_options

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig

SPECULATORS = "freespec.vllm_plugins.v2.speculator"
# The plugins whose speculator is a class of its own in ``speculator`` (the others run ``FreespecSpeculator``).
OWN_SPECULATOR = {
    "hybrid": "HybridSpeculator",
    "copy": "CopySpeculator",
    "recycle": "RecycleSpeculator",
    "retrieval": "RetrievalSpeculator",
    "pearl": "PearlSpeculator",
}
# Speculators in modules of their own, with the ``SpeculatorConfig`` behaviour they declare. hybrid's picks, when
# built, vLLM's GPU suffix kernels (which scan each row's history on the device, and whose confidences come from
# acceptance counts, not logits: declared as vLLM's suffix declares them) or the host path.
OTHER_MODULE = {"hybrid": ("freespec.vllm_plugins.v2.suffix_hybrid.HybridV2Speculator",
                           {"prefer_dense_token_history": True, "adaptive_verification_uses_draft_logits": False})}


class FreespecSpeculatorConfig(SpeculatorConfig):
    """A freespec plugin as a V2 method: no draft model, drafting from token history, options of its own."""

    plugin: ClassVar[str] = ""  # the freespec plugin (``freespec.proposers`` entry point) this method runs
    base_method = None  # behaves like no built-in method
    speculator_class = f"{SPECULATORS}.FreespecSpeculator"
    supported_options = frozenset({"speculator_options"})

    @classmethod
    def configure(cls, spec: "SpeculativeConfig") -> None:
        check_k(cls.plugin, spec.num_speculative_tokens)
        super().configure(spec)

    @classmethod
    def apply_options(cls, spec: "SpeculativeConfig") -> None:
        spec.speculator_options = normalized_speculator_options(
            cls.plugin, spec.num_speculative_tokens, spec.speculator_options)


def config_class(plugin: str) -> type[FreespecSpeculatorConfig]:
    """The config of plugin ``plugin``'s method (a new class; ``registry`` registers one per plugin)."""
    speculator, declared = OTHER_MODULE.get(
        plugin, (f"{SPECULATORS}.{OWN_SPECULATOR.get(plugin, 'FreespecSpeculator')}", {}))
    name = f"{''.join(p.title() for p in plugin.split('_'))}SpeculatorConfig"
    return type(name, (FreespecSpeculatorConfig,),
                {**declared, "plugin": plugin, "speculator_class": speculator, "__module__": __name__,
                 "__doc__": f"freespec plugin {plugin!r} as V2 method {PREFIX}{plugin}."})
