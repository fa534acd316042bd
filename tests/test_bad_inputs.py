"""Every bad config and file of ``bad_input_cases`` is refused (or logged) with a message naming the field or
file, never a traceback; the table in docs/reliability.md is ``scripts/bad_inputs.py --markdown``."""
from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from bad_input_cases import CASES, attempt, shown, table_row

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"


@cache
def documented_rows() -> dict[int, str]:
    """The bad-input table's rows in docs/reliability.md, by case number."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and cells[0][2:].isdigit() and line.endswith("` |"):
            rows[int(cells[0][2:])] = line
    return rows


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("number", range(1, len(CASES) + 1), ids=[f"{i:02d}" for i in range(len(CASES))])
def test_a_bad_input_gets_a_message_naming_what_is_wrong(number, tmp_path):
    case = CASES[number - 1]
    outcome = attempt(case, tmp_path)
    message = shown(outcome.message, tmp_path)
    report = f"{case.what}: {outcome.kind} at {outcome.stage}: {outcome.message}"
    assert outcome.kind != "crash", report
    assert outcome.kind == case.expect, report
    assert case.names in message, report
    # The table in docs/reliability.md is this row: a changed message or case shows here.
    assert documented_rows().get(number) == table_row(number, case, outcome, message), (
        "docs/reliability.md is stale: rerun scripts/bad_inputs.py --markdown")


def test_the_documented_table_lists_exactly_the_cases():
    assert sorted(documented_rows()) == list(range(1, len(CASES) + 1)), "rerun scripts/bad_inputs.py --markdown"
