"""Probe: would a small draft head on SmolLM2's last hidden state add to what vLLM `suffix` drafts?

Not part of the product; the commands and numbers are in results.md. Three steps:

    python probe.py features 800 384 feat.npz      # teacher-forced ShareGPT chats: hidden states, argmax labels
    python probe.py train feat.npz 8192 2 head.pt    # the head, 2 epochs, output over the 8,192 commonest labels
    python probe.py eval head.pt greedy.jsonl 8 4 0.4  # replay every 8th answer; chains of <= 4, prob >= 0.4

The head (attention-free, EAGLE-like): h'_{t+1} = h_t + W2 SiLU(W1 [h_t; E x_{t+1}]), logits = h' E^T with
the model's tied embedding E. A chain feeds its own h' and drafted token back in. `greedy.jsonl` is
`scripts/replay_drafts.py --generate`'s output for Spec-Bench.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

MODEL = str(Path.home() / ".cache/freespec/models/smollm2-135m-instruct")
SHAREGPT = Path.home() / ".cache/freespec/corpus/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json"
torch.set_num_threads(2)


class Head(nn.Module):
    def __init__(self, dim: int = 576) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2 * dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(nn.functional.silu(self.fc1(torch.cat([h, e], -1))))


def load_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()


def sharegpt_chats(n: int) -> list[list[dict]]:
    """Every third chat whose first turns are a question and a reply over 200 characters. The file is cut off
    at its end; the datastore builder's reader keeps its whole records."""
    from freespec.proposers.retrieval.readers import _whole_records

    text = SHAREGPT.read_text(encoding="utf-8")
    try:
        records = json.loads(text)
    except ValueError as e:
        records = _whole_records(text, SHAREGPT, e, print)
    chats = [r["conversations"] for r in records
             if len(r.get("conversations", [])) >= 2 and r["conversations"][0]["from"] == "human"
             and r["conversations"][1]["from"] == "gpt" and len(r["conversations"][1]["value"]) > 200]
    return chats[: 3 * n : 3]


def features(n: int, max_len: int, out: str) -> None:
    from transformers import AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(MODEL), load_model()
    hidden, ids_all, labels, lens = [], [], [], []
    started = time.time()
    for i, turns in enumerate(sharegpt_chats(n)):
        msgs = [{"role": "user", "content": turns[0]["value"][:1500]},
                {"role": "assistant", "content": turns[1]["value"]}]
        ids = list(tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"])[:max_len]
        with torch.no_grad():
            o = model(torch.tensor([ids]), output_hidden_states=True)
        hidden.append(o.hidden_states[-1][0].numpy().astype(np.float16))  # HF's last one is after the norm
        labels.append(o.logits[0].argmax(-1).numpy().astype(np.int32))
        ids_all.append(np.array(ids, np.int32))
        lens.append(len(ids))
        if i % 100 == 0:
            print(f"{i} chats, {sum(lens)} tokens, {time.time() - started:.0f} s", flush=True)
    np.savez(out, H=np.concatenate(hidden), X=np.concatenate(ids_all), Y=np.concatenate(labels),
             lens=np.array(lens))
    print(f"{out}: {sum(lens)} tokens in {time.time() - started:.0f} s")


def train(data: str, vocab: int, epochs: int, out: str) -> None:
    torch.manual_seed(0)
    d = np.load(data)
    H = torch.from_numpy(d["H"].astype(np.float32))
    X, Y = torch.from_numpy(d["X"]).long(), torch.from_numpy(d["Y"]).long()
    E = load_model().model.embed_tokens.weight.detach()
    counts = np.bincount(d["Y"], minlength=E.shape[0])
    keep = np.argsort(-counts)[:vocab]
    print(f"the {vocab} commonest labels cover {counts[keep].sum() / counts.sum():.4f} of them")
    remap = torch.full((E.shape[0],), -100, dtype=torch.long)
    remap[torch.from_numpy(keep)] = torch.arange(vocab)
    E_out = E[torch.from_numpy(keep)]
    starts = np.concatenate([[0], np.cumsum(d["lens"])[:-1]])
    pairs = torch.from_numpy(np.concatenate([s + np.arange(n - 3) for s, n in zip(starts, d["lens"])]))
    head, batch = Head(), 2048
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.0)
    total = epochs * (len(pairs) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 1e-3, total_steps=total, pct_start=0.05)
    ce, started, step = nn.functional.cross_entropy, time.time(), 0
    for _ in range(epochs):
        order = pairs[torch.randperm(len(pairs))]
        for b in range(len(pairs) // batch):
            i = order[b * batch:(b + 1) * batch]
            h1 = head(H[i], E[X[i + 1]])  # predicts the feature at t+1, and so the token after x_{t+1}
            h2 = head(h1, E[X[i + 2]])  # one step unrolled on its own feature
            l1 = ce(h1 @ E_out.T, remap[Y[i + 1]], ignore_index=-100)
            l2 = ce(h2 @ E_out.T, remap[Y[i + 2]], ignore_index=-100)
            loss = l1 + 0.5 * l2 + nn.functional.smooth_l1_loss(h1, H[i + 1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % 50 == 0:
                acc = ((h1 @ E_out.T).argmax(-1) == remap[Y[i + 1]]).float().mean().item()
                print(f"step {step}/{total} loss {l1.item():.3f} {l2.item():.3f} acc {acc:.3f} "
                      f"{time.time() - started:.0f} s", flush=True)
    torch.save({"head": head.state_dict(), "keep": torch.from_numpy(keep)}, out)


class HeadAfterSuffix:
    """A replay proposer: vLLM `suffix`'s draft (``suffix`` None: none) and, where it has nothing, the head's
    chain (``chain`` None: none), from the hidden state of the position that chose the newest token."""

    def __init__(self, suffix, chain) -> None:
        self.suffix, self.chain, self.hidden, self.drafted = suffix, chain, None, 0

    def propose(self, rows) -> list[list[int]]:
        row = rows[0]
        draft = self.suffix.propose(rows)[0] if self.suffix is not None else []
        if self.chain is not None and not draft:
            draft = self.chain(self.hidden[len(row.tokens) - 2], int(row.tokens[-1]))
        self.drafted += len(draft)
        return [draft]

    def release(self, key: int) -> None:
        if self.suffix is not None:
            self.suffix.release(key)


def evaluate(weights: str, greedy: str, stride: int, k: int, min_prob: float) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from replay_drafts import VllmSuffix, replay

    saved = torch.load(weights)
    head, keep = Head(), saved["keep"]
    head.load_state_dict(saved["head"])
    model = load_model()
    E = model.model.embed_tokens.weight.detach()
    E_out = E[keep]

    def chain(h: torch.Tensor, token: int) -> list[int]:
        out = []
        with torch.no_grad():
            for _ in range(k):
                h = head(h, E[token])
                p = torch.softmax(h @ E_out.T, -1)
                best = int(p.argmax())
                if p[best] < min_prob:
                    break
                token = int(keep[best])
                out.append(token)
        return out

    # One proposer per rule for all answers in file order, as one server each (`suffix` learns from them).
    rules = {"suffix": HeadAfterSuffix(VllmSuffix(8), None), "head": HeadAfterSuffix(None, chain),
             "suffix, else head": HeadAfterSuffix(VllmSuffix(8), chain)}
    totals = {r: np.zeros(3) for r in rules}  # output tokens, target forwards, modeled plain steps
    rows = [json.loads(line) for line in open(greedy)][::stride]
    for q, row in enumerate(rows):
        with torch.no_grad():
            seq = torch.tensor([row["prompt"] + row["output"]])
            hidden = model(seq, output_hidden_states=True).hidden_states[-1][0]
        for proposer in rules.values():
            proposer.hidden = hidden
        for r, proposer in rules.items():
            totals[r] += replay(proposer, q, row["prompt"], row["output"], cost=0.033)
    for r, (tokens, forwards, spent) in totals.items():
        print(f"{r}: {tokens / forwards:.3f} tok/fwd, modeled {tokens / spent:.3f}x none, "
              f"{rules[r].drafted / tokens:.2f} drafted per output token ({len(rows)} answers)")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "features":
        features(int(args[0]), int(args[1]), args[2])
    elif cmd == "train":
        train(args[0], int(args[1]), int(args[2]), args[3])
    else:
        evaluate(args[0], args[1], int(args[2]), int(args[3]), float(args[4]))
