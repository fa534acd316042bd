"""``freespec doctor``: vLLM version, seam probe report, each patch's state, usable plugins, plugins other packages
install."""
from __future__ import annotations

import argparse
import json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="report the installed vLLM and which freespec plugins work")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from freespec.safe_files import printable
    from freespec.vllm_plugins.doctor import diagnose, report

    data = diagnose()  # it names other packages' entry points: their metadata files' text, escaped
    print(json.dumps(data, indent=2) if args.json else printable(report(data), newlines=True))
    return 0
