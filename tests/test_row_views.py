"""A proposer must not keep ``Row.tokens`` past its call: on vLLM's V1 runner a row is a view into the runner's
``token_ids_cpu``, whose row is overwritten by another request once one finishes and moved when the batch is
condensed (the adapter, ``vllm_plugins/adapter.py``, hands those views on without copying them).

Each plugin drafts the same scripted batch twice: once from views into one shared 2-D buffer that is reused as
vLLM's is, once from fresh copies; the drafts must be the same at every step. Requests of several scopes
(tenants) run side by side, so a view kept past a request's life would show another tenant's text."""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pytest

from freespec.proposers.api import SHARED_SCOPE, EngineInfo, Row, ScoredPositions, StepContext
from freespec.proposers.copy import CopyOptions, CopyProposer
from freespec.proposers.hybrid import HybridOptions, HybridProposer
from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer
from freespec.proposers.suffix_tree import available as suffix_available

K = 4
VOCAB = 200
SLOTS = 3  # rows of the shared buffer: fewer than the requests, so rows are reused
WIDTH = 512
NUM_NEW = (1, 3, 2, 4, 1, 2)  # tokens a step appends to a request (accepted drafts and the bonus token), in turn


@dataclass
class Request:
    prompt: list[int]
    output: list[int]
    scope: Optional[str]
    key: int = -1
    length: int = 0  # tokens in the buffer so far
    turn: int = 0

    @property
    def sequence(self) -> list[int]:
        return self.prompt + self.output


def _text(rng: np.random.Generator, low: int, high: int) -> list[int]:
    """An answer that repeats its own pieces (something for the context sources to copy)."""
    pieces = [rng.integers(low, high, size=int(rng.integers(4, 9))).tolist() for _ in range(4)]
    out: list[int] = []
    for i in rng.integers(0, len(pieces), size=9).tolist():
        out += pieces[i]
    return out


def _script() -> list[Request]:
    """Requests of four scopes, in arrival order; later ones ask again what earlier ones of their scope were
    asked (their answers then repeat), so what a source learned across requests is drafted too."""
    rng = np.random.default_rng(7)
    scopes = {SHARED_SCOPE: (1, 50), "tenant-a": (50, 100), "tenant-b": (100, 150), None: (150, 199)}
    answers = {scope: _text(rng, *span) for scope, span in scopes.items()}
    prompts = {scope: rng.integers(*span, size=12).tolist() for scope, span in scopes.items()}
    requests = []
    for turn in range(3):
        for scope, span in scopes.items():
            answer = answers[scope] if turn else _text(rng, *span)
            if turn == 2:  # the same answer, edited a little
                answer = answer[:20] + rng.integers(*span, size=3).tolist() + answer[20:]
            requests.append(Request(list(prompts[scope]), list(answer), scope))
    return requests


@dataclass
class Batch:
    """vLLM's persistent batch, as far as a proposer can see it: one shared int32 buffer (``token_ids_cpu``),
    a request per row; a finished request's row goes to the next request, and the batch is condensed (the
    last row moves into a hole) when no new request fills it."""

    views: bool
    buffer: np.ndarray = field(default_factory=lambda: np.zeros((SLOTS, WIDTH), dtype=np.int32))
    slots: list[Optional[Request]] = field(default_factory=lambda: [None] * SLOTS)

    def rows(self) -> list[Row]:
        out = []
        for slot, req in enumerate(self.slots):
            if req is None:
                continue
            tokens = self.buffer[slot, : req.length]
            out.append(Row(req.key, tokens if self.views else tokens.copy(), req.num_new, req.scope))
        return out

    def add(self, req: Request, slot: int) -> None:
        self.slots[slot] = req
        self.buffer[slot, : len(req.prompt) + 1] = req.sequence[: len(req.prompt) + 1]  # the prompt, 1 sampled
        req.length, req.num_new = len(req.prompt) + 1, 1

    def condense(self) -> None:
        while None in self.slots:
            hole, last = self.slots.index(None), max((i for i, r in enumerate(self.slots) if r is not None),
                                                     default=-1)
            if last < hole:
                return
            self.buffer[hole] = self.buffer[last]
            self.slots[hole], self.slots[last] = self.slots[last], None


def _drive(proposer, views: bool, observe: bool = False) -> list[list[tuple]]:
    """Every step's drafts (tokens, chances, source) for the scripted requests, rows as views or as copies."""
    waiting = _script()
    for key, req in enumerate(waiting):
        req.key = key
    batch = Batch(views)
    departed: list[int] = []
    steps: list[list[tuple]] = []
    for step_no in range(400):
        for slot, req in enumerate(batch.slots):  # the target's tokens of the last step are written
            if req is not None and step_no and req.length < len(req.sequence):
                req.num_new = min(NUM_NEW[req.turn % len(NUM_NEW)], len(req.sequence) - req.length)
                req.turn += 1
                batch.buffer[slot, req.length : req.length + req.num_new] = req.sequence[
                    req.length : req.length + req.num_new]
                req.length += req.num_new
        for slot, req in enumerate(batch.slots):  # finished ones leave; their rows go to new requests
            if req is not None and req.length >= len(req.sequence):
                batch.slots[slot] = None
                departed.append(req.key)
        for slot in range(SLOTS):
            if batch.slots[slot] is None and waiting and len(steps) % 3 != 1:  # some steps condense instead
                batch.add(waiting.pop(0), slot)
        batch.condense()
        if not any(batch.slots):
            break
        for key in departed:  # the adapter releases a request the step after it finished
            proposer.release(key)
        departed.clear()
        rows = batch.rows()
        if observe:  # the target's top-1 at each row's newest positions: the token that followed there
            proposer.observe(_scored(batch))
        drafts = proposer.draft(rows, StepContext())
        steps.append([(row.key, list(d.tokens), d.chances, d.source) for row, d in zip(rows, drafts)])
    assert not waiting and not any(batch.slots), "the script did not run to its end"
    return steps


def _scored(batch: Batch) -> ScoredPositions:
    tokens, nexts, scopes = [], [], []
    for req in batch.slots:
        if req is None:
            continue
        for at in range(max(0, req.length - 1 - req.num_new), req.length - 1):
            tokens.append(req.sequence[at])
            nexts.append(req.sequence[at + 1])
            scopes.append(req.scope)
    ids = np.zeros((len(tokens), 8), dtype=np.int32)
    ids[:, 0] = nexts
    probs = np.zeros((len(tokens), 8), dtype=np.float32)
    probs[:, 0] = 0.9
    return ScoredPositions(np.asarray(tokens, dtype=np.int32), ids, probs, scopes)


def _hybrid(**opts) -> Callable[[], HybridProposer]:
    def build() -> HybridProposer:
        p = HybridProposer(HybridOptions(price_sources=False, **opts), K)  # no timing: the same run twice
        p.bind(EngineInfo(vocab_size=VOCAB))
        return p
    return build


def _copy() -> CopyProposer:
    return CopyProposer(CopyOptions(), K)


def _recycle() -> RecycleProposer:
    p = RecycleProposer(RecycleOptions(), K)
    p.bind(EngineInfo(vocab_size=VOCAB, model="m", tokenizer_fingerprint=lambda: "sha256:test"))
    return p


def _retrieval(tmp_path, hybrid: bool) -> Callable[[], object]:
    """``retrieval`` (fused with its own copy source), or ``hybrid`` with sources copy and retrieval, on a
    datastore of the first turn's answers."""
    from test_retrieval import FP, write_store  # a small datastore, as the retrieval tests build it
    from freespec.proposers.retrieval.proposer import RetrievalOptions, RetrievalProposer

    path = str(write_store(tmp_path / "store", [req.output for req in _script()[:4]], 1))

    def build():
        if hybrid:
            p = HybridProposer(HybridOptions(sources=("copy", "retrieval"), datastore=path, price_sources=False), K)
        else:
            p = RetrievalProposer(RetrievalOptions(datastore=path), K)
        p.bind(EngineInfo(vocab_size=VOCAB, tokenizer_fingerprint=lambda: FP))
        return p
    return build


needs_suffix = pytest.mark.skipif(not suffix_available()[0], reason="arctic-inference not installed")

PLUGINS = {
    "hybrid-default": pytest.param(_hybrid(), True, marks=needs_suffix),
    "hybrid-copy": pytest.param(_hybrid(sources=("copy",)), False),
    "hybrid-suffix": pytest.param(_hybrid(sources=("suffix",)), False, marks=needs_suffix),
    "hybrid-suffix-copy": pytest.param(_hybrid(sources=("suffix", "copy")), False, marks=needs_suffix),
    "copy": pytest.param(_copy, False),
    "recycle": pytest.param(_recycle, True),
}


@pytest.mark.parametrize("build, observe", PLUGINS.values(), ids=PLUGINS.keys())
def test_drafts_from_views_of_a_reused_buffer_are_those_from_copies(build, observe):
    from_copies = _drive(build(), views=False, observe=observe)
    from_views = _drive(build(), views=True, observe=observe)
    assert sum(bool(tokens) for step in from_copies for _, tokens, _, _ in step) > 20, "the script drafts little"
    for n, (copied, viewed) in enumerate(zip(from_copies, from_views)):
        assert viewed == copied, f"step {n}: drafts from views differ from drafts from copies"
    assert len(from_views) == len(from_copies)


@pytest.mark.parametrize("hybrid", [False, True], ids=["retrieval", "hybrid-copy-retrieval"])
def test_retrieval_drafts_from_views_of_a_reused_buffer_are_those_from_copies(tmp_path, hybrid):
    build = _retrieval(tmp_path, hybrid)
    from_copies = _drive(build(), views=False)
    assert sum(bool(tokens) for step in from_copies for _, tokens, _, _ in step) > 20, "the script drafts little"
    assert _drive(build(), views=True) == from_copies


class _KeepsViews(CopyProposer):
    """The bug this file guards against: copy, but a request's output goes to its scope's pool from the
    ``Row.tokens`` it last saw, read at ``release`` (the step after it finished, its buffer row reused)."""

    def __init__(self) -> None:
        super().__init__(CopyOptions(), K)
        self.kept: dict[int, np.ndarray] = {}

    def draft(self, rows, step):
        self.kept.update((row.key, row.tokens) for row in rows)
        return super().draft(rows, step)

    def release(self, key: int) -> None:
        st, tokens = self._seqs.get(key), self.kept.pop(key, None)
        if st is not None and tokens is not None:
            st.seq = array("i", tokens.tolist())
        super().release(key)


def test_the_batch_catches_a_proposer_that_keeps_views():
    """The harness is sensitive: a view kept past the step drafts otherwise, and from another tenant's text."""
    leaky = _KeepsViews()
    assert _drive(leaky, views=True) != _drive(_KeepsViews(), views=False)
    pooled = {scope: {t for seg in pool.segments.values() for t in seg} for scope, pool in leaky._pools.items()}
    assert pooled["tenant-a"] - set(range(50, 100)), "no other tenant's token reached tenant-a's pool"
