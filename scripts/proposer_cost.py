"""Measure a freespec proposer's per-step cost through the vLLM adapter (no engine needed).

Feeds the adapter the same arrays vLLM would (``sampled_token_ids``, ``num_tokens_no_spec``,
``token_ids_cpu``) for a batch of requests whose contexts are real text (Spec-Bench questions,
tokenized with the model's tokenizer) of a given length, and times ``propose()`` per step.
Reports microseconds per request per step and the proposer's state size.

For proposers that learn from the target's top-k (``recycle``), each step also
feeds the ``target_topk`` adapter random logits with the row count vLLM would
produce (1 + draft length per request) and makes each request accept a random
prefix of its last draft, so the mapping and the matrix update run as in
serving; the top-k capture (torch on the CPU) is timed separately.

    .venv/bin/python scripts/proposer_cost.py --plugin copy --context 2048 32768 --batch 1 32
    .venv/bin/python scripts/proposer_cost.py --plugin recycle --context 2048 --batch 1 32
"""
from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np

from freespec.questions import resolve_questions

from freespec.vllm_plugins.adapter import FreespecProposer
from freespec.vllm_plugins.frontend import translate


def corpus_tokens(questions: str | None, tokenizer_dir: str, n: int) -> np.ndarray:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = "\n\n".join(x.prompt for x in resolve_questions(questions, log=print).questions)
    ids = np.array(tok(text)["input_ids"], dtype=np.int32)
    reps = -(-n // len(ids))
    return np.tile(ids, reps)[:n] if reps > 1 else ids[:n]


def model_vocab_size(model_dir: str) -> int:
    """The vocabulary size vLLM reports for the model (its config's ``vocab_size``, which the logits have)."""
    import json
    import os

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    return int(config.get("text_config", config)["vocab_size"])


def measure(plugin: str, k: int, context: int, batch: int, steps: int, corpus: np.ndarray, vocab: int) -> dict:
    spec, extra = translate({"plugin": plugin, "num_speculative_tokens": k}, None)
    max_len = context + steps * (k + 1) + 1
    cfg = SimpleNamespace(
        additional_config=extra,
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(
            get_vocab_size=lambda: vocab, max_model_len=max_len + 1, model="cost-test", tokenizer=None
        ),
    )
    adapter = FreespecProposer(cfg)
    rng = np.random.default_rng(0)
    token_ids = np.zeros((batch, max_len), dtype=np.int32)
    lengths = np.zeros(batch, dtype=np.int32)
    for r in range(batch):  # each request: a different window of the corpus, then its continuation
        start = int(rng.integers(0, max(1, len(corpus) - max_len)))
        token_ids[r] = np.resize(corpus[start : start + max_len], max_len)
        lengths[r] = context
    sampled = [[int(token_ids[r, context - 1])] for r in range(batch)]
    adapter.propose(sampled, lengths, token_ids)  # first sighting: indexes the whole context
    times, capture_times = [], []
    drafts = [[] for _ in range(batch)]
    for _ in range(steps):
        sampled = []
        for r in range(batch):
            if adapter.target_topk is not None:  # accept a prefix of the last draft, then a bonus token
                accepted = drafts[r][: int(rng.integers(0, len(drafts[r]) + 1))]
                token_ids[r, lengths[r] : lengths[r] + len(accepted)] = accepted
                n_new = len(accepted) + 1
            else:
                n_new = int(rng.integers(1, k + 2))
            lengths[r] += n_new
            sampled.append(token_ids[r, lengths[r] - n_new : lengths[r]].tolist())
        if adapter.target_topk is not None:
            import torch

            logits = torch.randn(sum(1 + len(d) for d in drafts), vocab)
            t0 = time.perf_counter()
            adapter.target_topk._capture(logits)
            capture_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        drafts = adapter.propose(sampled, lengths, token_ids)
        times.append(time.perf_counter() - t0)
    per_req_us = np.array(times) / batch * 1e6
    result = {
        "plugin": plugin, "context": context, "batch": batch, "k": k,
        "us_per_request_step_median": round(float(np.median(per_req_us)), 1),
        "us_per_request_step_p90": round(float(np.percentile(per_req_us, 90)), 1),
        "state_mib": round(adapter.proposer.state_bytes() / 2**20, 2),
        "topk_capture_us_per_step_median": None,
    }
    if capture_times:
        result["topk_capture_us_per_step_median"] = round(float(np.median(capture_times)) * 1e6, 1)
        result["mismatched_steps"] = adapter.target_topk.mismatched_steps
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plugin", default="copy")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--context", type=int, nargs="+", default=[2048, 32768])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--questions", default=None,
                    help="question.jsonl, or builtin (default: as freespec bench resolves them)")
    ap.add_argument("--model", default=None, help="tokenizer dir (default: the prepared SmolLM2)")
    args = ap.parse_args()
    if args.model is None:
        from freespec.model_store import prepare_model

        args.model = str(prepare_model())
    corpus = corpus_tokens(args.questions, args.model, max(args.context) + args.steps * (args.k + 1) + 1)
    vocab = model_vocab_size(args.model)
    print("| plugin | context | batch | µs/request/step (median) | p90 | state MiB | top-k capture µs/step |")
    print("|---|---|---|---|---|---|---|")
    for context in args.context:
        for batch in args.batch:
            r = measure(args.plugin, args.k, context, batch, args.steps, corpus, vocab)
            print(f"| {r['plugin']} | {context} | {batch} | {r['us_per_request_step_median']} | "
                  f"{r['us_per_request_step_p90']} | {r['state_mib']} | "
                  f"{r['topk_capture_us_per_step_median'] or '-'} |", flush=True)


if __name__ == "__main__":
    main()
