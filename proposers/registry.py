"""Find proposers by short name through the ``freespec.proposers`` entry-point group.

freespec's own proposers are declared in its ``pyproject.toml``; a third-party
package adds ``[project.entry-points."freespec.proposers"] name = "pkg.mod:Class"``.
A plugin name of the form ``"pkg.mod:Class"`` loads that class directly, for
proposers that are not installed as a package (experiments, tests). Naming a class
path imports its module, which runs that module's top-level code in the process that
reads the config and in every worker, as vLLM's own ``custom_class`` does: name only
code you trust. The path is checked for its form before anything is imported, and
the class must be a concrete ``Proposer`` subclass (docs/proposer-api.md).
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Optional

from freespec.proposers.base import Proposer, ProposerOptions
from pydantic import Field, field_validator

GROUP = "freespec.proposers"
# ``package.module:Class`` (or ``:Outer.Inner``): dotted Python identifiers on both sides of one colon.
_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class UnknownPluginError(ValueError):
    pass


def available_plugins() -> dict[str, str]:
    """Short name -> ``module:Class`` for every registered proposer."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def load_proposer_class(name: str) -> type[Proposer]:
    """The proposer class a plugin name names: a registered short name, or a ``package.module:Class`` path.

    Refused with ``UnknownPluginError`` naming it: a name of another form, one nothing registers, a module
    that cannot be imported (whatever its code raises), and anything that is not a concrete ``Proposer``
    subclass (``Proposer.is_concrete``).
    """
    if not isinstance(name, str) or not name:
        raise UnknownPluginError(f"freespec plugin name must be a non-empty string, got {name!r}")
    if ":" in name:
        if not _CLASS_PATH.fullmatch(name):
            raise UnknownPluginError(
                f"freespec plugin {name[:200]!r} is neither a registered name nor a class path of the form "
                "'package.module:Class'")
        target = EntryPoint(name=name, value=name, group=GROUP)
    else:
        target = next((ep for ep in entry_points(group=GROUP) if ep.name == name), None)
    if target is None:
        known = ", ".join(sorted(available_plugins())) or "none installed"
        raise UnknownPluginError(f"unknown freespec plugin {name[:200]!r}; available plugins: {known}")
    try:
        cls = target.load()
    except Exception as e:  # whatever the module's code raises: the config is refused, naming it
        raise UnknownPluginError(f"freespec plugin {name!r} ({target.value}) cannot be loaded: "
                                 f"{type(e).__name__}: {str(e)[:300]}") from e
    if not (isinstance(cls, type) and issubclass(cls, Proposer)):
        raise UnknownPluginError(f"freespec plugin {name!r} ({target.value}) is not a freespec Proposer subclass")
    if not cls.is_concrete():
        raise UnknownPluginError(
            f"freespec plugin {name!r} ({target.value}) is abstract: a plugin implements draft(rows, step) "
            "(docs/proposer-api.md)")
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
