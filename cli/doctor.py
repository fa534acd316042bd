"""``freespec doctor``: vLLM version, seam probe report, each patch's state, usable plugins, plugins other packages
install.

Names and messages in the report come from other packages' metadata and code (entry points, distribution names,
import errors): each value is escaped with ``printable`` before the report is built, so no control or bidi
character reaches the terminal and none (a newline included) can start a line of its own.
"""
from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="report the installed vLLM and which freespec plugins work")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def escaped(value: Any) -> Any:
    """``value`` with every string in it (in dicts' values, lists and tuples) passed through ``printable``:
    one line each. Keys, numbers and booleans stay as they are."""
    from freespec.safe_files import printable

    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(escaped(v) for v in value)
    return value


def run(args: argparse.Namespace) -> int:
    from freespec.safe_files import printable
    from freespec.vllm_plugins.doctor import diagnose, report

    data = diagnose()  # it names other packages' entry points: their metadata files' text, escaped
    # JSON escapes every control character itself (ensure_ascii); the text report, value by value.
    print(json.dumps(data, indent=2) if args.json else printable(report(escaped(data)), newlines=True))
    return 0
