"""freespec's plugins as Model Runner V2 speculators (vLLM >= 0.34), drafting on the host.

One step: read each batch row's token history from V2's ``RequestState`` (``all_token_ids``, ``total_len``, in
batch order through ``InputBatch.idx_mapping``), hand the rows to the plugin's proposer (``proposers/api.py``,
the API the V1 ``custom_class`` path feeds too) and return its drafts as a ``[num_reqs, K]`` tensor.

The invariant, and its price: **this path synchronizes with the host every step** (device-to-host copies of
the rows' lengths, the tokens added since the last step and the sampled counts before the drafts exist, one
host-to-device copy after). The host keeps each slot's history, as V1's runner does, so a step copies only new
tokens. The history it reads is the current one (vLLM
writes the sampled tokens before ``propose``), so the drafts are those the V1 path gives for the same history.
What is not built here yet (docs/architecture.md, "Model Runner V2"): the goodput policy's cut and step sizing
(drafts are cut at each plugin's fixed bar, as with ``"policy": "fixed"``), the target's top-k
(``observe``), the circuit breaker, and the ``cache_salt`` route (``"scope": "salt"`` learns nothing across
requests here). V2 verifies K slots per row: a shorter draft is filled up with the last sampled token.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

from freespec.proposers.learned import exit_save
from freespec.proposers.api import SHARED_SCOPE, Draft, EngineInfo, Row, StepContext
from freespec.proposers.base import Proposer
from freespec.proposers.registry import load_proposer_class
from freespec.proposers.learned.state_dir import cap_total
from freespec.scorers.policy import cut
from freespec.vllm_plugins.idle_save import IdleSave
from freespec.vllm_plugins.v2.options import PREFIX, checked_speculator_options

logger = logging.getLogger("freespec")


def host_drafts(proposer: Proposer, rows: Sequence[Row], rooms: Sequence[int], vocab_size: int) -> list[list[int]]:
    """Each row's draft as the V1 path gives it with ``"policy": "fixed"``: ``draft``, cut at the plugin's fixed
    bar (``Proposer.propose``), at most ``room`` tokens, each inside the vocabulary (else the call fails)."""
    drafts = proposer.draft(rows, StepContext())
    if not isinstance(drafts, list) or len(drafts) != len(rows):
        raise ValueError(f"plugin returned {len(drafts)} drafts for {len(rows)} rows")
    bar = proposer.fixed_bar()
    out = []
    for draft, room in zip(drafts, rooms):
        if not isinstance(draft, Draft):
            raise TypeError(f"draft() must return Draft objects, got {type(draft).__name__}")
        tokens = [int(t) for t in cut(draft, bar).tokens[: max(0, room)]]
        if any(not 0 <= t < vocab_size for t in tokens):
            raise ValueError(f"a draft token lies outside the vocabulary [0, {vocab_size})")
        out.append(tokens)
    return out


class FreespecSpeculator(BaseSpeculator):
    """A freespec plugin (the method's ``freespec_<plugin>`` name) drafting on the host for V2's runner."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, req_states: Any) -> None:
        spec = vllm_config.speculative_config
        self.plugin = str(spec.custom_method).removeprefix(PREFIX)
        options, adapter = checked_speculator_options(self.plugin, spec.num_speculative_tokens,
                                                      spec.speculator_options)
        self.k = int(spec.num_speculative_tokens)
        self.device, self.req_states = device, req_states
        model = vllm_config.model_config
        self.vocab_size = int(model.get_vocab_size())
        self.max_model_len = int(model.max_model_len)
        self.proposer = load_proposer_class(self.plugin)(options, self.k)
        if adapter.state_dir is not None:  # at start, before this process's sources load and write their files
            cap_total(adapter.state_dir, adapter.state_dir_max_bytes)
        saving = len(exit_save.registered())
        self.proposer.bind(EngineInfo(vocab_size=self.vocab_size, model=str(model.model),
                                      tokenizer_fingerprint=lambda: _tokenizer_fingerprint(model.tokenizer),
                                      state_dir=adapter.state_dir, state_max_age_s=adapter.state_max_age_s,
                                      state_max_bytes=adapter.state_max_bytes))
        # What the last requests before a quiet spell taught is saved without a next step (as on V1).
        self.idle_save = IdleSave(self.proposer) if len(exit_save.registered()) > saving else None
        self.scope = adapter.scope
        if self.scope == "salt":
            logger.warning("freespec: plugin %r on Model Runner V2: no cache_salt route yet, so \"scope\": "
                           "\"salt\" learns nothing across requests (\"global\" shares across all)", self.plugin)
        max_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.drafts = torch.zeros((max_reqs, self.k), dtype=torch.int64, device=device)
        self.num_valid = torch.zeros(max_reqs, dtype=torch.int32, device=device)  # real (non-filler) tokens
        # Each slot's token history on the host, and how much of it is copied (what V1's token_ids_cpu held).
        self.host_tokens = np.zeros((max_reqs, self.max_model_len), dtype=np.int32)
        self.known = np.zeros(max_reqs, dtype=np.int64)
        self.keys: dict[int, int] = {}  # request-state slot -> the proposer's key of the request in it
        self._next_key = 0
        self.errors = 0
        logger.info("freespec: plugin %r as V2 speculator %s, k=%d, drafting on the host", self.plugin,
                    type(self).__name__, self.k)

    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        del cudagraph_mode  # no graphs: the host drafts

    def capture(self) -> None:
        return None

    def add_request(self, req_index: int) -> None:
        """A new request in slot ``req_index``: a key of its own (a request that left the slot without
        finishing, a preempted one, is released first)."""
        self._release_slot(req_index)
        self.known[req_index] = 0  # its history is read anew
        self.keys[req_index] = self._next_key
        self._next_key += 1

    def on_requests_finished(self, finished_req_ids: Iterable[str]) -> None:
        for req_id in sorted(finished_req_ids):
            slot = self.req_states.req_id_to_index.get(req_id)
            if slot is not None:
                self._release_slot(slot)

    def reset_state(self) -> None:
        """After vLLM's warm-up: every request it made is released (what a plugin learned from them across
        requests stays: the proposer API has no reset)."""
        for slot in list(self.keys):
            self._release_slot(slot)

    def _release_slot(self, slot: int) -> None:
        key = self.keys.pop(slot, None)
        if key is not None:
            try:
                self.proposer.release(key)
            except Exception:
                self.errors += 1

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
        if self.idle_save is None:
            return self._propose(input_batch, n, num_sampled, last_sampled, num_speculative_tokens)
        with self.idle_save.step():
            return self._propose(input_batch, n, num_sampled, last_sampled, num_speculative_tokens)

    def _propose(self, input_batch: Any, n: int, num_sampled: torch.Tensor, last_sampled: torch.Tensor,
                 num_speculative_tokens: int | None) -> torch.Tensor:
        idx = input_batch.idx_mapping[:n]
        slots = np.asarray(input_batch.idx_mapping_np[:n])
        # Host syncs: lengths, the tokens added since the last step, what the last step sampled.
        lengths = self.req_states.total_len.gpu[idx].cpu().numpy().astype(np.int64)
        self._copy_new_tokens(idx, slots, lengths)
        num_new = num_sampled[:n].cpu().numpy()
        rows = [Row(self._key(int(slot)), self.host_tokens[slot, : lengths[i]].copy(), int(num_new[i]), self._scope())
                for i, slot in enumerate(slots)]
        k = self.k if num_speculative_tokens is None else min(self.k, int(num_speculative_tokens))
        rooms = [0 if num_new[i] == 0 else max(0, min(k, self.max_model_len - 1 - int(lengths[i])))
                 for i in range(n)]
        try:
            drafts = host_drafts(self.proposer, rows, rooms, self.vocab_size)
        except Exception:
            self.errors += 1
            if self.errors == 1:
                logger.exception("freespec: plugin %r failed; this step drafts nothing (logged once)", self.plugin)
            drafts = [[] for _ in rows]
        filler = last_sampled.view(-1)[idx].cpu().numpy()
        out = np.repeat(filler[:, None], self.k, axis=1).astype(np.int64)
        for i, tokens in enumerate(drafts):
            out[i, : len(tokens)] = tokens
        self.drafts[:n].copy_(torch.from_numpy(out), non_blocking=False)
        self.num_valid[:n].copy_(torch.as_tensor([len(t) for t in drafts], dtype=torch.int32))
        return self.drafts[:n]

    def _copy_new_tokens(self, idx: torch.Tensor, slots: np.ndarray, lengths: np.ndarray) -> None:
        """Bring each row's tokens past what the host holds into ``host_tokens``: one gather, one copy."""
        known = self.known[slots]
        known = np.where(known <= lengths, known, 0)  # a history that shrank (not seen in 0.34.0) is read anew
        width = int((lengths - known).max())
        if width > 0:
            pos = np.minimum(known[:, None] + np.arange(width)[None, :], self.max_model_len - 1)
            pos_t = torch.from_numpy(pos).to(idx.device)
            window = self.req_states.all_token_ids.gpu[idx.long()[:, None], pos_t].cpu().numpy()
            for i, slot in enumerate(slots):
                self.host_tokens[slot, known[i]: lengths[i]] = window[i, : lengths[i] - known[i]]
        self.known[slots] = lengths

    def _key(self, slot: int) -> int:
        if slot not in self.keys:  # a request vLLM added without add_request (not seen in 0.34.0)
            self.add_request(slot)
        return self.keys[slot]

    def _scope(self) -> str | None:
        """The row's scope: without a cache_salt route on V2, ``"salt"`` is read as no sharing at all."""
        return SHARED_SCOPE if self.scope == "global" else None


class HybridSpeculator(FreespecSpeculator):
    """``freespec_hybrid``: fused context, suffix and copy sources, on the host (extending vLLM's GPU
    ``SuffixSpeculator`` instead is the design of docs/architecture.md, not built)."""


class CopySpeculator(FreespecSpeculator):
    """``freespec_copy``: copy-paste drafts from the request's context and recent outputs."""


class RecycleSpeculator(FreespecSpeculator):
    """``freespec_recycle``: token recycling (its ``observe`` is never called on V2: no target top-k yet)."""


class RetrievalSpeculator(FreespecSpeculator):
    """``freespec_retrieval``: drafts from a datastore, fused with the request's own context."""


class PearlSpeculator(FreespecSpeculator):
    """``freespec_pearl``: a small draft model beside the target (its own process or thread)."""


def _tokenizer_fingerprint(tokenizer_path: str) -> str:
    from transformers import AutoTokenizer  # heavy: only plugins with files learned per tokenizer ask

    from freespec.proposers.vocab import vocab_fingerprint

    return vocab_fingerprint(AutoTokenizer.from_pretrained(tokenizer_path).get_vocab())
