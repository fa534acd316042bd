"""Argument types shared by the CLI's subcommands."""
from __future__ import annotations

import argparse
from typing import Callable, Optional


def int_in(low: int, high: Optional[int] = None) -> Callable[[str], int]:
    """An argparse ``type`` for an integer from ``low`` to ``high`` (no upper bound when None); ``_`` may group
    digits (``100_000``). Anything else is refused with the range in the message."""
    def parse(value: str) -> int:
        try:
            n = int(value.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
        if high is None and n < low:
            raise argparse.ArgumentTypeError(f"must be {low:,} or more, not {n:,}")
        if high is not None and not low <= n <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:,} and {high:,}, not {n:,}")
        return n
    return parse
