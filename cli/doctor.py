"""``freespec doctor``: vLLM version, seam probe report, usable plugins."""
from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="report the installed vLLM and which freespec plugins work")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from freespec.vllm_plugins.doctor import report

    print(report())
    return 0
