"""The adapter stays readable in one sitting (issue 85, item 5): at most 300 lines, its step (``_propose``, what
runs every engine step) at most 40, the rest in named helpers."""
from __future__ import annotations

import ast
from pathlib import Path

ADAPTER = Path(__file__).resolve().parents[1] / "vllm_plugins" / "adapter.py"
MAX_LINES, MAX_STEP_LINES = 300, 40


def test_the_adapter_fits_in_300_lines_and_its_step_in_40():
    text = ADAPTER.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES
    step = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef) and node.name == "_propose"]
    assert len(step) == 1, "the adapter's step is _propose"
    assert step[0].end_lineno - step[0].lineno + 1 <= MAX_STEP_LINES
