"""``freespec datastore``: build, inspect and verify the retrieval proposer's datastores.

    freespec datastore build --tokenizer MODEL --input PATH [PATH ...] --out DIR
                             [--shard-tokens N] [--force] [--skip-bad-records]
    freespec datastore info DIR
    freespec datastore verify DIR

``build`` tokenizes ``.txt`` / ``.jsonl`` / ``.json`` files with the model's own tokenizer (no
special tokens; MODEL is a Hugging Face model id, a model directory or a ``freespec models`` name)
into token shards with suffix arrays (see docs/datastore.md); progress goes to
stderr and the datastore's path is the last line of stdout. ``verify`` recomputes every checksum
and checks suffix-array order; it exits 1 and lists the problems when there are any.
Exit code 2: bad arguments (missing input, unreadable tokenizer, non-empty --out, bad record).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from freespec.cli.arguments import int_in
from freespec.safe_files import printable

DEFAULT_SHARD_TOKENS = 1 << 26


def _log(message: str) -> None:
    print(f"freespec: {printable(message)}", file=sys.stderr, flush=True)


def _error(message: str, code: int = 2) -> int:
    print(f"freespec: error: {printable(message)}", file=sys.stderr, flush=True)
    return code


def _size(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{nbytes} B"  # pragma: no cover


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("datastore", help="build, inspect and verify retrieval datastores",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="datastore_command", required=True)

    build = sub.add_parser("build", help="tokenize text files into a datastore (shards + suffix arrays)")
    build.add_argument("--tokenizer", required=True, metavar="MODEL",
                       help="the target model's tokenizer: a Hugging Face model id (org/name[@revision], "
                            "from the Hugging Face cache, downloaded unless HF_HUB_OFFLINE is set), a local "
                            "model directory, or a `freespec models` test-fixture name")
    build.add_argument("--input", required=True, nargs="+", metavar="PATH",
                       help=".txt (paragraphs), .jsonl or .json (records, chats) files, or directories "
                            "of source code (each file one document)")
    build.add_argument("--roles", nargs="+", metavar="ROLE",
                       help="chat inputs: keep only messages of these roles (e.g. assistant; ShareGPT's "
                            "gpt/human are understood)")
    build.add_argument("--exclude", nargs="+", default=[], metavar="PATH",
                       help="drop every document that shares a run of 12 words with a document of these "
                            "files (keep evaluation questions out, e.g. Spec-Bench's question.jsonl)")
    build.add_argument("--out", required=True, metavar="DIR", help="datastore directory to create")
    build.add_argument("--shard-tokens", type=int_in(2, 2**32 - 1), default=DEFAULT_SHARD_TOKENS, metavar="N",
                       help=f"tokens per shard (default {DEFAULT_SHARD_TOKENS:,}; building needs about "
                            "20 bytes of memory per shard token)")
    build.add_argument("--force", action="store_true", help="replace an existing datastore in DIR")
    build.add_argument("--skip-bad-records", action="store_true",
                       help="skip a record that cannot be read or tokenized (invalid JSON, no text, a lone "
                            "surrogate), naming it, and count them in the summary; without it the build stops "
                            "at the first one, naming its file and line")

    info = sub.add_parser("info", help="summary of a datastore's manifest")
    info.add_argument("dir", metavar="DIR")

    verify = sub.add_parser("verify", help="recompute checksums and check suffix-array order")
    verify.add_argument("dir", metavar="DIR")
    verify.add_argument("--samples", type=int, default=10_000,
                        help="suffix-array neighbours checked per shard (default 10000; all in smaller ones)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return {"build": _build, "info": _info, "verify": _verify}[args.datastore_command](args)
    except KeyboardInterrupt:
        print("\nfreespec: interrupted", file=sys.stderr)
        return 130


# --------------------------------------------------------------------------- build


def load_tokenizer(value: str) -> tuple[Any, str]:
    """The tokenizer ``--tokenizer`` names (a model directory, a ``freespec models`` name or a Hugging
    Face model id, see freespec.model_ref) and the name the manifest records; ValueError naming
    ``--tokenizer`` if it cannot be found or loaded."""
    from freespec.model_ref import resolve_model

    path = resolve_model(value, "--tokenizer", kind="tokenizer")
    local = Path(value).expanduser().is_dir() or path.name == value  # a directory or a fixture name
    name = path.name if local else value  # a hub snapshot's directory is named by its commit hash
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the files are local: transformers must look no further
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ValueError(f"transformers is not installed ({e}); install vllm-freespec[cpu] or [cuda]") \
            from None
    try:
        return AutoTokenizer.from_pretrained(str(path)), name
    except Exception as e:  # transformers raises many kinds (OSError, ValueError, KeyError, ...)
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"--tokenizer: cannot load a tokenizer from {path}: {type(e).__name__}: {detail}") \
            from None


def _build(args: argparse.Namespace) -> int:
    from freespec.proposers.retrieval.datastore import DatastoreError
    from freespec.proposers.retrieval.build import build_datastore
    from freespec.proposers.retrieval.readers import BuildError, canonical_roles, check_input
    from freespec.proposers.vocab import vocab_fingerprint

    try:
        for path in [*args.input, *args.exclude]:  # before the (slow) tokenizer load
            check_input(path)
        canonical_roles(args.roles)
        tok, name = load_tokenizer(args.tokenizer)
    except ValueError as e:
        return _error(str(e))

    def tokenize(texts: list[str]) -> list[list[int]]:
        return tok(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]

    start = time.perf_counter()
    try:
        manifest = build_datastore(
            args.input,
            args.out,
            tokenize,
            tokenizer_name=name,
            fingerprint=vocab_fingerprint(tok.get_vocab()),
            vocab_size=len(tok),
            shard_tokens=args.shard_tokens,
            force=args.force,
            roles=args.roles,
            exclude=args.exclude,
            skip_bad_records=args.skip_bad_records,
        )
    except (BuildError, DatastoreError) as e:
        return _error(str(e))
    except OSError as e:  # disk full, permissions
        return _error(f"building {args.out} failed: {e}", 1)
    seconds = time.perf_counter() - start
    skipped = f", {manifest['skipped_records']:,} bad record(s) skipped" if args.skip_bad_records else ""
    _log(f"{manifest['documents']:,} documents, {manifest['total_tokens']:,} tokens, "
         f"{len(manifest['shards'])} shard(s){skipped} in {seconds:.1f}s "
         f"({manifest['total_tokens'] / max(seconds, 1e-9):,.0f} tokens/s)")
    print(Path(args.out).absolute())
    return 0


# --------------------------------------------------------------------------- info


def _info(args: argparse.Namespace) -> int:
    from freespec.proposers.retrieval.datastore import MANIFEST, DatastoreError, read_manifest

    directory = Path(args.dir)
    if not directory.is_dir():
        return _error(f"{args.dir} is not a directory")
    try:
        manifest = read_manifest(directory)
    except DatastoreError as e:
        return _error(str(e))
    tokenizer = manifest.get("tokenizer") or {}
    shards = manifest.get("shards") or []
    rows = []
    on_disk = (directory / MANIFEST).stat().st_size
    missing = []
    for entry in shards:
        size = 0
        for suffix in ("tokens", "sa"):
            path = directory / f"{entry.get('name')}.{suffix}"
            if path.exists():
                size += path.stat().st_size
            else:
                missing.append(path.name)
        on_disk += size
        rows.append((str(entry.get("name")), f"{int(entry.get('tokens', 0)):,}", _size(size)))
    documents = int(manifest.get("documents", 0))
    p = printable  # every string below comes from the manifest or the file system: escaped
    print(f"datastore   {p(directory.absolute())}")
    print(f"format      {p(manifest.get('format'))} version {p(manifest.get('version'))}")
    print(f"tokenizer   {p(tokenizer.get('name'))} ({p(tokenizer.get('fingerprint'))})")
    print(f"vocab size  {p(manifest.get('vocab_size'))}")
    print(f"documents   {documents:,}")
    print(f"tokens      {int(manifest.get('total_tokens', 0)):,} (including one separator per document)")
    print(f"shards      {len(shards)}")
    print(f"on disk     {_size(on_disk)} ({on_disk:,} bytes)")
    print(f"created     {p(manifest.get('created'))}")
    sources = manifest.get("sources")
    for i, source in enumerate(sources if isinstance(sources, list) else [sources] if sources else []):
        print(f"{'sources' if i == 0 else '':<11} {p(source)}")
    if rows:
        rows = [(p(name), tokens, size) for name, tokens, size in rows]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        for row in rows:
            print(f"  {row[0]:<{widths[0]}}  {row[1]:>{widths[1]}} tokens  {row[2]:>{widths[2]}}")
    if missing:
        _log(f"missing files: {', '.join(missing)} (run `freespec datastore verify {args.dir}`)")
        return 1
    return 0


# --------------------------------------------------------------------------- verify


def _verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from freespec.proposers.retrieval.datastore import Datastore, DatastoreError

    directory = Path(args.dir)
    if not directory.is_dir():
        return _error(f"{args.dir} is not a directory")
    try:
        store = Datastore.open(directory)
    except DatastoreError as e:
        return _error(f"datastore {args.dir} is unusable: {e}", 1)
    total = sum(shard.tokens.nbytes + shard.sa.nbytes for shard in store.shards)
    with tqdm(total=total, desc="verifying", unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
              dynamic_ncols=True) as bar:
        problems = store.verify(samples=args.samples, progress=bar)
    if problems:
        print(f"freespec: datastore {printable(args.dir)} has {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  - {printable(problem)}", file=sys.stderr)
        return 1
    print(f"{printable(directory.absolute())}: ok ({len(store.shards)} shard(s), {store.total_tokens:,} tokens; "
          "checksums and suffix-array order checked)")
    return 0
