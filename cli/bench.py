"""``freespec bench``: its command line. The benchmark itself is the library ``freespec.bench``
(``freespec.bench.run`` drives it); this module parses the arguments and calls it."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from freespec.bench.options import BenchOptions
from freespec.bench.run import run as run_bench
from freespec.bench.workloads import CHOICES, SPECBENCH, SUITE, WORKLOADS
from freespec.bench.workloads.runner import REPEAT_MODES
from freespec.cli.arguments import int_in
from freespec.questions import BUILTIN, ENV_PATH, SPEC_BENCH_URL

POSITIVE = int_in(1)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The parsed command line as the library's options (argparse's extras, such as ``func``, left out)."""
    names = {f.name for f in dataclasses.fields(BenchOptions)}
    return BenchOptions(**{k: v for k, v in vars(args).items() if k in names})


def run(args: argparse.Namespace) -> int:
    return run_bench(options_from_args(args))


DESCRIPTION = (
    "Compare speculative-decoding configs (none, ngram, suffix, freespec plugins) on the same "
    "Spec-Bench prompts (or multi-turn workloads: --workload), one vLLM server per config, and write "
    "results.json/.md/.png."
)


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--questions",
                   help=f"a Spec-Bench-style question.jsonl, or '{BUILTIN}' for freespec's own prompt "
                        f"set (default: ${ENV_PATH}, else Spec-Bench cached under ~/.cache/freespec, else "
                        f"downloaded there from {SPEC_BENCH_URL}, else the built-in set)")
    p.add_argument("--workload", nargs="+", choices=CHOICES, metavar="WORKLOAD",
                   help=f"what to measure: {SPECBENCH} (default: Spec-Bench-style questions), or multi-turn "
                        f"workloads built from this machine's material, each its own table: "
                        f"{', '.join(WORKLOADS)}, or {SUITE} (all of them; chat only where ShareGPT data is "
                        f"installed)")
    p.add_argument("--sessions", type=POSITIVE, help="workloads: sessions per workload (default %(default)s)")
    p.add_argument("--turns", type=POSITIVE,
                   help="workloads: user turns per session; tool-loop: model turns (default %(default)s)")
    p.add_argument("--source-chars", type=POSITIVE,
                   help="code-edit, tool-loop: the source file trimmed to this many characters, whole "
                        "statements (default %(default)s)")
    p.add_argument("--context-chars", type=POSITIVE,
                   help="rag: the document's characters; chat: a conversation's human turns at most "
                        "(default %(default)s)")
    p.add_argument("--repeat-traffic", nargs="+", choices=REPEAT_MODES, metavar="MODE",
                   help="workloads: the same sessions again after the first pass, once per MODE: same (the "
                        "same server), restart (after stopping and starting it), replica (on a second server "
                        "of the same config), tenant (the same server right after the first pass, sent with "
                        "another cache_salt: what one tenant's traffic gives another), cold-tenant (the tenant "
                        "row's reference: a third cache_salt on a fresh second server that first served other "
                        "sessions); each its own rows")
    p.add_argument("--chat-data", help="chat: a ShareGPT .json/.jsonl (default: an installed *sharegpt* package's)")
    p.add_argument("--categories", help="comma-separated categories (default: all in the file)")
    p.add_argument("--per-category", type=POSITIVE, nargs="+",
                   help="questions per category, the first ones in file order (default: all); one value, "
                        "or one per concurrency level (e.g. --concurrency 1 4 16 39 --per-category 1 2 3 3)")
    p.add_argument("--max-tokens", type=POSITIVE, help="completion tokens per request (default %(default)s)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, help="server --seed and per-request seed")
    p.add_argument("--concurrency", type=POSITIVE, nargs="+",
                   help="one or more numbers of requests in flight, e.g. --concurrency 1 8")
    p.add_argument("--dtype",
                   help="the model's dtype (default: what fits this machine: on a CPU build of vLLM, "
                        "bfloat16 where the CPU has it natively (AMX or AVX512-BF16), else float32; on a GPU, "
                        "vLLM's auto)")
    p.add_argument("--model",
                   help="model path or name (default: freespec's prepared model; with --base-url, the first "
                        "model the server lists)")
    p.add_argument("--configs", nargs="+",
                   help="configs to compare: none, ngram, suffix, draft_model:{\"model\": DRAFT}, ngram-table, "
                        "suffix-table, draft_model-table (vLLM's method "
                        "with its batch-size table num_speculative_tokens_per_batch_size, default "
                        "[[1,4,K],[5,12,K/2],[13,512,0]]), or a freespec plugin, optionally with JSON "
                        "options, e.g. --configs none ngram 'copy:{\"min_match\":3}' "
                        "(comma-separated also works), or a whole plugin config as JSON, e.g. "
                        "'{\"plugin\": \"mypackage.drafts:MyProposer\"}'; "
                        "none is always run as the baseline")
    p.add_argument("--num-speculative-tokens", type=POSITIVE,
                   help="K for every speculative config (default %(default)s)")
    p.add_argument("--warmup", type=int,
                   help="warm-up requests per server before measuring, "
                        "from questions that are not measured (default %(default)s)")
    p.add_argument("--out", help="output folder (default: bench_results/<timestamp>)")
    p.add_argument("--port", type=int, help="server port (default: a free one)")
    p.add_argument("--max-model-len", type=POSITIVE, help="the servers' --max-model-len (default %(default)s)")
    p.add_argument("--gpu-memory-utilization", type=float,
                   help="share of GPU memory each server may take; on a CPU build of vLLM, the share of RAM "
                        "(default: on a CPU build 0.3, more for a local model whose weights need it, at most 0.8 of the "
                        "free share of RAM; "
                        "vLLM's own on a GPU)")
    p.add_argument("--server-args", help="extra arguments for `vllm serve`, one string")
    p.add_argument("--server-timeout", type=float,
                   help="seconds to wait for /health (default %(default)s)")
    p.add_argument("--request-timeout", type=float, help="seconds per request (default %(default)s)")
    p.add_argument("--reuse-server", action="store_true",
                   help="one server per config for all concurrency levels (faster; proposers that remember "
                        "earlier requests then see every prompt again) instead of a fresh one per level")
    p.add_argument("--interleave", action="store_true",
                   help="start every config's server at once (each with its share of the memory) and run each "
                        "block (a category at concurrency 1, all questions above it) on every config in turn, so "
                        "the configs' samples are seconds apart and a machine whose speed drifts slows them "
                        "alike; one server per config for all levels, as with --reuse-server")
    p.add_argument("--repeats", type=POSITIVE,
                   help="measure each concurrency level N times back to back on the same server, after the "
                        "warm-up, with the same questions (default %(default)s); tok/s is then the mean, with the "
                        "spread, and the ratio to none gets an interval")
    p.add_argument("--rounds", type=POSITIVE,
                   help="run the whole config list R times, fresh servers each round, so that the samples "
                        "of each config interleave in time with the others', in blocks of 4 that give every "
                        "config the same mean position and never run one config twice in a row; use 4 or 8 "
                        "(default %(default)s)")
    p.add_argument("--new-questions-per-level", action="store_true",
                   help="each concurrency level gets the next --per-category questions of each category "
                        "(with --reuse-server: a load sweep on one warm server that never sees a measured "
                        "prompt twice)")
    p.add_argument("--base-url", nargs="+", metavar="URL",
                   help="measure servers that are already running (e.g. http://gpu-box:8000) instead of "
                        "starting any; their /metrics give the acceptance figures. Name each with --label; "
                        "a server labelled none is the baseline of the others")
    p.add_argument("--label", nargs="+",
                   help="with --base-url: the config name of each server as the tables show it, e.g. hybrid")
    # The defaults are the library's (BenchOptions), so the command line and the library agree.
    p.set_defaults(**dataclasses.asdict(BenchOptions()), func=run)
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
