"""The ``pearl`` proposer's draft model: a transformers causal LM with one KV cache per request, in its own thread.

``TorchDraftModel`` is the ``DraftBackend`` of ``state.PearlDrafter``:

- One ``DynamicCache`` per request; rolling back is cropping it. Each forward
  pass asks only for the last position's logits and returns the greedy next
  token with its probability (restricted to the token ids the target knows).
- Batching: a forward pass that feeds one token to each of several requests
  (drafting in a step, post-verify between steps) runs them as one batch: their
  caches are joined along the batch dimension, left-padded to the longest and
  masked, with each request's own positions. The joined cache stays joined
  while the same requests are fed together (a step's drafting rounds and its
  post-verify usually are), and is split back per request when another set is
  fed, a request is rolled back or dropped. Multi-token feeds (prompt catch-up)
  run one request at a time.

``DraftWorker`` owns the draft model in one background thread, so the model
runs while vLLM runs the target: ``step(rows)`` hands a step to the thread
and waits for its chains; as soon as they are returned the thread goes on with
post-verify (``PearlDrafter.extend``) until the next ``step`` asks it to stop,
which it does after the forward pass in flight.

CPU cores: the thread pins itself to ``cores`` (``os.sched_setaffinity(0, ...)``,
which on Linux applies to the calling thread only) and sets its own torch
intra-op thread count; OpenMP keeps that count per thread, so the target's
thread keeps its own (measured, docs/pearl.md). Give vLLM the other cores with
``VLLM_CPU_OMP_THREADS_BIND`` (e.g. target on core 0, ``draft_cores: "1"``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from freespec.proposers.api import Row
from freespec.proposers.pearl.state import Feed, PearlDrafter

logger = logging.getLogger("freespec")


def parse_cores(spec: str) -> set[int]:
    """``"1"``, ``"2-3"``, ``"0,2-3"`` -> a set of CPU ids; ValueError on anything else."""
    cores: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"{spec!r} is not a CPU list like '1', '2-3' or '0,2-3'")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"{spec!r}: range {part!r} is empty")
        cores.update(range(a, b + 1))
    return cores


# --------------------------------------------------------------------------- the model


@dataclass
class _Joined:
    """Caches of several requests joined into one batch (left-padded to the longest)."""

    keys: list[int]
    cache: object  # DynamicCache
    pads: list[int]  # leading pad slots per row
    lengths: list[int]  # tokens each row holds


class TorchDraftModel:
    """A causal LM with one KV cache per request; see the module docstring."""

    def __init__(self, lm, device: str = "cpu", vocab_limit: Optional[int] = None) -> None:
        self.lm = lm.eval()
        self.device = torch.device(device)
        self.vocab_size = int(lm.config.get_text_config().vocab_size)
        # Token ids the target does not have are never drafted.
        self.vocab_limit = min(self.vocab_size, vocab_limit or self.vocab_size)
        self.max_position = int(getattr(lm.config.get_text_config(), "max_position_embeddings", 1 << 30))
        self._caches: dict[int, object] = {}  # key -> DynamicCache (requests not in the joined batch)
        self._lengths: dict[int, int] = {}  # key -> tokens in its cache
        self._joined: Optional[_Joined] = None

    @classmethod
    def load(cls, path: str, device: str = "cpu", dtype: str = "float32") -> "TorchDraftModel":
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        return cls(lm.to(device), device)

    # -- memory ---------------------------------------------------------------
    def weight_bytes(self) -> int:
        seen, total = set(), 0
        for t in list(self.lm.parameters()) + list(self.lm.buffers()):
            if t.data_ptr() not in seen:  # tied embeddings count once
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    def kv_bytes_per_token(self) -> int:
        cfg = self.lm.config.get_text_config()
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        dtype_bytes = next(self.lm.parameters()).element_size()
        return 2 * cfg.num_hidden_layers * heads * head_dim * dtype_bytes

    def kv_bytes(self) -> int:
        joined = self._joined  # read from other threads too: take each reference once
        caches = list(self._caches.values()) + ([joined.cache] if joined is not None else [])
        return sum(layer.keys.numel() * layer.keys.element_size() * 2 for c in caches for layer in c.layers
                   if getattr(layer, "keys", None) is not None)

    def cached_requests(self) -> int:
        return len(self._lengths)

    def cached_tokens(self) -> int:
        return sum(self._lengths.values())

    # -- DraftBackend ---------------------------------------------------------
    def truncate(self, key: int, length: int) -> None:
        if self._lengths.get(key, 0) > length:
            if self._joined is not None and key in self._joined.keys:
                self._split()
            cache = self._caches[key]
            cache.crop(length - self._lengths[key])  # negative: tokens to remove
            self._lengths[key] = length

    def drop(self, key: int) -> None:
        if self._joined is not None and key in self._joined.keys:
            self._split()
        self._caches.pop(key, None)
        self._lengths.pop(key, None)

    @torch.inference_mode()
    def forward(self, feeds: Sequence[Feed]) -> list[tuple[int, float]]:
        for f in feeds:
            held = self._lengths.get(f.key, 0)
            if held < f.start:
                raise RuntimeError(f"draft cache of request {f.key} holds {held} tokens, feed expects {f.start}")
            if held > f.start:
                self.truncate(f.key, f.start)
        singles = [i for i, f in enumerate(feeds) if len(f.tokens) == 1]
        out: list[Optional[tuple[int, float]]] = [None] * len(feeds)
        if len(singles) > 1:
            for i, r in zip(singles, self._forward_joined([feeds[i] for i in singles])):
                out[i] = r
        for i, f in enumerate(feeds):
            if out[i] is None:
                out[i] = self._forward_one(f)
        return out  # type: ignore[return-value]

    # -- internals --------------------------------------------------------------
    def _pick(self, logits: torch.Tensor) -> list[tuple[int, float]]:
        probs = torch.softmax(logits[:, -1, : self.vocab_limit].float(), dim=-1)
        p, tok = probs.max(dim=-1)
        return list(zip(tok.tolist(), p.tolist()))

    def _forward_one(self, f: Feed) -> tuple[int, float]:
        from transformers import DynamicCache

        if self._joined is not None and f.key in self._joined.keys:
            self._split()
        cache = self._caches.get(f.key)
        if cache is None:
            cache = self._caches[f.key] = DynamicCache()
        n = len(f.tokens)
        positions = torch.arange(f.start, f.start + n, device=self.device)
        out = self.lm(
            input_ids=torch.tensor([f.tokens], device=self.device),
            position_ids=positions[None],
            cache_position=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._lengths[f.key] = f.start + n
        return self._pick(out.logits)[0]

    def _forward_joined(self, feeds: list[Feed]) -> list[tuple[int, float]]:
        keys = [f.key for f in feeds]
        j = self._joined
        if j is None or j.keys != keys:
            self._split()
            j = self._joined = self._join(keys)
        width = j.cache.get_seq_length()
        mask = torch.zeros(len(keys), width + 1, dtype=torch.long, device=self.device)
        for row, (pad, n) in enumerate(zip(j.pads, j.lengths)):
            mask[row, pad:] = 1  # a row's slots are contiguous: pads first, then its tokens
        positions = torch.tensor([[n] for n in j.lengths], device=self.device)
        out = self.lm(
            input_ids=torch.tensor([f.tokens for f in feeds], device=self.device),
            attention_mask=mask,
            position_ids=positions,
            cache_position=torch.tensor([width], device=self.device),
            past_key_values=j.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        j.lengths = [n + 1 for n in j.lengths]
        for key, n in zip(keys, j.lengths):
            self._lengths[key] = n
        return self._pick(out.logits)

    def _join(self, keys: list[int]) -> _Joined:
        from transformers import DynamicCache

        lengths = [self._lengths.get(key, 0) for key in keys]
        width = max(lengths)
        parts = [self._caches.pop(key, None) if n else None for key, n in zip(keys, lengths)]
        filled = [c for c in parts if c is not None]
        joined = DynamicCache()
        for li in range(len(filled[0].layers) if filled else 0):
            ref = filled[0].layers[li].keys
            ks, vs = [], []
            for c, n in zip(parts, lengths):
                pad = torch.zeros((1, ref.shape[1], width - n, ref.shape[3]), dtype=ref.dtype, device=ref.device)
                ks.append(torch.cat([pad, c.layers[li].keys], dim=2) if n else pad)
                vs.append(torch.cat([pad, c.layers[li].values], dim=2) if n else pad)
            k, v = torch.cat(ks, dim=0), torch.cat(vs, dim=0)
            joined.update(k[:, :, :0], v[:, :, :0], li)  # creates the layer; it then holds the joined tensors
            joined.layers[li].keys, joined.layers[li].values = k, v
        return _Joined(keys, joined, [width - n for n in lengths], lengths)

    def _split(self) -> None:
        """Give every request of the joined batch its own cache again (copies, so the batch is freed)."""
        from transformers import DynamicCache

        j, self._joined = self._joined, None
        if j is None:
            return
        for row, (key, pad, n) in enumerate(zip(j.keys, j.pads, j.lengths)):
            if key not in self._lengths:
                continue  # dropped while joined
            cache = DynamicCache()
            for li, layer in enumerate(j.cache.layers):
                k = layer.keys[row : row + 1, :, pad : pad + n].clone()
                v = layer.values[row : row + 1, :, pad : pad + n].clone()
                cache.update(k[:, :, :0], v[:, :, :0], li)
                cache.layers[li].keys, cache.layers[li].values = k, v
            self._caches[key] = cache


# --------------------------------------------------------------------------- the thread


@dataclass
class WorkerTimes:
    """Where the time goes, in seconds: what the target waited for and what the draft waited for."""

    step_wait: float = 0.0  # propose() blocked: the target waited for drafts
    in_flight_wait: float = 0.0  # ... of which waiting for a post-verify forward pass to finish
    step_work: float = 0.0  # drafting done inside steps
    background: float = 0.0  # post-verify and catch-up work between steps
    idle: float = 0.0  # the draft thread had nothing to do (waited for the target)

    def as_dict(self) -> dict:
        return {name: round(value, 4) for name, value in vars(self).items()}


class StepTimeout(Exception):
    """The draft thread did not answer a step in time; it goes on with it, and its answer goes unread."""


class DraftWorker:
    """One thread that owns the draft model and the drafter; see the module docstring."""

    def __init__(
        self, drafter: PearlDrafter, *, cores: Optional[set[int]] = None, threads: int = 1, device: str = "cpu"
    ) -> None:
        self.drafter = drafter
        self.cores = cores
        self.threads = threads
        self.device = device
        self.times = WorkerTimes()
        self._cond = threading.Condition()
        self._stop = threading.Event()  # post-verify must stop after the forward in flight
        self._job: Optional[Sequence[Row]] = None
        self._result: Optional[tuple[bool, object]] = None
        self._background = False  # post-verify work may remain
        self._started_job_at = 0.0
        self._closing = False
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def start(self) -> None:
        if self._thread is not None:
            return
        # torch keeps the thread count per thread, but a thread that sets it also changes
        # the default of threads created afterwards; put the caller's back.
        caller_threads = torch.get_num_threads()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="freespec-pearl-draft", daemon=True)
        self._thread.start()
        ready.wait()
        torch.set_num_threads(caller_threads)
        if self._error is not None:
            raise self._error

    def step(self, rows: Sequence[Row], token_cost: Optional[float] = None,
             timeout: Optional[float] = None, sync_feed_tokens: Optional[int] = None) -> list[list[int]]:
        """The chains for this step (blocks, for at most ``timeout`` seconds when given, then StepTimeout;
        the draft stops post-verify after its forward in flight). ``sync_feed_tokens``: a lower limit for
        this step than the drafter's option (``PearlDrafter.step``)."""
        self.start()
        t0 = time.perf_counter()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._stop.set()
        with self._cond:
            self._job, self._result = (rows, token_cost, sync_feed_tokens), None
            self._cond.notify_all()
            while self._result is None:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise StepTimeout(f"no answer within {timeout:.1f} s")
                self._cond.wait(timeout=min(1.0, left))
                if self._result is None and not self._thread.is_alive():
                    raise RuntimeError("pearl: the draft thread has stopped")  # never hang vLLM's step
            ok, value = self._result
            self._result = None
        self.times.step_wait += time.perf_counter() - t0
        self.times.in_flight_wait += max(0.0, self._started_job_at - t0)
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]

    def release(self, key: int) -> None:
        self.drafter.release(key)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until post-verify has nothing left to do (for tests and measurements)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._background or self._job is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._stop.set()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the thread -------------------------------------------------------------
    def _pin(self) -> None:
        if self.cores:
            try:
                os.sched_setaffinity(0, self.cores)  # 0: this thread only (Linux)
            except (AttributeError, OSError) as e:
                raise RuntimeError(
                    f"pearl: draft_cores {sorted(self.cores)} cannot be used by the draft thread: {e}"
                    f" (this process may use {sorted(os.sched_getaffinity(0))})"
                ) from e
        torch.set_num_threads(self.threads)
        if self.device.startswith("cuda"):
            # Its own stream, so the draft's kernels queue beside the target's instead of
            # serialising with them on the default stream (not measured: no GPU here).
            torch.cuda.set_stream(torch.cuda.Stream(torch.device(self.device)))

    def _run(self, ready: threading.Event) -> None:
        try:
            self._pin()
        except BaseException as e:  # reported by start()
            self._error = e
            ready.set()
            return
        ready.set()
        errors = 0
        while True:
            t_idle = time.perf_counter()
            with self._cond:
                while not self._closing and self._job is None and (not self._background or self._stop.is_set()):
                    self._cond.notify_all()  # wait_idle()
                    self._cond.wait()
                if self._closing:
                    return
                job, self._job = self._job, None
            now = time.perf_counter()
            if job is not None:
                self.times.idle += now - t_idle
                self._started_job_at = now
                self._stop.clear()
                try:
                    result = (True, self.drafter.step(*job))
                except Exception as e:  # state may be half-updated: start over
                    self.drafter.reset()
                    result = (False, e)
                self.times.step_work += time.perf_counter() - now
                with self._cond:
                    self._result = result
                    self._background = True
                    self._cond.notify_all()
                continue
            t0 = time.perf_counter()
            try:
                done = self.drafter.extend(self._stop.is_set)
            except Exception:
                errors += 1
                if errors == 1:
                    logger.exception("freespec: pearl post-verify failed; draft state reset (logged once)")
                self.drafter.reset()
                done = True
            self.times.background += time.perf_counter() - t0
            if done:
                with self._cond:
                    self._background = False
                    self._cond.notify_all()
