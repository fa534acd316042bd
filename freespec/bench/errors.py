"""The benchmark's errors: problems with the user's input or environment, reported without a traceback."""
from __future__ import annotations


class BenchError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""


class ConfigSpecError(BenchError, ValueError):
    """A ``--configs`` entry that cannot be understood."""
