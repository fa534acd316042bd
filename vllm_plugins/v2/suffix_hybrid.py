"""``freespec_hybrid`` on Model Runner V2 without host syncs: vLLM 0.34's GPU ``SuffixSpeculator``, extended.

vLLM's speculator (``v1/worker/gpu/spec_decode/suffix/speculator.py``: SuffixDecoding, arXiv 2411.04975, in
Triton kernels) matches each request's suffix in its own history and in one device-resident corpus of finished
responses, and sets adaptive-verification confidences from acceptance it tracks on the device. This subclass
runs those kernels unchanged and adds what freespec owns:

- **One corpus per scope.** Each ``cache_salt`` scope (``self.scopes``, filled by patch ``v2_salt_route`` as
  ``v2/scopes.py`` says; ``"scope": "global"``: one shared scope; rows of no scope draft from their own history)
  has corpus tensors of its own, laid out as vLLM's; the parent's methods run with the scope's tensors in place of
  its own (``CORPUS_FIELDS``), once per scope present in a step's batch, on that scope's rows. A tenant's drafts
  never come from another scope's corpus.
- **Learned responses** (``proposers.learned``: a folder's log or Redis's streams, ``add``/``take``/``close``, I/O
  on the backend's own thread): what the start read and ``take()`` brings is staged on the host and ingested by
  vLLM's own ingest kernel; a finished response is copied to pinned host memory without waiting and handed to
  ``add`` at a later step, once its copy is done.

The invariant, vLLM's and kept: **propose never synchronizes with the host** (host work per step: reading
``idx_mapping_np``, dict look-ups, non-blocking copies; tested in tests_vllm034/test_suffix_hybrid.py). A
failing step drafts the last sampled token with no valid draft (``num_valid`` 0), never tokens of another scope.
The goodput cut is vLLM's adaptive verification (``enable_adaptive_verification`` in the speculative config:
a draft budget from profiled step costs and the parent's per-position confidences; off, every slot is verified).
freespec's own policy (its cut, step-aside, step sizing) reads host-side timings and is not applied here.
"""
from __future__ import annotations

import inspect
import logging
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator
from vllm.v1.worker.gpu.spec_decode.suffix.speculator import SuffixSpeculator

from freespec.proposers.api import SHARED_SCOPE
from freespec.proposers.learned import LearnedResponses, is_url
from freespec.vllm_plugins.v2.options import PREFIX, checked_speculator_options

try:  # each slot's scope, as patch v2_salt_route fills it
    from freespec.vllm_plugins.v2.scopes import SlotScopes
except ImportError:  # pragma: no cover - the route's module not in this tree: scopes assigned by hand only
    SlotScopes = None

logger = logging.getLogger("freespec")

# The parent's attributes one scope's corpus consists of (its ``__init__`` makes them; ``reset_state``,
# ``on_requests_finished`` and ``propose`` read them through ``self``), and the others this class swaps.
CORPUS_FIELDS = ("corpus", "table", "corpus_head", "doc_seq", "num_docs")
SWAPPED = CORPUS_FIELDS + ("has_corpus", "req_states", "drafts", "num_valid", "draft_token_confidence_probs",
                           "num_steps", "enable_adaptive_verification", "max_model_len")
MAX_SCOPE_CORPORA = 16  # corpora held at once (36 bytes a corpus token each); the least recently used goes first
TAKE_EVERY_S = 0.5  # how often the backend's ``take()`` is asked (memory only: it never waits)
INGEST_TOKENS_PER_STEP = 1 << 16  # learned responses staged and ingested a step (at least one)
DEFAULT_SOURCES = frozenset({"suffix", "recycle"})  # recycle drafts nothing on V2 (no target top-k there)


def seam_problems() -> list[str]:
    """What of vLLM's ``SuffixSpeculator`` this class relies on and does not find (empty: the seam holds)."""
    source = inspect.getsource(SuffixSpeculator)
    missing = [f"SuffixSpeculator attribute {name!r}" for name in SWAPPED if f"self.{name}" not in source]
    for method in ("propose", "on_requests_finished", "reset_state", "add_request"):
        if method not in vars(SuffixSpeculator):
            missing.append(f"SuffixSpeculator.{method}")
    return missing


def gpu_path_refusal(options: Any, adapter: Any) -> str | None:
    """Why ``hybrid`` with these options must draft on the host (None: it runs on the GPU speculator): a source
    other than ``suffix``/``recycle`` (copy, retrieval, a draft model, an SDK proposer)."""
    sources = getattr(options, "sources", None)
    if getattr(options, "datastore", None) is not None or getattr(options, "draft_model", None) is not None:
        return "a datastore or draft model is given"
    if sources is not None and (not set(sources) <= DEFAULT_SOURCES or "suffix" not in sources):
        return f"sources {list(sources)} are not the defaults"
    return None


@dataclass
class _Corpus:
    """One scope's corpus: the parent's ``CORPUS_FIELDS``, shaped as it makes them."""

    corpus: torch.Tensor
    table: torch.Tensor
    corpus_head: torch.Tensor
    doc_seq: torch.Tensor
    num_docs: int = 0

    def clear(self) -> None:
        self.corpus.fill_(-1)
        self.table.fill_(-1)
        self.corpus_head.zero_()
        self.doc_seq.zero_()
        self.num_docs = 0


@dataclass
class _Outgoing:
    """A finished response on its way to the backend: copied to host memory without waiting."""

    scope: str
    tokens: torch.Tensor  # host; the row's tokens from its prompt tail on
    length: torch.Tensor  # host, [1]: the row's total length
    start: int
    done: Any  # a CUDA event, or None where the copy was synchronous (CPU tensors)


class SuffixHybridSpeculator(SuffixSpeculator):
    """``freespec_hybrid`` with its default sources: vLLM's GPU suffix speculator, a corpus per scope, learned
    responses from freespec's backend (module docstring)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, req_states: Any) -> None:
        super().__init__(vllm_config, device, req_states)
        spec = vllm_config.speculative_config
        plugin = str(getattr(spec, "custom_method", "") or f"{PREFIX}hybrid").removeprefix(PREFIX)
        options, adapter = checked_speculator_options(plugin, spec.num_speculative_tokens, spec.speculator_options)
        self.scope_mode = adapter.scope
        suffix = _suffix_options(options)
        self.prompt_tail = int(suffix.prompt_tail)
        self.max_saved_tokens = int(suffix.max_saved_tokens)
        self._template = _Corpus(self.corpus, self.table, self.corpus_head, self.doc_seq, self.num_docs)
        self._spare: list[_Corpus] = [self._template]  # allocated and empty
        self._corpora: OrderedDict[str, _Corpus] = OrderedDict()  # scope -> its corpus, least recent first
        max_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.scopes = SlotScopes(self.scope_mode, max_reqs) if SlotScopes is not None else _Scopes(self.scope_mode)
        if self.scope_mode == "salt" and not _route_installed():
            logger.warning("freespec: hybrid: patch v2_salt_route is not in force (freespec doctor), so \"scope\": "
                           "\"salt\" drafts from no other request")
        self.backend: LearnedResponses | None = None
        self._incoming: deque[tuple[str, np.ndarray]] = deque(maxlen=int(suffix.max_saved_responses))
        self._ingested: deque[tuple[str, np.ndarray]] = deque(maxlen=int(suffix.max_saved_responses))
        self._outgoing: deque[_Outgoing] = deque()
        self._taken_at = -float("inf")
        self.errors = 0
        if adapter.state_dir is not None:
            if int(getattr(vllm_config.parallel_config, "tensor_parallel_size", 1)) > 1:
                # ranks would take the fleet's responses at different steps and draft differently
                logger.warning("freespec: hybrid on V2 with tensor parallelism: its state_dir is not used")
            else:
                self.use_backend(_backend(adapter, vllm_config, suffix))
        logger.info("freespec: plugin 'hybrid' as V2 speculator %s (vLLM's GPU suffix kernels, scope %r), k=%d",
                    type(self).__name__, self.scope_mode, self.num_speculative_steps)

    # ------------------------------------------------------------------ scopes
    def use_backend(self, backend: LearnedResponses | None) -> None:
        """Share learned responses through ``backend`` (``proposers.learned``'s contract); what it read at start
        (a folder's ``loaded``) is ingested at the first step."""
        self.backend = backend
        loaded = getattr(backend, "loaded", None) or []
        self._incoming.extend((scope, tokens) for scope, tokens in loaded if self._admits(scope))
        if loaded:
            backend.loaded = []

    def add_request(self, req_index: int) -> None:
        super().add_request(req_index)
        self.scopes.reset(req_index)  # no tenant's scope until the salt route assigns one

    def _corpus_of(self, scope: str, make: bool = False) -> _Corpus | None:
        corpus = self._corpora.get(scope)
        if corpus is None and make and self.has_corpus:
            if self._spare:
                corpus = self._spare.pop()
            elif len(self._corpora) < MAX_SCOPE_CORPORA:
                t = self._template
                corpus = _Corpus(torch.full_like(t.corpus, -1), torch.full_like(t.table, -1),
                                 torch.zeros_like(t.corpus_head), torch.zeros_like(t.doc_seq))
            else:  # the least recently used scope's corpus is cleared and reused
                _, corpus = self._corpora.popitem(last=False)
                corpus.clear()
            self._corpora[scope] = corpus
        if corpus is not None:
            self._corpora.move_to_end(scope)
        return corpus

    def _forget(self, scope: str) -> None:
        corpus = self._corpora.pop(scope, None)
        if corpus is not None:
            corpus.clear()
            self._spare.append(corpus)

    @contextmanager
    def _swapped(self, corpus: _Corpus | None, **more: Any) -> Iterator[None]:
        """The parent's methods, run inside, see ``corpus`` (None: no corpus) and ``more`` as their own."""
        names = (CORPUS_FIELDS if corpus is not None else ()) + ("has_corpus", *more)
        saved = {name: getattr(self, name) for name in names}
        has = self.has_corpus and corpus is not None
        if corpus is not None:
            for name in CORPUS_FIELDS:
                setattr(self, name, getattr(corpus, name))
        self.has_corpus = has
        for name, value in more.items():
            setattr(self, name, value)
        try:
            yield
        finally:
            if corpus is not None:
                corpus.num_docs = self.num_docs
            for name, value in saved.items():  # what the parent changed of the rest (num_steps, ...) stays
                setattr(self, name, value)

    # ------------------------------------------------------------------ lifecycle
    def reset_state(self) -> None:
        """After vLLM's warm-up: the corpora, statistics and the responses of warm-up requests are dropped;
        what the backend brought is ingested again."""
        for scope in list(self._corpora):
            self._forget(scope)
        with self._swapped(self._template):
            super().reset_state()
        self._outgoing.clear()
        self._incoming.extendleft(reversed(self._ingested))
        self._ingested.clear()

    def on_requests_finished(self, finished_req_ids: Iterable[str]) -> None:
        """Each finished response goes into its scope's corpus (vLLM's ingest kernel) and, with a backend, is
        copied to the host without waiting."""
        by_scope: dict[str, list[str]] = defaultdict(list)
        for req_id in sorted(finished_req_ids):
            slot = self.req_states.req_id_to_index.get(req_id)
            scope = self.scopes.of(slot) if slot is not None else None
            if scope is None:
                continue
            by_scope[scope].append(req_id)
            if self.backend is not None:
                self._copy_out(scope, slot)
        for scope, req_ids in by_scope.items():
            corpus = self._corpus_of(scope, make=True)
            if corpus is not None:
                with self._swapped(corpus):
                    super().on_requests_finished(req_ids)

    def _copy_out(self, scope: str, slot: int) -> None:
        """Start copying slot ``slot``'s prompt tail and output to host memory (stream-ordered before the slot
        can be reused; no wait)."""
        states = self.req_states
        start = max(int(states.prompt_len.np[slot]) - self.prompt_tail, 0)
        end = self.max_model_len
        computed = getattr(states, "num_computed_tokens_np", None)
        if computed is not None:  # the host's count lags the device's by at most a step's tokens
            end = min(end, int(computed[slot]) + 2 * self.num_speculative_steps + 2)
        row = states.all_token_ids.gpu[slot, start:end]
        length = states.total_len.gpu[slot: slot + 1]
        if row.device.type == "cuda":
            tokens = torch.empty(row.shape, dtype=row.dtype, pin_memory=True)
            n = torch.empty(1, dtype=length.dtype, pin_memory=True)
            tokens.copy_(row, non_blocking=True)
            n.copy_(length, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            tokens, n, done = row.clone(), length.clone(), None
        self._outgoing.append(_Outgoing(scope, tokens, n, start, done))

    # ------------------------------------------------------------------ learned responses
    def _exchange(self) -> None:
        """Hand finished responses whose copy is done to the backend; take what the fleet brought; ingest a
        bounded share of it. Host memory only: no wait on the device or on I/O."""
        while self._outgoing and (self._outgoing[0].done is None or self._outgoing[0].done.query()):
            out = self._outgoing.popleft()
            n = int(out.length[0]) - out.start
            if n > 0:
                self.backend.add(out.scope, out.tokens[:n].numpy().astype(np.int32)[: self.max_saved_tokens])
        now = time.monotonic()
        if now - self._taken_at >= TAKE_EVERY_S:
            self._taken_at = now
            self._apply(self.backend.take())
        if self._incoming:
            self._ingest_incoming()

    def _apply(self, learned: Any) -> None:
        """``Learned`` in its order: purged scopes forgotten, a rebuild, others' new responses queued."""
        for scope in learned.forget:
            self._forget(scope)
            gone = set(learned.forget)
            self._incoming = deque(((s, t) for s, t in self._incoming if s not in gone), maxlen=self._incoming.maxlen)
            self._ingested = deque(((s, t) for s, t in self._ingested if s not in gone), maxlen=self._ingested.maxlen)
        if learned.rebuild is not None:
            for scope in list(self._corpora):
                self._forget(scope)
            self._incoming.clear()
            self._ingested.clear()
            self._incoming.extend((scope, tokens) for scope, tokens in learned.rebuild if self._admits(scope))
        self._incoming.extend((scope, tokens) for scope, tokens in learned.new if self._admits(scope))

    def _admits(self, scope: str) -> bool:
        """Whether a slot here can have ``scope`` (``"global"``: the shared one only; ``"none"``: none)."""
        return self.scope_mode == "salt" or (self.scope_mode == "global" and scope == SHARED_SCOPE)

    def _ingest_incoming(self) -> None:
        """Stage queued responses (one scope at a time) as a request state's rows and run the parent's ingest."""
        scope = self._incoming[0][0]
        batch, budget = [], INGEST_TOKENS_PER_STEP
        while self._incoming and self._incoming[0][0] == scope and (not batch or len(self._incoming[0][1]) <= budget):
            _, tokens = self._incoming.popleft()
            tokens = np.asarray(tokens, dtype=np.int32)[: self.max_model_len]
            self._ingested.append((scope, tokens))
            if len(tokens):
                batch.append(tokens)
                budget -= len(tokens)
        corpus = self._corpus_of(scope, make=True)
        if not batch or corpus is None:
            return
        width = max(len(t) for t in batch)
        rows = np.full((len(batch), width), -1, dtype=np.int32)
        for i, tokens in enumerate(batch):
            rows[i, : len(tokens)] = tokens
        lengths = np.asarray([len(t) for t in batch], dtype=np.int32)
        staged = SimpleNamespace(
            req_id_to_index={str(i): i for i in range(len(batch))},
            prompt_len=SimpleNamespace(np=np.zeros(len(batch), dtype=np.int32)),
            all_token_ids=SimpleNamespace(gpu=async_tensor_h2d(rows, self.device, torch.int32)),
            total_len=SimpleNamespace(gpu=async_tensor_h2d(lengths, self.device, torch.int32)),
        )
        with self._swapped(corpus, req_states=staged, max_model_len=width):
            super().on_requests_finished([str(i) for i in range(len(batch))])

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def propose(self, input_batch: Any, attn_metadata: Any, slot_mappings: Any, last_hidden_states: Any,
                aux_hidden_states: Any, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                last_sampled: torch.Tensor, next_prefill_tokens: Any, temperature: Any, seeds: Any,
                dp_sync_state: Any = None, dummy_run: bool = False, skip_attn_for_dummy_run: bool = False,
                mm_inputs: Any = None, is_profile: bool = False,
                num_speculative_tokens: int | None = None) -> torch.Tensor:
        n = int(input_batch.num_reqs)
        if dummy_run or n == 0:
            return self.drafts[:n]
        rest = (attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states)
        after = (next_prefill_tokens, temperature, seeds)
        extra = dict(dp_sync_state=dp_sync_state, skip_attn_for_dummy_run=skip_attn_for_dummy_run,
                     mm_inputs=mm_inputs, is_profile=is_profile, num_speculative_tokens=num_speculative_tokens)
        try:
            if self.backend is not None:
                self._exchange()
            groups = self._groups(np.asarray(input_batch.idx_mapping_np[:n]))
            if len(groups) == 1:  # one scope in the batch: the parent's step as it is
                with self._swapped(groups[0][0]):
                    return super().propose(input_batch, *rest, num_sampled, num_rejected, last_sampled, *after,
                                           **extra)
            return self._propose_groups(input_batch, n, groups, rest, num_sampled, num_rejected, last_sampled,
                                        after, extra)
        except Exception:
            self.errors += 1
            if self.errors == 1:
                logger.exception("freespec: hybrid's V2 speculator failed; this step drafts nothing (logged once)")
            return self._nothing(input_batch, n, last_sampled)

    def _groups(self, slots: np.ndarray) -> list[tuple[_Corpus | None, np.ndarray]]:
        """The batch's rows by the corpus they draft from (None: their own history only), in first-seen order."""
        groups: dict[int, tuple[_Corpus | None, list[int]]] = {}
        for pos, slot in enumerate(slots.tolist()):
            scope = self.scopes.of(slot)
            corpus = self._corpus_of(scope) if scope is not None else None
            groups.setdefault(id(corpus), (corpus, []))[1].append(pos)
        return [(corpus, np.asarray(rows, dtype=np.int64)) for corpus, rows in groups.values()]

    def _propose_groups(self, input_batch: Any, n: int, groups: list, rest: tuple, num_sampled: torch.Tensor,
                        num_rejected: torch.Tensor, last_sampled: torch.Tensor, after: tuple,
                        extra: dict) -> torch.Tensor:
        """The parent's step once per corpus on that corpus's rows; the rows' outputs scattered back into batch
        order. Its statistics are observed once per row and halved on the parent's schedule, as in one step."""
        drafts = torch.empty_like(self.drafts[:n])
        valid = torch.empty_like(self.num_valid[:n])
        conf = torch.zeros_like(self.draft_token_confidence_probs[:n])
        steps = self.num_steps
        for i, (corpus, rows) in enumerate(groups):
            pos = async_tensor_h2d(rows, self.device, torch.int64)
            sub = SimpleNamespace(num_reqs=len(rows), idx_mapping=input_batch.idx_mapping[pos])
            m = len(rows)
            # the parent counts a step per call: after the first group, a count that triggers no halving
            with self._swapped(corpus, num_steps=steps if i == 0 else 0):
                super().propose(sub, *rest, num_sampled[pos], num_rejected[pos], last_sampled, *after, **extra)
                drafts[pos] = self.drafts[:m]
                valid[pos] = self.num_valid[:m]
                if self.enable_adaptive_verification:
                    conf[pos] = self.draft_token_confidence_probs[:m]
                if i == 0:
                    steps_after = self.num_steps
        self.num_steps = steps_after
        self.drafts[:n] = drafts
        self.num_valid[:n] = valid
        self.draft_token_confidence_probs[:n] = conf
        return self.drafts[:n]

    def _nothing(self, input_batch: Any, n: int, last_sampled: torch.Tensor) -> torch.Tensor:
        """A step with no draft: every slot the last sampled token, no valid token, confidence 0 (device ops)."""
        last = last_sampled.view(-1)[input_batch.idx_mapping[:n].long()]
        self.drafts[:n] = last[:, None].to(self.drafts.dtype)
        self.num_valid[:n] = 0
        self.draft_token_confidence_probs[:n] = 0.0
        return self.drafts[:n]


class HybridV2Speculator(BaseSpeculator):
    """What ``freespec_hybrid`` builds on V2: ``SuffixHybridSpeculator`` when hybrid's sources are the defaults
    and vLLM's suffix seam holds, else the host-synced ``HybridSpeculator`` (``speculator.py``), saying why."""

    def __new__(cls, vllm_config: VllmConfig, device: torch.device, req_states: Any) -> BaseSpeculator:
        from freespec.vllm_plugins.v2.speculator import HybridSpeculator

        spec = vllm_config.speculative_config
        options, adapter = checked_speculator_options("hybrid", spec.num_speculative_tokens,
                                                      spec.speculator_options)
        from vllm.triton_utils import HAS_TRITON

        why = gpu_path_refusal(options, adapter) or (None if HAS_TRITON else "Triton is not available")
        problems = [] if why else seam_problems()
        if problems:
            why = f"vLLM's suffix speculator moved ({', '.join(problems)})"
        if why is None:
            return SuffixHybridSpeculator(vllm_config, device, req_states)
        logger.info("freespec: hybrid drafts on the host on V2: %s", why)
        return HybridSpeculator(vllm_config, device, req_states)

    def __init__(self, vllm_config: VllmConfig, device: torch.device, req_states: Any) -> None:
        raise AssertionError("never built: __new__ returns another speculator")  # pragma: no cover


class _Scopes:
    """``v2.scopes.SlotScopes``'s interface where that module is absent: ``reset``, ``assign``, ``of``."""

    def __init__(self, option: str) -> None:
        self.option, self.fixed = option, (SHARED_SCOPE if option == "global" else None)
        self._scopes: dict[int, str | None] = {}

    def reset(self, slot: int) -> None:
        self._scopes[slot] = self.fixed

    def assign(self, slot: int, scope: str | None) -> None:
        if self.option == "salt":
            self._scopes[slot] = scope

    def of(self, slot: int) -> str | None:
        return self._scopes.get(slot, self.fixed)


def _route_installed() -> bool:
    try:
        from freespec.vllm_plugins.patches.v2_salt_route import route_installed
    except ImportError:  # pragma: no cover - the route's module not in this tree
        return False
    return route_installed()


def _suffix_options(options: Any) -> Any:
    from freespec.proposers.suffix_tree import SuffixOptions

    given = getattr(options, "suffix", None)
    if isinstance(given, SuffixOptions):
        return given
    return SuffixOptions(**(given.model_dump() if hasattr(given, "model_dump") else (given or {})))


def _backend(adapter: Any, vllm_config: VllmConfig, suffix: Any) -> LearnedResponses:
    """The ``state_dir`` option's backend, as the host-side suffix source builds it: a folder's log or Redis's
    streams; closed at exit (its last responses handed on)."""
    from freespec.proposers.learned.exit_save import save_at_exit
    from freespec.proposers.learned.state_dir import cap_total, open_root
    from freespec.vllm_plugins.v2.speculator import _tokenizer_fingerprint

    model = vllm_config.model_config
    common = dict(fingerprint=_tokenizer_fingerprint(model.tokenizer), vocab_size=int(model.get_vocab_size()),
                  max_responses=int(suffix.max_saved_responses), max_tokens=int(suffix.max_saved_tokens))
    if is_url(adapter.state_dir):
        from freespec.proposers.learned.redis_stream import RedisResponses

        backend = RedisResponses(adapter.state_dir, **common)
    else:
        from freespec.proposers.learned.folder_log import FolderLog

        root = open_root(adapter.state_dir, trust_others=adapter.state_dir_trust_others)
        cap_total(root, adapter.state_dir_max_bytes)
        backend = FolderLog(root, max_age_s=adapter.state_max_age_s, max_bytes=adapter.state_max_bytes,
                            interval_s=float(suffix.save_every_s), **common)
    save_at_exit(backend.close, "suffix responses")
    return backend
