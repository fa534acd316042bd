"""Find proposers by short name through the ``freespec.proposers`` entry-point group.

freespec's own proposers are declared in its ``pyproject.toml``; a third-party
package adds ``[project.entry-points."freespec.proposers"] name = "pkg.mod:Class"``.
A plugin name of the form ``"pkg.mod:Class"`` loads that class directly, for
proposers that are not installed as a package (experiments, tests).
"""
from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from freespec.proposers.base import Proposer

GROUP = "freespec.proposers"


class UnknownPluginError(ValueError):
    pass


def available_plugins() -> dict[str, str]:
    """Short name -> ``module:Class`` for every registered proposer."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def load_proposer_class(name: str) -> type[Proposer]:
    if ":" in name:
        target = EntryPoint(name=name, value=name, group=GROUP)
    else:
        target = next((ep for ep in entry_points(group=GROUP) if ep.name == name), None)
    if target is None:
        known = ", ".join(sorted(available_plugins())) or "none installed"
        raise UnknownPluginError(f"unknown freespec plugin {name!r}; available plugins: {known}")
    try:
        cls = target.load()
    except (ImportError, AttributeError) as e:
        raise UnknownPluginError(f"freespec plugin {name!r} ({target.value}) cannot be loaded: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Proposer)):
        raise UnknownPluginError(f"freespec plugin {name!r} ({target.value}) is not a freespec Proposer subclass")
    return cls
