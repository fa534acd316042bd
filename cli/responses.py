"""``freespec responses``: start the ``suffix`` source warm, from the model's own answers to prompts you give.

    freespec responses build --model MODEL --prompts PATH [PATH ...] --out FILE
                             [--roles user] [--limit 2000] [--max-tokens 256] [--exclude PATH ...]
                             [--dtype auto] [--max-model-len 4096] [--prompt-tail 16] [--force]

``build`` reads prompts from ``.jsonl`` / ``.json`` / ``.txt`` files (the formats of ``freespec datastore
build``; a chat record gives its ``--roles`` messages, by default the user's), keeps the first ``--limit``
distinct ones of at least 20 characters (and none sharing a run of 12 words with an ``--exclude`` file),
answers each greedily with the model (an offline vLLM, batched, with a progress bar) and writes the answers,
each after its templated prompt's last ``--prompt-tail`` tokens as a server learns them (the suffix source's
``prompt_tail``), as a response store file (its path the last line of stdout). A server loads it with ``"suffix": {"responses_path": FILE}`` (docs/hybrid.md) and
drafts from those answers from its first request; it then adds its own responses to the same file.
Bounds: at most ``--limit`` answers (10,000 at most, the server's default ``max_saved_responses``) of at most
``--max-tokens`` tokens each, the newest 2,000,000 tokens kept (its default ``max_saved_tokens``); 4 bytes a
token on disk. Exit code 2: bad arguments or inputs.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from freespec.cli.arguments import int_in
from freespec.safe_files import printable
from freespec.proposers.suffix_tree import SuffixOptions, with_prompt_tail

MIN_PROMPT_CHARS = 20
# The suffix source's default bounds on its responses file: a file beyond them is refused at load.
MAX_RESPONSES = SuffixOptions.model_fields["max_saved_responses"].default
MAX_STORE_TOKENS = SuffixOptions.model_fields["max_saved_tokens"].default
PROMPT_TAIL = SuffixOptions.model_fields["prompt_tail"].default


def _log(message: str) -> None:
    print(f"freespec: {printable(message)}", file=sys.stderr, flush=True)


def _error(message: str) -> int:
    print(f"freespec: error: {printable(message)}", file=sys.stderr, flush=True)
    return 2


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("responses", help="write a response store of the model's own answers (a warm start)",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="responses_command", required=True)
    build = sub.add_parser("build", help="answer prompts with the model and save the answers as a response store")
    build.add_argument("--model", required=True,
                       help="the served model: a directory, a Hugging Face id or a `freespec models` name")
    build.add_argument("--prompts", nargs="+", required=True, metavar="PATH",
                       help=".jsonl/.json/.txt files or folders of prompts (e.g. your traffic's logged requests)")
    build.add_argument("--out", required=True, metavar="FILE", help="the response store file to write")
    build.add_argument("--roles", nargs="+", default=["user"],
                       help="which messages of a chat record are prompts (default: user)")
    build.add_argument("--limit", type=int_in(1, MAX_RESPONSES), default=2000,
                       help=f"answers to generate, at most {MAX_RESPONSES:,} (default %(default)s)")
    build.add_argument("--max-tokens", type=int_in(1, 4096), default=256,
                       help="tokens per answer at most (default %(default)s)")
    build.add_argument("--exclude", nargs="+", default=[], metavar="PATH",
                       help="files of evaluation data: a prompt sharing a run of 12 words with one is left out")
    build.add_argument("--dtype", default="auto", help="the model's dtype, as vLLM's --dtype (default auto)")
    build.add_argument("--max-model-len", type=int_in(16, 1 << 20), default=4096,
                       help="the engine's context length; longer prompts are skipped (default %(default)s)")
    build.add_argument("--memory", type=float, default=None, metavar="SHARE",
                       help="vLLM's --gpu-memory-utilization (default: as freespec bench, on a CPU build 0.3 of RAM "
                            "or what a larger model needs, vLLM's own on a GPU)")
    build.add_argument("--prompt-tail", type=int_in(0, 256), default=PROMPT_TAIL, metavar="N",
                       help=f"the prompt's last N tokens kept before each answer, as the server's suffix source "
                       f"learns them (its prompt_tail; default {PROMPT_TAIL}; 0: answers only)")
    build.add_argument("--force", action="store_true", help="replace --out if it exists")
    build.set_defaults(func=run_build)


def choose_prompts(texts: Iterable[str], limit: int, keep: Callable[[str], bool] | None = None) -> list[str]:
    """The first ``limit`` distinct prompts (stripped) of at least ``MIN_PROMPT_CHARS`` characters that ``keep`` accepts,
    in input order; reading stops once ``limit`` are found."""
    chosen: dict[str, None] = {}
    for text in texts:
        text = text.strip()
        if len(text) < MIN_PROMPT_CHARS or text in chosen or (keep is not None and not keep(text)):
            continue
        chosen[text] = None
        if len(chosen) == limit:
            break
    return list(chosen)


def run_build(args: argparse.Namespace) -> int:
    from freespec.model_ref import ModelRefError, resolve_model
    from freespec.proposers.learned.response_store import ResponseStore
    from freespec.proposers.retrieval.readers import InputError, check_input, exclusion_filter, iter_documents

    out = Path(args.out)
    if not out.parent.is_dir():
        return _error(f"--out {args.out!r}: directory {str(out.parent)!r} does not exist")
    if out.exists() and not args.force:
        return _error(f"--out {args.out!r} exists (--force replaces it)")
    if args.max_tokens >= args.max_model_len:
        return _error(f"--max-tokens {args.max_tokens} must be less than --max-model-len {args.max_model_len}")
    try:
        model = str(resolve_model(args.model, "--model"))
        for path in [*args.prompts, *args.exclude]:
            check_input(path)
        keep = exclusion_filter(args.exclude, warn=_log) if args.exclude else None
        texts = (t for path in args.prompts for t in iter_documents(path, roles=args.roles, warn=_log))
        prompts = choose_prompts(texts, args.limit, keep)
    except (ModelRefError, InputError, ValueError) as e:
        return _error(str(e))
    if not prompts:
        return _error(f"--prompts: no prompt of {MIN_PROMPT_CHARS} characters or more in {', '.join(args.prompts)}"
                      f" (roles {', '.join(args.roles)})")
    _log(f"answering {len(prompts):,} prompts with {model} (at most {args.max_tokens} tokens each)")
    from freespec.bench.server import default_memory_share
    from freespec.machine import is_cpu_vllm
    from freespec.vllm_plugins.offline_answers import greedy_answers

    cpu = is_cpu_vllm()
    answers = greedy_answers(model, prompts, max_tokens=args.max_tokens, dtype=args.dtype,
                             max_model_len=args.max_model_len, log=_log,
                             memory=default_memory_share(args.memory, cpu, model, args.dtype))
    store = ResponseStore(str(out), fingerprint=answers.fingerprint, vocab_size=answers.vocab_size,
                          max_responses=MAX_RESPONSES, max_tokens=MAX_STORE_TOKENS)
    for prompt, output in zip(answers.prompts, answers.outputs):
        store.add(with_prompt_tail(prompt, output, args.prompt_tail))
    store.save()  # with --force, the old file is replaced atomically, not merged
    _log(f"{out}: {len(store):,} responses, {store.num_tokens:,} tokens; serve with "
         f"'\"suffix\": {{\"responses_path\": \"{out}\"}}' (hybrid)")
    print(out)
    return 0
