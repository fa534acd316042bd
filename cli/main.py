"""Entry point of the ``freespec`` command.

Each subcommand lives in its own module that exposes ``add_parser(subparsers)``;
the parser it adds sets ``func`` to the function that runs it.
"""
from __future__ import annotations

import argparse
import sys

from freespec.cli import bench, datastore, doctor, models, recycle


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="freespec", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (models, bench, doctor, datastore, recycle):
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
