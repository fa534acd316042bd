"""``freespec bench``: its command line. The benchmark itself is the library ``freespec.bench``
(``freespec.bench.run`` drives it); this module parses the arguments and calls it."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from freespec.bench.configs import DEFAULT_CONFIGS
from freespec.bench.options import BenchOptions
from freespec.bench.run import run as run_bench
from freespec.questions import BUILTIN, ENV_PATH, SPEC_BENCH_URL


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The parsed command line as the library's options (argparse's extras, such as ``func``, left out)."""
    names = {f.name for f in dataclasses.fields(BenchOptions)}
    return BenchOptions(**{k: v for k, v in vars(args).items() if k in names})


def run(args: argparse.Namespace) -> int:
    return run_bench(options_from_args(args))


DESCRIPTION = (
    "Compare speculative-decoding configs (none, ngram, suffix, freespec plugins) on the same "
    "Spec-Bench prompts, one vLLM server per config, and write results.json/.md/.png."
)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--questions", default=None,
                   help=f"a Spec-Bench-style question.jsonl, or '{BUILTIN}' for freespec's own prompt "
                        f"set (default: ${ENV_PATH}, else Spec-Bench cached under ~/.cache/freespec, else "
                        f"downloaded there from {SPEC_BENCH_URL}, else the built-in set)")
    p.add_argument("--categories", default=None, help="comma-separated categories (default: all in the file)")
    p.add_argument("--per-category", type=_positive_int, nargs="+", default=None,
                   help="questions per category, the first ones in file order (default: all); one value, "
                        "or one per concurrency level (e.g. --concurrency 1 4 16 39 --per-category 1 2 3 3)")
    p.add_argument("--max-tokens", type=_positive_int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="server --seed and per-request seed")
    p.add_argument("--concurrency", type=_positive_int, nargs="+", default=[1],
                   help="one or more numbers of requests in flight, e.g. --concurrency 1 8")
    p.add_argument("--dtype", default=None,
                   help="the model's dtype (default: what fits this machine: on a CPU build of vLLM, "
                        "bfloat16 where the CPU has it natively (AMX or AVX512-BF16), else float32; on a GPU, "
                        "vLLM's auto)")
    p.add_argument("--model", default=None,
                   help="model path or name (default: freespec's prepared model; with --base-url, the first "
                        "model the server lists)")
    p.add_argument("--configs", nargs="+", default=[",".join(DEFAULT_CONFIGS)],
                   help="configs to compare: none, ngram, suffix, or a freespec plugin, optionally with JSON "
                        "options, e.g. --configs none ngram 'copy:{\"min_match\":3}' "
                        "(comma-separated also works); "
                        "none is always run as the baseline")
    p.add_argument("--num-speculative-tokens", type=_positive_int, default=8,
                   help="K for every speculative config (default 8)")
    p.add_argument("--warmup", type=int, default=4,
                   help="warm-up requests per server before measuring, "
                        "from questions that are not measured (default 4)")
    p.add_argument("--out", default=None, help="output folder (default: bench_results/<timestamp>)")
    p.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    p.add_argument("--max-model-len", type=_positive_int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="share of GPU memory each server may take (default: vLLM's own; not passed to a CPU "
                        "build of vLLM, which ignores it)")
    p.add_argument("--server-args", default="", help="extra arguments for `vllm serve`, one string")
    p.add_argument("--server-timeout", type=float, default=900.0,
                   help="seconds to wait for /health (default 900)")
    p.add_argument("--request-timeout", type=float, default=900.0, help="seconds per request (default 900)")
    p.add_argument("--reuse-server", action="store_true",
                   help="one server per config for all concurrency levels (faster; proposers that remember "
                        "earlier requests then see every prompt again) instead of a fresh one per level")
    p.add_argument("--repeats", type=_positive_int, default=1,
                   help="measure each concurrency level N times back to back on the same server, after the "
                        "warm-up, with the same questions (default 1); tok/s is then the mean, with the "
                        "spread, and the ratio to none gets an interval")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="run the whole config list R times, fresh servers each round, so that the samples "
                        "of each config interleave in time with the others' (default 1)")
    p.add_argument("--new-questions-per-level", action="store_true",
                   help="each concurrency level gets the next --per-category questions of each category "
                        "(with --reuse-server: a load sweep on one warm server that never sees a measured "
                        "prompt twice)")
    p.add_argument("--base-url", nargs="+", default=None, metavar="URL",
                   help="measure servers that are already running (e.g. http://gpu-box:8000) instead of "
                        "starting any; their /metrics give the acceptance figures. Name each with --label; "
                        "a server labelled none is the baseline of the others")
    p.add_argument("--label", nargs="+", default=None,
                   help="with --base-url: the config name of each server as the tables show it, e.g. hybrid")
    p.set_defaults(func=run)
    return p


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="benchmark speculative-decoding configs against stock vLLM on Spec-Bench prompts",
        description=DESCRIPTION,
    )
    return configure_parser(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="freespec bench", description=DESCRIPTION)
    configure_parser(parser)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
