"""Which filler should pad a short draft? A greedy replay of the default `hybrid`, no engine.

    python scripts/replay_drafts.py --generate greedy.jsonl --questions question.jsonl   # SmolLM2's greedy answers
    python results/padding-filler/filler_replay.py greedy.jsonl --every 6 --size 5 --token-cost 0.05

One `hybrid` (default sources: `suffix` and `recycle`) drafts for each question in file order, as a server
does (its trees and `recycle`'s matrix keep what earlier questions taught them), at a fixed goodput bar
(``--token-cost``). `recycle` learns from the target's real top-8 at every position the replay passes,
computed with one forward pass of the model over each question's prompt and answer (transformers,
float32). At each step whose draft would be padded to ``--size`` scored tokens (the draft is shorter) and
was accepted whole, every filler offers the missing tokens and is credited the tokens of them the
target's answer continues with:

- ``copy``: the product's filler (``proposers/padding.py``, a one-token copy from the request);
- ``tail``: the sources' fused continuation past the cut (`min_support` 0, no bar), nothing where it ends;
- ``tail+copy``: that continuation, then the one-token copy;
- ``recycle``: `recycle`'s top-1 chain from the draft's last token, then the one-token copy.

The trajectory is the answer itself (filler tokens are credited, not used to advance), so every filler
meets the same steps.
"""
import argparse
import json
import os

import numpy as np
import torch
from transformers import AutoModelForCausalLM

import freespec.proposers.hybrid as hybrid_module
from freespec.proposers.base import EngineInfo, Row, ScoredPositions
from freespec.proposers.padding import context_padding
from freespec.proposers.registry import build_proposer
from freespec.scorers.acceptance import matched_prefix
from freespec.scorers.fusion import fuse

FILLERS = ("copy", "tail", "tail+copy", "recycle")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("greedy", help="JSON lines of scripts/replay_drafts.py --generate")
    p.add_argument("--every", type=int, default=6, help="replay every n-th question (default 6: 80 of 480)")
    p.add_argument("--size", type=int, default=5, help="scored tokens a padded step reaches (default 5)")
    p.add_argument("--token-cost", type=float, default=0.05)
    args = p.parse_args()
    questions = [json.loads(line) for line in open(args.greedy)][:: args.every]
    model_dir = questions[0]["model"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    tail: list[int] = []
    fuse_sources = hybrid_module.fuse_sources

    def keeping_tail(offered, weights, max_len, min_support, token_cost):
        fused = fuse_sources(offered, weights, max_len, min_support, token_cost)
        tail[:] = fuse(fused.sources, max_len, 0.0)[0]
        return fused

    hybrid_module.fuse_sources = keeping_tail
    hyb = build_proposer("hybrid", {}, 8)
    hyb.bind(EngineInfo(vocab_size=model.config.vocab_size, model=model_dir))
    hyb.token_cost = args.token_cost
    recycle = hyb.sources["recycle"]

    def recycle_chain(last: int, n: int) -> list[int]:
        chain = []
        for _ in range(n):
            if recycle.matrix is None or recycle.matrix.probs[last, 0] <= 0:
                break
            last = int(recycle.matrix.ids[last, 0])
            chain.append(last)
        return chain

    credited = dict.fromkeys(FILLERS, 0)
    first = dict.fromkeys(FILLERS, 0)
    steps = accepted = short = padded = 0
    for number, q in enumerate(questions, 1):
        prompt, answer = q["prompt"], q["output"]
        seq = np.asarray(prompt + answer, dtype=np.int64)
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor(seq[None])).logits[0].float(), -1)
        top_p, top_i = probs.topk(8, -1)
        top_i, top_p = top_i.numpy().astype(np.int32), top_p.numpy().astype(np.float32)
        start, i, num_new = len(prompt), 0, len(prompt)
        while i < len(answer):
            tokens = seq[: start + i]
            draft = hyb.propose([Row(number, tokens, num_new)])[0]
            rest = answer[i:]
            right = matched_prefix(draft, rest)[0]
            steps += 1
            short += 1 + len(draft) < args.size
            if right == len(draft) and 1 + len(draft) < args.size and len(rest) > len(draft):
                padded += 1
                n, after = args.size - 1 - len(draft), rest[len(draft):]
                ext = tail[len(draft) : len(draft) + n] if tail[: len(draft)] == list(draft) else []
                chain = recycle_chain(int(draft[-1]) if draft else int(tokens[-1]), n)
                offers = {
                    "copy": context_padding(tokens, draft, n),
                    "tail": ext,
                    "tail+copy": ext + context_padding(tokens, list(draft) + ext, n - len(ext)),
                    "recycle": chain + context_padding(tokens, list(draft) + chain, n - len(chain)),
                }
                for name, offer in offers.items():
                    credited[name] += matched_prefix(offer, after)[0]
                    first[name] += bool(offer) and offer[0] == after[0]
            advance = min(right + 1, len(rest))
            accepted += right
            where = np.arange(start + i - 1, start + i - 1 + advance)  # the positions this step scored right
            hyb.observe(ScoredPositions(seq[where].astype(np.int32), top_i[where], top_p[where]))
            i, num_new = i + advance, advance
        hyb.release(number)
    print(f"{len(questions)} questions, {steps} steps, {(steps + accepted) / steps:.3f} tokens per forward; "
          f"{short} steps shorter than {args.size} scored tokens, {padded} of them with the draft accepted whole")
    print("| filler | first token right | filler tokens accepted | per padded step | per step |")
    print("|---|---:|---:|---:|---:|")
    for name in FILLERS:
        print(f"| {name} | {first[name] / padded:.1%} | {credited[name]} | {credited[name] / padded:.3f} | "
              f"{credited[name] / steps:.4f} |")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
