"""What the kit's checks accept as a plugin: a registered name, a ``module:Class`` path, or the class itself."""
from __future__ import annotations

from typing import Union

from freespec.proposers.base import Proposer

PluginRef = Union[str, type]


def plugin_name(plugin: PluginRef) -> str:
    """The name a speculative config gives for ``plugin``: a string as it is, a class as ``module:Qualname``
    (its module must be importable by that name, as it is for a class defined in a test module)."""
    if isinstance(plugin, str):
        return plugin
    if isinstance(plugin, type) and issubclass(plugin, Proposer):
        if "<locals>" in plugin.__qualname__:
            raise ValueError(f"{plugin.__qualname__} is defined inside a function; define it at module level so "
                             "the engine's processes can import it")
        return f"{plugin.__module__}:{plugin.__qualname__}"
    raise TypeError(f"a plugin is a registered name, 'module:Class' or a Proposer subclass, got {plugin!r}")
