"""Run every bad config and file of ``tests/bad_input_cases.py`` and print what the user sees.

No engine is started: each config goes through what vLLM runs before it starts (freespec's front-end)
and, when it passes, the plugin's loader as the adapter calls it at engine start.

    .venv/bin/python scripts/bad_inputs.py             # one line per case
    .venv/bin/python scripts/bad_inputs.py --markdown  # the table in docs/reliability.md

Exits 1 when a case crashed (a traceback instead of a named error) or got through unnoticed.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # integration_tests (fault helpers), bad_input_cases

from bad_input_cases import run_all, table_row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args(argv)
    logging.getLogger("freespec").addHandler(logging.NullHandler())  # warnings are captured per case
    logging.getLogger("freespec").propagate = False
    bad = 0
    if args.markdown:
        print("| # | input | stage | outcome | what the user sees |")
        print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for i, (case, outcome, message) in enumerate(run_all(Path(root)), 1):
            ok = outcome.kind == case.expect and case.names in message
            bad += not ok
            if args.markdown:
                print(table_row(i, case, outcome, message))
            else:
                print(f"{i:2d} {'ok ' if ok else 'BAD'} {outcome.kind:8s} {outcome.stage:12s} {case.what}\n"
                      f"     {message}")
    if bad:
        print(f"{bad} case(s) crashed or were not refused as expected", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
