"""Entry point of the ``freespec`` command.

Each subcommand lives in its own module that exposes ``add_parser(subparsers)``;
the parser it adds sets ``func`` to the function that runs it. ``freespec serve
ARGS`` hands ARGS to ``vllm serve`` untouched, before freespec parses anything
(so ``--help`` after it is vLLM's).
"""
from __future__ import annotations

import argparse
import sys

from freespec import __version__
from freespec.cli import bench, datastore, doctor, models, recycle, responses, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="freespec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (models, bench, doctor, datastore, responses, recycle, serve):
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [serve.COMMAND]:
        return serve.forward(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
