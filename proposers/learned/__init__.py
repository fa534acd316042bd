"""Where the ``suffix`` source's learned responses are shared between replicas: the contract of a backend.

A backend keeps this process's learned responses (bounded, per scope) and shares them with the fleet; the
source calls it only from the engine's thread and only through these methods, none of which does I/O or waits:

- ``add(scope, tokens)``: a response this replica finished learning;
- ``take()``: what the fleet brought since the last call (``Learned``): scopes purged, a rebuild after a purge
  of responses, and responses other replicas learned, new here;
- ``close()``: at exit (may wait a bounded time to hand the last responses on).

Backends, by the ``state_dir`` option's form (``is_url``): a folder (``folder_log``: each writer's append-only
segments, one per scope folder) and ``redis://``/``rediss://`` (``redis_stream``: one append-only stream per scope).
Either way a record is appended once by the replica that learned it and a reader reads only what is new. A third
backend is one module with this class's three methods.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

URL_SCHEMES = ("redis://", "rediss://")


def is_url(state_dir: str | None) -> bool:
    """Whether the ``state_dir`` option names a Redis server rather than a folder."""
    return isinstance(state_dir, str) and state_dir.startswith(URL_SCHEMES)


@dataclass
class Learned:
    """What the fleet brought since the last ``take``, applied by the source in this order."""

    forget: list[str] = field(default_factory=list)  # scopes purged: their responses leave the trees
    rebuild: list[tuple[str, np.ndarray]] | None = None  # a purge of responses: the trees are rebuilt from these
    new: list[tuple[str, np.ndarray]] = field(default_factory=list)  # others' responses, oldest first

    def __bool__(self) -> bool:
        return bool(self.forget or self.new) or self.rebuild is not None


class LearnedResponses(ABC):
    """A backend (see the module docstring). Every method runs on the engine's thread and never waits on I/O."""

    @abstractmethod
    def add(self, scope: str, tokens: np.ndarray) -> None: ...

    @abstractmethod
    def take(self) -> Learned: ...

    @abstractmethod
    def close(self) -> None: ...
