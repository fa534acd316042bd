"""Per-row top-k of logits with their softmax probabilities, optionally scattered into the recycling matrix.

What it computes: for logits ``[R, V]`` (any float dtype) and ``k`` (1..32), each row's ``k`` largest
logits, best first, as ``ids`` (int32 ``[R, k]``) and ``probs`` (float32 ``[R, k]``): the softmax of the
whole row, computed in float32, evaluated at those ids. ``topk_scatter`` also writes row ``r``'s result
into row ``keys[r]`` of the token-recycling adjacency matrix (``m_ids`` int32 ``[V', C]``, ``m_probs``
float32/float16 ``[V', C]``, first ``k`` columns).

Why it is on the hot path: token recycling learns from every position the target model scores. After
each forward, the target's top-k next tokens at every scored position (accepted and rejected draft
positions alike) become that position's token's row of a ``[vocab, k]`` adjacency matrix, which drafting
then walks as a tree (``tree.py``). So this runs once per engine step over all scored rows, on logits
of 49k-152k columns; a plain ``torch.topk`` plus a full ``softmax`` reads the logits several times and
materialises an ``[R, V]`` float32 copy.

Reference: ``row_topk_reference`` / ``topk_scatter_reference`` (torch; what CPU code runs). The Triton
path is tested against them under ``TRITON_INTERPRET=1`` (tests/test_kernels.py, which also compiles
the kernels for sm_90 without a GPU, since the interpreter skips Triton's compiler). Ties: any index among
equal logits is a valid answer (the kernel prefers the lowest index); ids within a row are distinct.
A row whose logits are all -inf has no distribution: both paths give it probability 0. NaN logits are
not supported (the kernel ranks a positive NaN above +inf).

Memory traffic of the kernel: stage 1 reads the logits once (``R * V * itemsize`` bytes, the only large
term) and writes ``R * ceil(V / BLOCK_V) * (8k + 8)`` bytes of per-block candidates and logsumexp
partials; stage 2 reads those back and writes ``R * k * 8`` bytes of results, plus, fused for
``topk_scatter``, ``k`` ids and probs into each keyed matrix row. No ``[R, V]`` intermediate exists.
Compute, not traffic, may bound stage 1 at large R: it makes ``k`` max-reduction passes over each block
(int32 keys for fp16/bf16 logits, int64 for float32); scripts/kernel_timing.py reports the achieved
bandwidth against the card's peak.

Dispatch: ``row_topk``/``topk_scatter`` use Triton for CUDA tensors when triton imports (or for any
tensor when ``FREESPEC_FORCE_TRITON=1``, which the interpreter tests set); otherwise the reference.
This module needs only torch (and optionally triton): scripts/kernel_timing.py loads it by file path.
"""
from __future__ import annotations


import torch

from freespec.kernels import triton_loader

# triton is imported on first use (kernels/triton_loader.py); the kernels' bodies name `tl` as
# a module global, so the loader binds it here.
triton = None
tl = None


def _have_triton() -> bool:
    return triton_loader.bind(globals())


MAX_K = 32
DEFAULT_BLOCK_V = 4096  # stage-1 columns per program; scripts/kernel_timing.py times 2048/4096/8192


# ---------------------------------------------------------------------------------------------- checks
def _check(logits: torch.Tensor, k: int) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        what = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 2-D float tensor [R, V], got {what}")
    v = logits.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min(MAX_K, v):
        raise ValueError(f"k must be an int in [1, min({MAX_K}, V={v})], got k={k!r}")


def _check_scatter(logits, keys, m_ids, m_probs, k) -> None:
    _check(logits, k)
    if keys.dim() != 1 or keys.shape[0] != logits.shape[0] or keys.is_floating_point():
        raise ValueError(f"keys must be an integer tensor [R={logits.shape[0]}], "
                         f"got {keys.dtype} {tuple(keys.shape)}")
    if m_ids.dim() != 2 or m_ids.dtype != torch.int32:
        raise ValueError(f"m_ids must be an int32 matrix [V', C], got {m_ids.dtype} {tuple(m_ids.shape)}")
    if m_probs.shape != m_ids.shape or m_probs.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"m_probs must be a float32/float16/bfloat16 matrix shaped like m_ids "
                         f"{tuple(m_ids.shape)}, got {m_probs.dtype} {tuple(m_probs.shape)}")
    if m_ids.shape[1] < k:
        raise ValueError(f"k={k} exceeds the matrix's {m_ids.shape[1]} columns")
    if len({t.device for t in (logits, keys, m_ids, m_probs)}) != 1:
        raise ValueError("logits, keys, m_ids and m_probs must be on one device")


def winning_keys(keys: torch.Tensor, n_rows: int) -> torch.Tensor:
    """``keys`` (int64) with every row that must not write set to -1.

    A key writes only if it is in ``[0, n_rows)`` and no later row has the same key, so duplicate keys
    resolve to the highest row index (what sequential assignment would leave) and the scatter never has
    two writers for one matrix row. Sort-based, so no host sync and O(R log R) on the device.
    """
    keys = keys.to(torch.int64)
    valid = (keys >= 0) & (keys < n_rows)
    keys = torch.where(valid, keys, -1)
    sorted_keys, order = torch.sort(keys, stable=True)  # stable: equal keys stay in row order
    last = torch.ones_like(valid)
    last[:-1] = sorted_keys[:-1] != sorted_keys[1:]
    winner = torch.empty_like(valid)
    winner[order] = last
    return torch.where(winner & valid, keys, -1)


# ---------------------------------------------------------------------------------------------- reference
def row_topk_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch: ids int32 [R, k] of the k largest logits per row (best first), probs float32 [R, k]."""
    _check(logits, k)
    x = logits.float()
    values, ids = torch.topk(x, k, dim=1, sorted=True)
    lse = torch.logsumexp(x, dim=1, keepdim=True)
    # All -inf row: lse is -inf and values - lse is NaN; such a row has no distribution -> 0.
    probs = torch.where(lse == float("-inf"), 0.0, torch.exp(values - lse))
    return ids.to(torch.int32), probs


def topk_scatter_reference(logits, keys, m_ids, m_probs, k):
    """torch: ``row_topk_reference`` plus ``m_ids[keys[r], :k] = ids[r]`` (same for probs) for keys >= 0."""
    _check_scatter(logits, keys, m_ids, m_probs, k)
    ids, probs = row_topk_reference(logits, k)
    keys = winning_keys(keys, m_ids.shape[0])
    rows = torch.nonzero(keys >= 0).flatten()
    m_ids[keys[rows], :k] = ids[rows]
    m_probs[keys[rows], :k] = probs[rows].to(m_probs.dtype)
    return ids, probs


# ---------------------------------------------------------------------------------------------- Triton
# The kernels are plain functions decorated on first use (_jit), not at import: triton decides at
# decoration time whether a kernel is compiled or interpreted (TRITON_INTERPRET), so a test can switch
# the interpreter on after importing this module. (Triton's own helpers such as tl.max are decorated when
# triton is imported, so the interpreter also needs TRITON_INTERPRET=1 at that moment; see the tests.)


def _topk_block_kernel(x_ptr, stride_x, V, cand_ptr, bmax_ptr, bsum_ptr, NBLK,
                       K: tl.constexpr, BLOCK_V: tl.constexpr, NARROW: tl.constexpr):
    """Stage 1, one program per (row, block of BLOCK_V columns): the block's top-K and softmax partials."""
    row = tl.program_id(0)
    blk = tl.program_id(1)
    cols = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)

    # logsumexp partials; an all -inf block has max -inf, and exp(x - 0) = 0 gives sum 0 instead of NaN.
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp(x - m_safe), axis=0)
    part = row * NBLK + blk
    tl.store(bmax_ptr + part, m)
    tl.store(bsum_ptr + part, s)

    # One int64 per column orders by (logit, lower column first): the float's bits mapped to an int32 of
    # the same order in the high half, (2^31-1 - column) in the low half. Every key is distinct, so each
    # top-K step is one max reduction and one compare (no separate argmax, no duplicate picks among
    # equal or -inf logits; padding columns past V rank below every real column with the same value).
    # These K passes over the block, not the load, are most of the kernel's work. A taken key is set to
    # -2^63+1, below every real key.
    bits = x.to(tl.int32, bitcast=True)
    out = cand_ptr + part.to(tl.int64) * K
    if NARROW:
        # fp16/bf16 logits widen to float32 with the low 13 bits zero, so the column within the block
        # (BLOCK_V <= 8192) fits there and a key is one int32: half the instructions of int64 keys.
        # Only bits 13..30 are flipped for negatives, which keeps the low bits free and the order.
        c = tl.arange(0, BLOCK_V)
        packed32 = (bits ^ ((bits >> 31) & 0x7FFFE000)) | (8191 - c)
        for i in tl.static_range(K):
            best = tl.max(packed32, axis=0)
            packed32 = tl.where(packed32 == best, -2147483647, packed32)
            # Re-encode as the int64 key of the wide path (what stage 2 reads).
            high = best & -8192
            fbits = high ^ ((high >> 31) & 0x7FFFE000)
            col = blk * BLOCK_V + 8191 - (best & 8191)
            wide = fbits ^ ((fbits >> 31) & 0x7FFFFFFF)
            tl.store(out + i, (wide.to(tl.int64) << 32) | (0x7FFFFFFF - col).to(tl.int64))
    else:
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        packed = (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)
        for i in tl.static_range(K):
            best = tl.max(packed, axis=0)
            tl.store(out + i, best)
            packed = tl.where(packed == best, -9223372036854775807, packed)


def _topk_merge_kernel(cand_ptr, bmax_ptr, bsum_ptr, ids_ptr, probs_ptr,
                       keys_ptr, m_ids_ptr, m_probs_ptr, stride_m_ids, stride_m_probs, NBLK,
                       K: tl.constexpr, KP: tl.constexpr, NC: tl.constexpr, NBP: tl.constexpr,
                       SCATTER: tl.constexpr):
    """Stage 2, one program per row: merge the blocks' candidates and partials; write (and scatter)."""
    row = tl.program_id(0)
    n = NBLK * K
    c = tl.arange(0, NC)
    packed = tl.load(cand_ptr + row.to(tl.int64) * n + c, mask=c < n, other=-9223372036854775807)

    b = tl.arange(0, NBP)
    bmax = tl.load(bmax_ptr + row * NBLK + b, mask=b < NBLK, other=float("-inf"))
    bsum = tl.load(bsum_ptr + row * NBLK + b, mask=b < NBLK, other=0.0)
    m = tl.max(bmax, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(bsum * tl.exp(bmax - m_safe), axis=0)  # sum over the row of exp(x - m)

    j = tl.arange(0, KP)
    ids = tl.zeros([KP], dtype=tl.int32)
    values = tl.full([KP], float("-inf"), dtype=tl.float32)
    for i in tl.static_range(K):
        best = tl.max(packed, axis=0)
        packed = tl.where(packed == best, -9223372036854775807, packed)
        col = 0x7FFFFFFF - (best & 0xFFFFFFFF).to(tl.int32)
        ordered = (best >> 32).to(tl.int32)
        value = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        ids = tl.where(j == i, col, ids)
        values = tl.where(j == i, value, values)
    # total is 0 only for an all -inf row (no distribution: probability 0, not 0/0).
    probs = tl.where(total > 0, tl.exp(values - m_safe) / tl.where(total > 0, total, 1.0), 0.0)

    keep = j < K
    tl.store(ids_ptr + row * K + j, ids, mask=keep)
    tl.store(probs_ptr + row * K + j, probs, mask=keep)
    if SCATTER:
        # The fusion: this row's result goes straight into its token's matrix row. Losing duplicates
        # were set to -1 beforehand (winning_keys), so no two programs write one matrix row.
        key = tl.load(keys_ptr + row).to(tl.int64)
        # Not `keep & (key >= 0)`: triton 3.9's interpreter gives bool-vector & bool-scalar an int32 type.
        ok = j < tl.where(key >= 0, K, 0)
        tl.store(m_ids_ptr + key * stride_m_ids + j, ids, mask=ok)
        tl.store(m_probs_ptr + key * stride_m_probs + j, probs.to(m_probs_ptr.dtype.element_ty), mask=ok)


_jit = triton_loader.jit


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _launch(logits, k, block_v, keys=None, m_ids=None, m_probs=None):
    if not _have_triton():
        raise RuntimeError("triton is not installed; use row_topk / topk_scatter (they fall back to torch)")
    r, v = logits.shape
    ids = torch.empty((r, k), dtype=torch.int32, device=logits.device)
    probs = torch.empty((r, k), dtype=torch.float32, device=logits.device)
    if r == 0:
        return ids, probs
    block_v = block_v or DEFAULT_BLOCK_V
    if block_v < 1 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    block_v = min(block_v, _next_pow2(v))
    block_v = max(block_v, _next_pow2(k))  # a block must hold k distinct columns (padding counts)
    nblk = triton.cdiv(v, block_v)
    dev = logits.device
    cand = torch.empty((r, nblk, k), dtype=torch.int64, device=dev)
    bmax = torch.empty((r, nblk), dtype=torch.float32, device=dev)
    bsum = torch.empty((r, nblk), dtype=torch.float32, device=dev)
    _jit(_topk_block_kernel)[(r, nblk)](
        logits, logits.stride(0), v, cand, bmax, bsum, nblk,
        K=k, BLOCK_V=block_v, NARROW=logits.element_size() == 2 and block_v <= 8192,
        num_warps=4 if block_v <= 2048 else 8,
    )
    scatter = keys is not None
    if not scatter:  # unused pointer arguments (SCATTER is a constexpr, the stores compile away)
        keys, m_ids, m_probs = ids, ids, probs
    nc = _next_pow2(nblk * k)
    _jit(_topk_merge_kernel)[(r,)](
        cand, bmax, bsum, ids, probs, keys, m_ids, m_probs, m_ids.stride(0), m_probs.stride(0), nblk,
        K=k, KP=_next_pow2(k), NC=nc, NBP=_next_pow2(nblk), SCATTER=scatter, num_warps=4 if nc <= 1024 else 8,
    )
    return ids, probs


def row_topk_triton(logits: torch.Tensor, k: int, *, block_v: int | None = None):
    """Triton: same contract as ``row_topk_reference``. ``block_v``: columns per stage-1 program."""
    _check(logits, k)
    return _launch(logits, k, block_v)


def topk_scatter_triton(logits, keys, m_ids, m_probs, k, *, block_v: int | None = None):
    """Triton: same contract as ``topk_scatter_reference``; stage 2 writes the matrix rows directly."""
    _check_scatter(logits, keys, m_ids, m_probs, k)
    if m_ids.stride(1) != 1 or m_probs.stride(1) != 1:
        raise ValueError("m_ids and m_probs must have contiguous rows (stride 1 along C)")
    return _launch(logits, k, block_v, winning_keys(keys, m_ids.shape[0]), m_ids, m_probs)


# ---------------------------------------------------------------------------------------------- dispatch
def use_triton(t: torch.Tensor) -> bool:
    """Triton for CUDA tensors when it imports; for any tensor with FREESPEC_FORCE_TRITON=1 (tests)."""
    return triton_loader.wanted(t) and _have_triton()


def row_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids int32 [R, k] and probs float32 [R, k] of each row's k largest logits (Triton or torch)."""
    return row_topk_triton(logits, k) if use_triton(logits) else row_topk_reference(logits, k)


def topk_scatter(logits, keys, m_ids, m_probs, k):
    """``row_topk`` and, for rows with ``keys[r] >= 0``, ``m_ids/m_probs[keys[r], :k]`` = that row's result.

    Duplicate keys: the highest row index wins. Keys outside ``[0, len(m_ids))`` write nothing.
    """
    if use_triton(logits):
        return topk_scatter_triton(logits, keys, m_ids, m_probs, k)
    return topk_scatter_reference(logits, keys, m_ids, m_probs, k)
