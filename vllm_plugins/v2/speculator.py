"""freespec's plugins as Model Runner V2 speculators (vLLM >= 0.34), drafting on the host.

One step: read each batch row's token history from V2's ``RequestState`` (``all_token_ids``, ``total_len``, in
batch order through ``InputBatch.idx_mapping``), hand the rows to the plugin's proposer (``proposers/api.py``,
the API the V1 ``custom_class`` path feeds too) and return its drafts as a ``[num_reqs, K]`` tensor.
What decides around the plugin is the V1 adapter's, reused as it is: the controller (``scorers.controller``:
the goodput policy's price from measured step times, the cut at it, step-aside) and the circuit breaker
(``breaker``), fed one ``step_record.StepRecord`` per step; each row's scope is its slot's (``scopes``, filled
by patch ``v2_salt_route``).

The invariant, and its price: **this path synchronizes with the host every step** (device-to-host copies of
the rows' lengths, the tokens added since the last step and the sampled counts before the drafts exist, one
host-to-device copy after). The host keeps each slot's history, as V1's runner does, so a step copies only new
tokens. The history it reads is the current one (vLLM writes the sampled tokens before ``propose``), so the
drafts are those the V1 path gives for the same history and price. V2 verifies the step's width (K, or the
``num_speculative_tokens`` vLLM passes) in every decoding row: a shorter draft is filled up with the last
sampled token, and the policy measures each step at the width verified. Not here: the one-request step sizing
(the width is vLLM's) and the target's top-k (``observe``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

from freespec.proposers.api import EngineInfo, Row, StepContext
from freespec.proposers.learned import exit_save
from freespec.proposers.learned.state_dir import cap_total, open_root
from freespec.proposers.registry import load_proposer_class
from freespec.scorers.controller import DraftController
from freespec.vllm_plugins.accounting import step_tokens
from freespec.vllm_plugins.breaker import CircuitBreaker, step_budget_s
from freespec.vllm_plugins.draft_checks import checked_draft, draft_rooms
from freespec.vllm_plugins.idle_save import IdleSave
from freespec.vllm_plugins.patches.v2_salt_route import route_installed
from freespec.vllm_plugins.step_record import START, StepRecord
from freespec.vllm_plugins.v2.options import PREFIX, checked_speculator_options
from freespec.vllm_plugins.v2.scopes import SlotScopes

logger = logging.getLogger("freespec")


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
            cap_total(open_root(adapter.state_dir, trust_others=adapter.state_dir_trust_others),
                      adapter.state_dir_max_bytes)
        saving = len(exit_save.registered())
        self.proposer.bind(EngineInfo(vocab_size=self.vocab_size, model=str(model.model),
                                      tokenizer_fingerprint=lambda: _tokenizer_fingerprint(model.tokenizer),
                                      state_dir=adapter.state_dir, state_max_age_s=adapter.state_max_age_s,
                                      state_max_bytes=adapter.state_max_bytes))
        # What the last requests before a quiet spell taught is saved without a next step (as on V1).
        self.idle_save = IdleSave(self.proposer) if len(exit_save.registered()) > saving else None
        max_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.scopes = SlotScopes(adapter.scope, max_reqs)  # each slot's scope (v2.scopes; patch v2_salt_route)
        if adapter.scope == "salt" and not route_installed():
            logger.warning("freespec: plugin %r: patch v2_salt_route is not in force (disabled, or its seam moved: "
                           "freespec doctor), so \"scope\": \"salt\" learns nothing across requests", self.plugin)
        # The V1 adapter's policy and breaker; no step sizing: V2 verifies the width vLLM chose.
        self.control = DraftController(adapter.policy, "off", adapter.step_aside)
        self.breaker = CircuitBreaker(
            step_budget_s(self.proposer, self.plugin, adapter.budget_s, adapter.step_budget_ms is not None), self.plugin)
        self.last = START  # the last step, as the next one measures it
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
        finishing, a preempted one, is released first) and no tenant's scope until the route gives its own."""
        self._release_slot(req_index)
        self.scopes.reset(req_index)
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
        requests stays: the proposer API has no reset), and the warm-up's steps are not measured."""
        for slot in list(self.keys):
            self._release_slot(slot)
        self.last = START

    def _release_slot(self, slot: int) -> None:
        key = self.keys.pop(slot, None)
        if key is not None:
            self._release([key])

    def _release(self, keys: Iterable[int]) -> None:
        """Tell the plugin these requests are gone; a plugin that raises is counted, never propagated."""
        for key in keys:
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
        with self.idle_save.step() if self.idle_save is not None else nullcontext():
            return self._propose(input_batch, n, num_sampled, last_sampled, num_speculative_tokens)

    def _propose(self, input_batch: Any, n: int, num_sampled: torch.Tensor, last_sampled: torch.Tensor,
                 num_speculative_tokens: int | None) -> torch.Tensor:
        idx = input_batch.idx_mapping[:n]
        slots = np.asarray(input_batch.idx_mapping_np[:n])
        # Host syncs: lengths, the tokens added since the last step, what the last step sampled.
        lengths = self.req_states.total_len.gpu[idx].cpu().numpy().astype(np.int64)
        self._copy_new_tokens(idx, slots, lengths)
        num_new = num_sampled[:n].cpu().numpy()
        keys = [self._key(int(slot)) for slot in slots]
        views = [(self.host_tokens[slot, : lengths[i]], int(num_new[i])) for i, slot in enumerate(slots)]
        width = self.k if num_speculative_tokens is None else max(0, min(self.k, int(num_speculative_tokens)))
        tokens = self._step(slots, keys, views, lengths, width)
        filler = last_sampled.view(-1)[idx].cpu().numpy()
        out = np.repeat(filler[:, None], self.k, axis=1).astype(np.int64)
        for i, row in enumerate(tokens):
            out[i, : len(row)] = row
        self.drafts[:n].copy_(torch.from_numpy(out), non_blocking=False)
        self.num_valid[:n].copy_(torch.as_tensor([len(t) for t in tokens], dtype=torch.int32))
        return self.drafts[:n]

    def _step(self, slots: np.ndarray, keys: list[int], views: list[tuple[np.ndarray, int]], lengths: np.ndarray,
              width: int) -> list[list[int]]:
        """The V1 adapter's step around the plugin: the last step measured, the breaker asked, the controller's
        decision and price, the plugin's drafts checked and cut at it; the step kept as ``self.last``. Each row's
        real draft tokens (none where the plugin is off, aside, or failed)."""
        last = self.last
        given = last.given()
        counted = step_tokens(views, [None if key in last.prefilling else given.get(key) for key in keys])
        prefilling = frozenset(key for key, (_, new) in zip(keys, views) if new == 0)
        # What vLLM verifies of each row, filler included (the width in each decoding row): what the next step
        # measures this one by.
        verified = [[0] * (width if new else 0) for _, new in views]
        nothing: list[list[int]] = [[] for _ in keys]
        if not self.breaker.allow():  # not asked, not measured: a gap in the policy's fit
            self.last = StepRecord(None, keys, verified, prefilling, measured=False, token_cost=last.token_cost)
            return nothing
        start = time.perf_counter()
        own_s = (last.plugin_s or 0.0) if self.proposer.prices_own_time else 0.0
        try:
            drafts_now, cost = self.control.step(len(keys), counted, start, last.started, len(last.keys),
                                                 last.drafted, last.plugin_s or 0.0, own_s, last.token_cost)
        except Exception:
            self._failed("the draft controller")
            self.last = StepRecord(None, keys, verified, prefilling, measured=False, token_cost=last.token_cost)
            return nothing
        for change in self.control.changes():
            logger.info("freespec: plugin %r at %s", self.plugin, change)
        if not drafts_now:  # step-aside: the plugin's time is saved; the step is measured all the same
            self.last = StepRecord(start, keys, verified, prefilling, token_cost=cost)
            return nothing
        failure, tokens = None, nothing
        try:
            tokens = self._draft(slots, keys, views, lengths, width, cost)
        except Exception as e:
            self._failed(f"plugin {self.plugin!r}")
            failure = f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - start
        # As on V1: a plugin that raised and opened the breaker forgets the live requests; a slow one keeps them.
        opened = self.breaker.record(failure, seconds)
        if opened and failure is not None:
            self._release(keys)
        self.last = StepRecord(start, keys, verified, prefilling, not opened, seconds, token_cost=cost)
        return tokens

    def _draft(self, slots: np.ndarray, keys: list[int], views: list[tuple[np.ndarray, int]], lengths: np.ndarray,
               width: int, cost: float | None) -> list[list[int]]:
        """The plugin's drafts for the rows, checked (``draft_checks``) and cut at the step's bar (the
        controller's ``shape``: the policy's price, else the plugin's fixed bar), within each row's room."""
        rows = [Row(key, tokens.copy(), new, self.scopes.of(int(slot)))
                for key, (tokens, new), slot in zip(keys, views, slots)]
        step = StepContext(token_cost=cost, budget_s=self.breaker.budget_s)
        drafts = self.proposer.draft(rows, step)
        if not isinstance(drafts, list) or len(drafts) != len(rows):
            raise ValueError(f"plugin returned {len(drafts)} drafts for {len(rows)} rows")
        rooms = draft_rooms(views, lengths, width, self.max_model_len)
        checked = [checked_draft(d, room, self.vocab_size) for d, room in zip(drafts, rooms)]
        return self.control.shape(checked, step.bar(self.proposer.fixed_bar()), [v[0] for v in views], rooms).tokens

    def _failed(self, what: str) -> None:
        self.errors += 1
        if self.errors == 1:
            logger.exception("freespec: %s failed; this step drafts nothing (logged once)", what)

    def breaker_state(self) -> dict:
        """The circuit breaker's state (``closed``, ``open``, ``half_open``), its counters and back-off."""
        return self.breaker.state_dict()


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
