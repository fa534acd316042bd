"""An offline replay: a plugin's drafts over recorded greedy outputs, without an engine.

Under greedy decoding the target's text is known, so the tokens a draft would get accepted are its common
prefix with what really followed. ``replay`` steps through one recorded output as the engine would (one
request; the prefill gives the first token, then each step verifies a draft and adds the accepted tokens and
the target's own), and counts target forward passes. ``scripts/replay_drafts.py`` is its command line.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from freespec.proposers.api import EngineInfo, Row, StepContext
from freespec.proposers.registry import load_proposer_class
from freespec.testing.plugins import PluginRef, plugin_name
from freespec.safe_files import loads_json, open_regular

Recorded = Union[str, Path, Iterable[Any]]


class AtBar:
    """A freespec plugin drafting at a fixed price of a draft token (``token_cost``; None: its own fixed bar),
    its drafts cut by the policy as the adapter cuts them (``Proposer.propose``)."""

    def __init__(self, proposer, token_cost: float | None) -> None:
        self.proposer, self.token_cost = proposer, token_cost

    def propose(self, rows: list[Row]) -> list[list[int]]:
        return self.proposer.propose(rows, StepContext(token_cost=self.token_cost))

    def release(self, key: int) -> None:
        self.proposer.release(key)


def replay(proposer, key: int, prompt: list[int], output: list[int], cost: float,
           times: list[float] | None = None, evict: np.ndarray | None = None,
           on_draft=None) -> tuple[int, int, float]:
    """(output tokens, target forward passes, modeled plain steps) when ``proposer`` drafts for this output.

    ``proposer``: anything with ``propose(rows) -> list[list[int]]`` and ``release(key)`` (``AtBar``); ``cost``:
    a draft token's cost in plain steps (a step verifying d tokens costs ``1 + cost * d``); ``times``: each
    propose call's seconds are appended; ``evict``: a buffer read before each call, so the call starts with the
    CPU's caches flushed, as it does after a target forward pass; ``on_draft``: called with each draft and how
    many of its tokens were accepted, right after the call that drafted it."""
    if not output:
        return 0, 0, 0.0
    # The prefill produces the first token; drafting starts after it, as in the engine.
    seq, t, steps, spent, new = list(prompt) + output[:1], 1, 1, 1.0, 1
    while t < len(output):
        tokens = np.asarray(seq, dtype=np.int32)
        if evict is not None:
            evict.sum()
        started = time.perf_counter()
        draft = proposer.propose([Row(key=key, tokens=tokens, num_new=new)])[0]
        if times is not None:
            times.append(time.perf_counter() - started)
        accepted = 0
        while accepted < len(draft) and t + accepted < len(output) and draft[accepted] == output[t + accepted]:
            accepted += 1
        if on_draft is not None:
            on_draft(draft, accepted)
        new = min(accepted + 1, len(output) - t)  # the accepted drafts plus the target's own token
        seq += output[t:t + new]
        t += new
        steps += 1
        spent += 1.0 + cost * len(draft)
    proposer.release(key)
    return len(output), steps, spent


def read_recorded(path: Union[str, Path]) -> list[dict]:
    """Recorded greedy outputs: JSON lines with ``prompt`` and ``output`` token ids (and ``category``, ``model``
    where recorded), as ``scripts/replay_drafts.py --generate`` writes them."""
    with open_regular(path, "r", encoding="utf-8") as f:
        return [loads_json(line, what=f"{path}:{i}") for i, line in enumerate(f, 1) if line.strip()]


def _pairs(recorded: Recorded) -> list[tuple[list[int], list[int]]]:
    rows = read_recorded(recorded) if isinstance(recorded, (str, Path)) else list(recorded)
    pairs = []
    for r in rows:
        prompt, output = (r["prompt"], r["output"]) if isinstance(r, Mapping) else r
        pairs.append(([int(t) for t in prompt], [int(t) for t in output]))
    return pairs


def replay_tokens_per_forward(plugin: PluginRef, options: Optional[Mapping[str, Any]], recorded: Recorded, *,
                              k: int = 8, token_cost: Optional[float] = None, vocab_size: Optional[int] = None,
                              model: str = "", memory: bool = True) -> float:
    """Output tokens per target forward pass when ``plugin`` drafts for ``recorded`` greedy outputs (1.0: it
    never saved a forward; ``k + 1`` at most). No engine, no batching, no target top-k.

    ``recorded``: a JSON-lines file as ``read_recorded`` reads, or (prompt ids, output ids) pairs, or dicts with
    ``prompt`` and ``output``. ``token_cost``: the policy's price of a draft token handed to the plugin (None: its
    fixed bar). ``vocab_size`` (default: one past the largest id recorded) and ``model`` are what ``bind`` gets.
    ``memory``: one proposer for all outputs, in order, as one server (False: a fresh one for each).
    """
    pairs = _pairs(recorded)
    assert pairs, "no recorded outputs to replay"
    cls = load_proposer_class(plugin_name(plugin))
    vocab = vocab_size or 1 + max(max(p + o, default=0) for p, o in pairs)

    def make() -> AtBar:
        proposer = cls(cls.Options.model_validate(dict(options or {})), k)
        proposer.bind(EngineInfo(vocab_size=vocab, model=model))
        return AtBar(proposer, token_cost)

    shared = make() if memory else None
    tokens = forwards = 0
    for key, (prompt, output) in enumerate(pairs):
        n, steps, _ = replay(shared or make(), key, prompt, output, 0.0)
        tokens, forwards = tokens + n, forwards + steps
    return tokens / forwards if forwards else 1.0
