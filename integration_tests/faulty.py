"""Faults on purpose: proposers that fail (loaded as ``module:Class`` plugins), and a directory made read-only.

The proposers draft like ``copy`` (found through the registry, wherever its module lives) when they do not fail.
"""
from __future__ import annotations

import contextlib
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from freespec.proposers.registry import load_proposer_class
from pydantic import Field

CopyProposer = load_proposer_class("copy")


class FaultyProposer(CopyProposer):
    """The copy proposer, except that every third step raises."""

    calls = 0

    def draft(self, rows, step):
        self.calls += 1
        if self.calls % 3 == 0:
            raise RuntimeError("injected proposer fault")
        return super().draft(rows, step)


class FaultOptions(CopyProposer.Options):
    fault_file: str | None = Field(
        None, description="faults are injected only while this file exists (None: always)"
    )
    raise_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of steps that raise")
    sleep_ms: float = Field(0.0, ge=0.0, le=60_000.0, description="extra time each step takes")
    seed: int = Field(0, description="of the draws deciding which steps raise")


class FaultInjector(CopyProposer):
    """The copy proposer, with faults switched on and off from outside the server (``scripts/fault_injection.py``).

    While ``fault_file`` exists (one ``os.path.exists`` per step), a step raises with probability
    ``raise_rate`` and takes ``sleep_ms`` longer: a proposer that raises in 10% of steps, or one that overruns
    the adapter's ``step_budget_ms``, until the file is removed.
    """

    Options = FaultOptions

    def __init__(self, options: FaultOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        self._draws = random.Random(options.seed)

    def _faulty(self) -> bool:
        return self.options.fault_file is None or os.path.exists(self.options.fault_file)

    def draft(self, rows, step):
        if self._faulty():
            if self.options.sleep_ms:
                time.sleep(self.options.sleep_ms / 1000.0)
            if self._draws.random() < self.options.raise_rate:
                raise RuntimeError("injected proposer fault")
        return super().draft(rows, step)


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[None]:
    """``path`` made read-only, for root too (``chattr +i``; ``chmod`` binds only other users)."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True, capture_output=True)
    else:
        mode = path.stat().st_mode
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(mode)
