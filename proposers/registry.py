"""Find proposers by short name through the ``freespec.proposers`` entry-point group.

freespec's own proposers are declared in its ``pyproject.toml``; a third-party
package adds ``[project.entry-points."freespec.proposers"] name = "pkg.mod:Class"``.
A plugin name of the form ``"pkg.mod:Class"`` loads that class directly, for
proposers that are not installed as a package (experiments, tests).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Optional

from freespec.proposers.base import Proposer, ProposerOptions
from pydantic import Field, field_validator

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


def load_options(name: str, raw: Mapping[str, Any]) -> ProposerOptions:
    """``raw`` validated by plugin ``name``'s Options (pydantic's ValidationError names each bad field)."""
    return load_proposer_class(name).Options.model_validate(dict(raw))


def build_proposer(name: str, raw: Mapping[str, Any], num_speculative_tokens: int) -> Proposer:
    """Plugin ``name`` with its options ``raw``: how a proposer builds the proposers it uses as sources."""
    return load_proposer_class(name)(load_options(name, raw), num_speculative_tokens)


# The key users know the source by, ``copy``, shadows pydantic's deprecated ``BaseModel.copy()``, which
# options (frozen) never call; declared once here, so the warning pydantic gives for it is silenced once.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message='Field name "copy"', category=UserWarning)

    class CopySourceOptions(ProposerOptions):
        """Options of a proposer that drafts from the request's context with plugin ``copy`` as a source."""

        copy: Optional[dict[str, Any]] = Field(None, description="options of the copy source (plugin `copy`)")

        @field_validator("copy")
        @classmethod
        def _copy_options(cls, raw: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
            if raw is not None:
                load_options("copy", raw)  # a bad field fails as ``copy.min_match``
            return raw
