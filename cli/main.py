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
from freespec.cli import bench, datastore, doctor, models, recycle, responses, serve, state


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="freespec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (models, bench, doctor, datastore, responses, recycle, serve, state):
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [serve.COMMAND]:
        return serve.forward(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (OSError, ValueError, TypeError, KeyError, RecursionError, MemoryError) as e:
        # The last net under every subcommand: a file or field nobody foresaw ends in one line, not a
        # traceback (each subcommand names its files and fields before this where it can).
        return fail(e)


def fail(e: BaseException, code: int = 1) -> int:
    """Print ``e`` as one line (the file an ``OSError`` names, cut short; control and bidi characters escaped, as
    a file name or a message may carry them) and return ``code``."""
    from freespec.safe_files import clip, printable

    if isinstance(e, OSError) and e.filename is not None:
        what = f"{clip(str(e.filename))}: {e.strerror or type(e).__name__}"
    else:
        what = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) or not str(e) else str(e)
    print(f"freespec: error: {printable(clip(' '.join(what.split()), 2000))}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
