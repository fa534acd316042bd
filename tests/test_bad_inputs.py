"""Every bad config and file of ``bad_input_cases`` is refused (or logged) with a message naming the field or
file, never a traceback; the table in docs/reliability.md is ``scripts/bad_inputs.py --markdown``."""
from __future__ import annotations

import pytest
from bad_input_cases import CASES, attempt, shown


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[f"{i:02d}" for i in range(len(CASES))])
def test_a_bad_input_gets_a_message_naming_what_is_wrong(case, tmp_path):
    outcome = attempt(case, tmp_path)
    report = f"{case.what}: {outcome.kind} at {outcome.stage}: {outcome.message}"
    assert outcome.kind != "crash", report
    assert outcome.kind == case.expect, report
    assert case.names in shown(outcome.message, tmp_path), report
