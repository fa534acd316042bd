"""Measure the retrieval proposer's query cost against datastore size (no engine needed).

Builds (or reuses) datastores of the given sizes from Spec-Bench text tokenized with the
model's tokenizer, tiled to the size with 5% of tokens replaced at random (so the corpus is
not one text repeated verbatim), with ``freespec.proposers.retrieval.build``; then times
``RetrievalProposer.propose`` on batches of requests whose contexts are Spec-Bench questions
(their tails are the lookup patterns), and reports microseconds per request per step.

    .venv/bin/python scripts/retrieval_cost.py --sizes 1e6 1e7 1e8 --batch 1 32 --work /tmp/retrieval-cost
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from freespec.questions import resolve_questions

from freespec.proposers.base import EngineInfo, Row
from freespec.proposers.retrieval.datastore import Datastore
from freespec.proposers.retrieval.proposer import RetrievalOptions, RetrievalProposer


def spec_bench_tokens(questions: str | None, model: str) -> tuple[list[np.ndarray], object]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    docs = [x.prompt for x in resolve_questions(questions, log=print).questions]
    return [np.array(tok(d, add_special_tokens=False)["input_ids"], dtype=np.uint32) for d in docs], tok


def build(out: Path, size: int, docs: list[np.ndarray], tok, shard_tokens: int) -> None:
    """A datastore of about ``size`` tokens (documents from ``docs``, 5% of tokens replaced).

    The token documents go through the public builder as a JSONL corpus whose texts are the ids
    written as numbers, with a "tokenizer" that reads them back.
    """
    from freespec.proposers.retrieval.build import build_datastore
    from freespec.proposers.vocab import vocab_fingerprint

    rng = np.random.default_rng(size)
    vocab = len(tok)
    corpus = out.parent / f"{out.name}.ids.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    made = 0
    with open(corpus, "w") as f:
        while made < size:
            for d in docs:
                noisy = d.copy()
                flip = rng.random(len(d)) < 0.05
                noisy[flip] = rng.integers(0, vocab, int(flip.sum()))
                f.write(json.dumps({"text": " ".join(map(str, noisy.tolist()))}) + "\n")
                made += len(d) + 1
                if made >= size:
                    break
    build_datastore(
        [corpus], out, lambda batch: [[int(x) for x in t.split()] for t in batch],
        tokenizer_name="cost-test", fingerprint=vocab_fingerprint(tok.get_vocab()),
        vocab_size=vocab, shard_tokens=shard_tokens,
    )
    corpus.unlink()


def measure(store: Path, docs: list[np.ndarray], batch: int, steps: int, k: int, fuse_copy: bool) -> float:
    p = RetrievalProposer(RetrievalOptions(datastore=str(store), fuse_copy=fuse_copy), k)
    p.bind(EngineInfo(vocab_size=0))
    rng = np.random.default_rng(0)
    contexts = [docs[int(i)].astype(np.int32) for i in rng.integers(0, len(docs), size=batch)]
    rows = [Row(i, c, len(c)) for i, c in enumerate(contexts)]
    p.propose(rows)  # compiles the numba functions, first sighting for copy
    times = []
    for step in range(steps):
        # Each step looks up a different tail: one token more of a real question.
        rows = [Row(i, c[: max(4, len(c) - steps + step)], 1) for i, c in enumerate(contexts)]
        t0 = time.perf_counter()
        p.propose(rows)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) / batch * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--shard-tokens", type=int, default=1 << 26)
    ap.add_argument("--work", type=Path, default=Path("/tmp/freespec-retrieval-cost"))
    ap.add_argument("--questions", default=None,
                    help="question.jsonl, or builtin (default: as freespec bench resolves them)")
    ap.add_argument("--model", default=None, help="tokenizer dir (default: the prepared SmolLM2)")
    args = ap.parse_args()
    if args.model is None:
        from freespec.model_store import prepare_model

        args.model = str(prepare_model())
    docs, tok = spec_bench_tokens(args.questions, args.model)
    print("| datastore tokens | shards | batch | retrieval only µs/request/step | with copy fusion µs/request/step |")
    print("|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes):
        store = args.work / f"store-{size}"
        if not (store / "manifest.json").exists():
            t0 = time.perf_counter()
            build(store, size, docs, tok, args.shard_tokens)
            print(f"(built {store} in {time.perf_counter() - t0:.0f} s)", flush=True)
        ds = Datastore.open(store)
        for batch in args.batch:
            alone = measure(store, docs, batch, args.steps, args.k, fuse_copy=False)
            fused = measure(store, docs, batch, args.steps, args.k, fuse_copy=True)
            print(f"| {ds.total_tokens:,} | {len(ds.shards)} | {batch} | {alone:.0f} | {fused:.0f} |", flush=True)


if __name__ == "__main__":
    main()
