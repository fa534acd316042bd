"""Draft-tree expansion through the token-recycling adjacency matrix.

What it computes: a static tree template (``tree_template``: ``parents``, ``ranks``, ``depths`` per node,
breadth-first, parent index < child index) is instantiated once per request: node ``n`` holds
``m_ids[t, ranks[n]]`` where ``t`` is its parent's token (the request's root token for depth-0 nodes),
and the edge probability ``m_probs[t, ranks[n]]``. ``tokens`` int32 ``[B, N]``, ``edge_probs`` float32
``[B, N]``. A -1 entry of ``m_ids`` means "never learned": that node gets token -1 and probability 0,
and so do all its descendants; a root of -1 (or any token outside ``[0, V)``) does the same.

Why it is on the hot path: token recycling keeps, for every vocabulary token, the target's top-k next
tokens from the last time the target scored it (``topk.py`` writes them into the ``[vocab, k]`` matrix).
Drafting walks that matrix from each request's last token as a tree, every engine step, for every
request; the chain scorer then picks the path to verify.

Reference: ``expand_tree_reference`` (numpy or torch, one vectorised gather per depth level; what the
CPU proposer runs, with numpy arrays). ``expand_tree_triton`` is tested against it under
``TRITON_INTERPRET=1`` and compiled for sm_90 (tests/test_kernels.py).

Memory traffic of the kernel: one program per request reads the template (``3 * N * 4`` bytes, cached
in L2 across programs), its root, and ``N`` scattered (id, prob) pairs of the matrix (``N * (4 +
itemsize)`` bytes in at most ``N`` cache lines), and writes ``N * 8`` bytes. The matrix itself
(``V * C * (4 + itemsize)``: 7.3 MB at V=151936, C=8, float16) is never copied. The torch reference on
a GPU issues ~10 small kernels per level; the kernel is one launch.

Dispatch: ``expand_tree`` uses Triton when ``m_ids`` is a CUDA tensor and triton imports (or any torch
tensor when ``FREESPEC_FORCE_TRITON=1``, which the interpreter tests set); otherwise the reference.
This module needs only numpy and torch (and optionally triton).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from freespec.kernels import triton_loader

# triton is imported on first use (kernels/triton_loader.py); the kernels' bodies name `tl` as
# a module global, so the loader binds it here.
triton = None
tl = None


def _have_triton() -> bool:
    return triton_loader.bind(globals())


# ---------------------------------------------------------------------------------------------- template
def _is_width(w) -> bool:
    return isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= 1


def tree_template(widths: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """parents, ranks, depths (int32 [N]) of the tree where each depth-d node has ``widths[d]`` children.

    Depth-0 nodes are the root's children (parent -1). Breadth-first order: a level's nodes are grouped
    by parent in parent order, ranks 0..widths[d]-1 within a group, so ``parents[n] < n``.
    """
    widths = list(widths)
    if not widths or not all(_is_width(w) for w in widths):
        raise ValueError(f"widths must be a non-empty sequence of ints >= 1, got {widths}")
    parents, ranks, depths = [], [], []
    level = [-1]  # node indices of the previous level; the root is -1
    for d, w in enumerate(widths):
        nxt = []
        for p in level:
            for r in range(w):
                nxt.append(len(parents))
                parents.append(p)
                ranks.append(r)
                depths.append(d)
        level = nxt
    as32 = functools.partial(np.asarray, dtype=np.int32)
    return as32(parents), as32(ranks), as32(depths)


class _Template(NamedTuple):
    parents: np.ndarray  # int64 [N]
    ranks: np.ndarray  # int64 [N]
    levels: list  # per depth, the int64 indices of its nodes
    max_rank: int
    on_device: dict  # torch.device -> (parents, ranks, depths) int32 tensors for the kernel, made once


@functools.lru_cache(maxsize=64)
def _validated(parents_bytes: bytes, ranks_bytes: bytes) -> _Template:
    """The template's levels, validated once (callers pass the same static template every step)."""
    parents = np.frombuffer(parents_bytes, dtype=np.int64).copy()
    ranks = np.frombuffer(ranks_bytes, dtype=np.int64).copy()
    n = len(parents)
    if len(ranks) != n:
        raise ValueError(f"parents and ranks differ in length ({n} vs {len(ranks)})")
    if n and (np.any(parents < -1) or np.any(parents >= np.arange(n)) or np.any(ranks < 0)):
        raise ValueError("parents must satisfy -1 <= parents[n] < n and ranks must be >= 0")
    depths = np.zeros(n, dtype=np.int64)
    for i in range(n):  # parents come first, so one pass settles every depth
        depths[i] = 0 if parents[i] < 0 else depths[parents[i]] + 1
    levels = [np.flatnonzero(depths == d) for d in range(int(depths.max()) + 1)] if n else []
    return _Template(parents, ranks, levels, int(ranks.max()) if n else -1, {})


def _template(parents, ranks, n_cols: int) -> _Template:
    as_np = [np.ascontiguousarray(x.cpu().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.int64)
             for x in (parents, ranks)]
    if any(a.ndim != 1 for a in as_np):
        raise ValueError("parents and ranks must be 1-D")
    t = _validated(as_np[0].tobytes(), as_np[1].tobytes())
    if t.max_rank >= n_cols:
        raise ValueError(f"ranks go up to {t.max_rank} but the matrix has only {n_cols} columns")
    return t


def _check(m_ids, m_probs, roots) -> None:
    if m_ids.ndim != 2 or m_ids.shape != m_probs.shape:
        raise ValueError(f"m_ids and m_probs must be matrices [V, C] of one shape, got "
                         f"{tuple(m_ids.shape)} and {tuple(m_probs.shape)}")
    if roots.ndim != 1:
        raise ValueError(f"roots must be 1-D [B], got shape {tuple(roots.shape)}")


# ---------------------------------------------------------------------------------------------- reference
def expand_tree_reference(m_ids, m_probs, roots, parents, ranks):
    """tokens int32 [B, N], edge_probs float32 [B, N]; numpy or torch, as ``m_ids`` is (others follow)."""
    is_torch = isinstance(m_ids, torch.Tensor)
    if is_torch:
        dev = m_ids.device
        m_probs = torch.as_tensor(m_probs, device=dev)
        roots = torch.as_tensor(roots, device=dev).to(torch.int64)
        xp = torch
    else:
        m_ids, m_probs = np.asarray(m_ids), np.asarray(m_probs)
        roots = np.asarray(roots.cpu() if isinstance(roots, torch.Tensor) else roots).astype(np.int64)
        xp = np
    _check(m_ids, m_probs, roots)
    par, rank, levels, _, _ = _template(parents, ranks, m_ids.shape[1])
    v = m_ids.shape[0]
    b, n = roots.shape[0], len(par)
    if is_torch:
        tokens = torch.full((b, n), -1, dtype=torch.int32, device=dev)
        probs = torch.zeros((b, n), dtype=torch.float32, device=dev)
        par, rank = torch.as_tensor(par, device=dev), torch.as_tensor(rank, device=dev)
        levels = [torch.as_tensor(lv, device=dev) for lv in levels]
    else:
        tokens = np.full((b, n), -1, dtype=np.int32)
        probs = np.zeros((b, n), dtype=np.float32)
    for nodes in levels:  # a level's parents are all settled by the previous iteration
        p = par[nodes]
        parent_tok = xp.where(p[None, :] >= 0, tokens[:, xp.where(p >= 0, p, 0)], roots[:, None])
        ok = (parent_tok >= 0) & (parent_tok < v)  # -1 (unknown) or out of range: the subtree is unknown
        row = xp.where(ok, parent_tok, 0)
        col = rank[nodes][None, :]
        tok = xp.where(ok, m_ids[row, col], -1)
        tokens[:, nodes] = tok.to(torch.int32) if is_torch else tok  # (torch's index_put does not cast)
        edge = m_probs[row, col]
        edge = edge.float() if is_torch else edge.astype(np.float32)
        probs[:, nodes] = xp.where(tok >= 0, edge, 0)
    return tokens, probs


# ---------------------------------------------------------------------------------------------- Triton
def _expand_kernel(m_ids_ptr, m_probs_ptr, stride_ids, stride_probs, V, roots_ptr,
                   par_ptr, rank_ptr, depth_ptr, tokens_ptr, probs_ptr, N, n_levels, NP: tl.constexpr):
    """One program per request; the whole tree lives in registers, so no level reads memory it wrote."""
    b = tl.program_id(0)
    n = tl.arange(0, NP)
    live = n < N
    par = tl.load(par_ptr + n, mask=live, other=-1)
    rank = tl.load(rank_ptr + n, mask=live, other=0)
    depth = tl.load(depth_ptr + n, mask=live, other=-1)  # padding nodes belong to no level
    root = tl.load(roots_ptr + b).to(tl.int64)  # compared with V before any narrowing
    par_idx = tl.where(par >= 0, par, 0)
    tok = tl.full([NP], -1, dtype=tl.int32)
    prob = tl.zeros([NP], dtype=tl.float32)
    for d in range(n_levels):
        # Parent tokens come from the register vector (tl.gather), settled by the previous level.
        parent_tok = tl.where(par >= 0, tl.gather(tok, par_idx, 0), root)
        level = depth == d
        ok = level & (parent_tok >= 0) & (parent_tok < V)
        row = parent_tok.to(tl.int64)
        t = tl.load(m_ids_ptr + row * stride_ids + rank, mask=ok, other=-1)
        p = tl.load(m_probs_ptr + row * stride_probs + rank, mask=ok, other=0.0).to(tl.float32)
        tok = tl.where(level, t, tok)
        prob = tl.where(level, tl.where(t >= 0, p, 0.0), prob)
    tl.store(tokens_ptr + b.to(tl.int64) * N + n, tok, mask=live)
    tl.store(probs_ptr + b.to(tl.int64) * N + n, prob, mask=live)


_jit = triton_loader.jit


def expand_tree_triton(m_ids: torch.Tensor, m_probs: torch.Tensor, roots, parents, ranks):
    """Triton: same contract as ``expand_tree_reference``, for torch tensors (results on m_ids' device)."""
    if not _have_triton():
        raise RuntimeError("triton is not installed; use expand_tree (it falls back to the reference)")
    dev = m_ids.device
    roots = torch.as_tensor(roots, device=dev)
    m_probs = torch.as_tensor(m_probs, device=dev)
    _check(m_ids, m_probs, roots)
    if m_ids.dtype != torch.int32:
        raise ValueError(f"m_ids must be int32, got {m_ids.dtype}")
    template = _template(parents, ranks, m_ids.shape[1])
    if dev not in template.on_device:
        depths = np.zeros(len(template.parents), dtype=np.int64)
        for d, nodes in enumerate(template.levels):
            depths[nodes] = d
        template.on_device[dev] = tuple(torch.as_tensor(a, dtype=torch.int32, device=dev)
                                        for a in (template.parents, template.ranks, depths))
    par, rank, depth = template.on_device[dev]
    n_levels = len(template.levels)
    b, n = roots.shape[0], par.shape[0]
    tokens = torch.empty((b, n), dtype=torch.int32, device=dev)
    probs = torch.empty((b, n), dtype=torch.float32, device=dev)
    if b == 0 or n == 0:
        return tokens, probs
    if m_ids.stride(1) != 1 or m_probs.stride(1) != 1:
        m_ids, m_probs = m_ids.contiguous(), m_probs.contiguous()
    np2 = 1 << max(0, n - 1).bit_length()
    _jit(_expand_kernel)[(b,)](
        m_ids, m_probs, m_ids.stride(0), m_probs.stride(0), m_ids.shape[0], roots,
        par, rank, depth, tokens, probs, n, n_levels, NP=np2, num_warps=1 if np2 <= 128 else 4,
    )
    return tokens, probs


# ---------------------------------------------------------------------------------------------- dispatch
def use_triton(m_ids) -> bool:
    """Triton for CUDA tensors when it imports; for any torch tensor with FREESPEC_FORCE_TRITON=1 (tests)."""
    return triton_loader.wanted(m_ids) and _have_triton()


def expand_tree(m_ids, m_probs, roots, parents, ranks):
    """tokens int32 [B, N] and edge_probs float32 [B, N] of the template instantiated at each root."""
    if use_triton(m_ids):
        return expand_tree_triton(m_ids, m_probs, roots, parents, ranks)
    return expand_tree_reference(m_ids, m_probs, roots, parents, ranks)
