"""scripts/step_shape.py: the measuring plugin's draft sizes and records, and the table it prints (the engine run
itself is a measurement, results/issue69-zen3)."""
from __future__ import annotations

import numpy as np
from script_loader import load_script

from freespec.proposers.api import Row, StepContext
from freespec.proposers.base import ProposerOptions

step_shape = load_script("step_shape")


def test_draft_sizes_cycle_and_each_decode_step_is_recorded_with_its_size(tmp_path, monkeypatch):
    out = tmp_path / "steps.txt"
    monkeypatch.setenv(step_shape.OUT_VARIABLE, str(out))
    p = step_shape.WrongDrafts(ProposerOptions(), 3)
    sizes = []
    for i in range(9):
        row = Row(key=1, tokens=np.arange(10 + i, dtype=np.int32), num_new=0 if i == 0 else 1)  # a prefill first
        sizes.append(len(p.draft([row], StepContext())[0].tokens))
    assert sizes == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    recorded = [line.split() for line in out.read_text().splitlines()]
    # the prefill step is not recorded; each later one under the size the step before it scored
    assert [int(n) for n, _ in recorded] == [1, 2, 3, 4, 1, 2, 3, 4]
    two = [Row(key=1, tokens=np.arange(5, dtype=np.int32), num_new=1), Row(key=2, tokens=np.arange(5), num_new=1)]
    assert [d.tokens for d in p.draft(two, StepContext())] == [[], []]  # never a draft in a batch


def test_table_gives_median_and_mean_milliseconds_per_size():
    text = step_shape.table(["1 0.010", "1 0.030", "1 0.020", "2 0.050", ""])
    assert "| 1 | 3 | 20.0 | 20.0 |" in text and "| 2 | 1 | 50.0 | 50.0 |" in text
