"""Parity of the Triton kernels (kernels/topk.py, kernels/tree.py) with their references.

The Triton code runs on the CPU under Triton's interpreter (TRITON_INTERPRET=1) and is reached through
the public dispatchers with FREESPEC_FORCE_TRITON=1; a spy on each module's ``_jit`` proves which
kernels ran and that they ran interpreted. The interpreter is slow, so shapes stay small (one
49k-vocabulary case with two rows). The references themselves are checked against plain loops.
"""
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch


def _import_triton_for_the_interpreter() -> tuple[str, str]:
    """Import triton with TRITON_INTERPRET=1; returns (why triton is missing, why its interpreter cannot run).

    The interpreter needs the variable when triton is *first imported*: triton.language's own helpers
    (tl.max, tl.sum, ...) are @triton.jit functions decorated then, and compiled-mode ones refuse to run
    inside an interpreted kernel. The variable is put back right after, so nothing else in this process
    (or its subprocesses) runs interpreted; the kernels under test are decorated lazily, under the
    fixture below, which sets it again.
    """
    if "triton" not in sys.modules:
        previous = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            import triton.language  # noqa: F401
        except ImportError:
            pass
        finally:
            if previous is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = previous
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return "triton is not importable, so its interpreter cannot run the kernels (pip install triton)", ""
    if not isinstance(tl.max, InterpretedFunction):
        return "", ("something imported triton in this process before tests/test_kernels.py could set "
                    "TRITON_INTERPRET=1, so its interpreter cannot run: set TRITON_INTERPRET=1 in the "
                    "environment of the pytest run")
    return "", ""


NO_TRITON, NO_INTERPRETER = _import_triton_for_the_interpreter()

from freespec.kernels import topk, tree  # after triton's import above

REPO = Path(__file__).resolve().parents[1]
# Skipped only without triton; a triton that cannot interpret fails the tests instead (see `launched`).
needs_triton = pytest.mark.skipif(bool(NO_TRITON), reason=NO_TRITON)
BLOCK, MERGE, EXPAND = "_topk_block_kernel", "_topk_merge_kernel", "_expand_kernel"


@pytest.fixture
def launched(monkeypatch):
    """Interpreter on, Triton forced; yields the names of the kernels launched (through ``_jit``)."""
    from triton.runtime.interpreter import InterpretedFunction

    if NO_INTERPRETER:
        pytest.fail(NO_INTERPRETER)

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FREESPEC_FORCE_TRITON", "1")
    names = []
    for module in (topk, tree):
        def spy(fn, original=module._jit):
            kernel = original(fn)
            assert isinstance(kernel, InterpretedFunction), "kernel was compiled, not interpreted"
            names.append(fn.__name__)
            return kernel

        monkeypatch.setattr(module, "_jit", spy)
    return names


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------- top-k
def check_topk(x, k, ids, probs, exact_ids=False):
    """ids/probs are a valid top-k of x: same values as the reference, distinct in-range ids, same probs."""
    ref_ids, ref_probs = topk.row_topk_reference(x, k)
    r, v = x.shape
    assert ids.shape == (r, k) and ids.dtype == torch.int32
    assert probs.shape == (r, k) and probs.dtype == torch.float32
    if r == 0:
        return
    assert ((ids >= 0) & (ids < v)).all()
    assert (ids.sort(dim=1).values.diff(dim=1) != 0).all(), "ids repeat within a row"
    x32 = x.float()
    assert torch.equal(x32.gather(1, ids.long()), x32.gather(1, ref_ids.long()))
    if exact_ids:
        assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(probs, ref_probs, rtol=1e-5, atol=1e-8)


def run_topk(x, k, launched):
    launched.clear()
    ids, probs = topk.row_topk(x, k)  # the dispatcher, forced onto the Triton path
    assert launched == ([BLOCK, MERGE] if len(x) else [])
    return ids, probs


@needs_triton
@pytest.mark.parametrize("k", [1, 8, 32])
def test_topk_random_fp32_matches_exactly(launched, k):
    x = torch.randn(5, 3000, generator=gen(k)) * 4
    ids, probs = run_topk(x, k, launched)
    check_topk(x, k, ids, probs, exact_ids=True)  # no ties in random floats: the very same ids


@needs_triton
@pytest.mark.parametrize("block_v", [256, 1024, 4096])
def test_topk_vocab_not_a_multiple_of_the_block(launched, block_v):
    x = torch.randn(3, 1000, generator=gen(1))
    x[0, 999] = 50.0  # the very last column (in the tail block) is the best one
    ids, probs = topk.row_topk_triton(x, 8, block_v=block_v)
    assert launched == [BLOCK, MERGE]
    check_topk(x, 8, ids, probs, exact_ids=True)
    assert ids[0, 0] == 999


@needs_triton
def test_topk_large_vocab_k32(launched):
    x = torch.randn(2, 49152 + 7, generator=gen(2)) * 3
    x[1, 49152 + 6] = 30.0
    ids, probs = run_topk(x, 32, launched)
    check_topk(x, 32, ids, probs, exact_ids=True)


@needs_triton
def test_topk_ties_and_minus_inf_rows(launched):
    v, ninf = 700, float("-inf")
    x = torch.randint(0, 4, (6, v), generator=gen(3)).float()  # a few hundred equal values per level
    x[1] = 2.5  # all equal
    x[2] = ninf  # no distribution: probabilities 0
    x[3] = ninf
    x[3, [5, 600, 650]] = torch.tensor([1.0, 3.0, 1.0])  # fewer finite values than k: the rest are -inf ties
    x[4, 0] = ninf
    for k in (1, 8, 32):
        ids, probs = run_topk(x, k, launched)
        check_topk(x, k, ids, probs)
        assert (probs[2] == 0).all()
        assert ids[3, 0] == 600
        if k >= 3:
            assert {int(i) for i in ids[3, 1:3]} == {5, 650}
            assert (probs[3, 3:] == 0).all()
    y = x[:, :320]
    ids, probs = topk.row_topk_triton(y, 32, block_v=64)  # several blocks, each with ties
    check_topk(y, 32, ids, probs)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_topk_other_input_dtypes(launched, dtype):
    # 16-bit inputs take the kernel's int32-key path, which stores the column within the block in the
    # float's spare low bits: several blocks, negative values and ties (after rounding) exercise it.
    x = (torch.randn(4, 2500, generator=gen(4)) * 5).to(dtype)
    for k in (1, 8, 32):
        ids, probs = run_topk(x, k, launched)
        check_topk(x, k, ids, probs)
    for y in (x, x - 40):  # x - 40: every logit negative
        ids, probs = topk.row_topk_triton(y, 8, block_v=512)
        check_topk(y, 8, ids, probs)
    ties = torch.randint(-3, 3, (3, 1500), generator=gen(8)).to(dtype)
    ties[1] = float("-inf")
    ties[2, 1400:] = 7.0  # a tie for first place in the last block
    ids, probs = topk.row_topk_triton(ties, 16, block_v=256)
    check_topk(ties, 16, ids, probs)
    assert sorted(ids[2, :16].tolist()) == list(range(1400, 1416))  # lowest columns among equal values


@needs_triton
def test_topk_strided_rows_and_empty_batch(launched):
    wide = torch.randn(3, 1200, generator=gen(5))
    x = wide[:, 100:1100]  # row stride 1200, not V
    ids, probs = run_topk(x, 8, launched)
    check_topk(x, 8, ids, probs, exact_ids=True)
    ids, probs = run_topk(torch.empty(0, 1000), 8, launched)
    check_topk(torch.empty(0, 1000), 8, ids, probs)


@pytest.mark.parametrize("fn", [topk.row_topk_reference, topk.row_topk])
def test_topk_rejects_bad_k(fn):
    x = torch.zeros(2, 16)
    for k in (0, 33, 17, 2.0, True):
        with pytest.raises(ValueError, match="k"):
            fn(x, k)


def test_topk_reference_is_softmax_then_topk():
    x = torch.randn(4, 300, generator=gen(6), dtype=torch.float64)
    ids, probs = topk.row_topk_reference(x, 5)
    full = torch.softmax(x.float(), dim=1)
    assert torch.equal(ids.long(), full.topk(5, dim=1).indices)
    torch.testing.assert_close(probs, full.gather(1, ids.long()))


# ---------------------------------------------------------------------------------------------- scatter
def sequential_scatter(keys, ids, probs, m_ids, m_probs):
    """What one-row-at-a-time assignment leaves: the later row wins; keys outside the matrix write nothing."""
    k = ids.shape[1]
    for r, key in enumerate(keys.tolist()):
        if 0 <= key < len(m_ids):
            m_ids[key, :k] = ids[r]
            m_probs[key, :k] = probs[r].to(m_probs.dtype)


def scatter_case(seed, r=9, v=600, c=10, m_dtype=torch.float16):
    x = torch.randn(r, v, generator=gen(seed)) * 3
    keys = torch.tensor([4, -1, 7, 4, 599, 7, 600, -5, 4][:r])  # duplicates, -1, < -1, out of range
    m_ids = torch.randint(-1, v, (v, c), generator=gen(seed + 1), dtype=torch.int32)
    m_probs = torch.rand(v, c, generator=gen(seed + 2)).to(m_dtype)
    return x, keys, m_ids, m_probs


@pytest.mark.parametrize("m_dtype", [torch.float16, torch.float32])
def test_scatter_reference_is_sequential_assignment(m_dtype):
    x, keys, m_ids, m_probs = scatter_case(10, m_dtype=m_dtype)
    want_ids, want_probs = m_ids.clone(), m_probs.clone()
    ids, probs = topk.topk_scatter_reference(x, keys, m_ids, m_probs, 8)
    sequential_scatter(keys, ids, probs, want_ids, want_probs)
    assert torch.equal(m_ids, want_ids) and torch.equal(m_probs, want_probs)
    assert torch.equal(m_ids[4, :8], ids[8]) and torch.equal(m_ids[7, :8], ids[5])  # highest row wins


@needs_triton
@pytest.mark.parametrize("m_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("k", [1, 8])
def test_scatter_triton_matches_reference(launched, m_dtype, k):
    x, keys, m_ids, m_probs = scatter_case(20 + k, m_dtype=m_dtype)
    want_ids, want_probs = m_ids.clone(), m_probs.clone()
    ref_ids, ref_probs = topk.topk_scatter_reference(x, keys, want_ids, want_probs, k)
    ids, probs = topk.topk_scatter(x, keys, m_ids, m_probs, k)
    assert launched == [BLOCK, MERGE]
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(probs, ref_probs, rtol=1e-5, atol=1e-8)
    assert torch.equal(m_ids, want_ids)  # columns k.. and unkeyed rows untouched
    rtol = 1e-3 if m_dtype == torch.float16 else 1e-5
    torch.testing.assert_close(m_probs, want_probs, rtol=rtol, atol=1e-7)


@needs_triton
def test_scatter_triton_empty_batch_and_all_negative_keys(launched):
    m_ids = torch.full((50, 8), -1, dtype=torch.int32)
    m_probs = torch.zeros(50, 8, dtype=torch.float16)
    ids, probs = topk.topk_scatter(torch.empty(0, 50), torch.empty(0, dtype=torch.int64), m_ids, m_probs, 8)
    assert ids.shape == (0, 8) and probs.shape == (0, 8) and launched == []
    topk.topk_scatter(torch.randn(3, 50, generator=gen(7)), torch.tensor([-1, -1, -1]), m_ids, m_probs, 8)
    assert (m_ids == -1).all() and (m_probs == 0).all() and launched == [BLOCK, MERGE]


def test_scatter_rejects_bad_shapes():
    x = torch.randn(2, 20)
    m_ids, m_probs = torch.zeros(20, 4, dtype=torch.int32), torch.zeros(20, 4)
    with pytest.raises(ValueError, match="k=8"):
        topk.topk_scatter(x, torch.tensor([0, 1]), m_ids, m_probs, 8)
    with pytest.raises(ValueError, match="keys"):
        topk.topk_scatter(x, torch.tensor([0, 1, 2]), m_ids, m_probs, 2)
    with pytest.raises(ValueError, match="m_ids"):
        topk.topk_scatter(x, torch.tensor([0, 1]), m_ids.long(), m_probs, 2)


# ---------------------------------------------------------------------------------------------- tree
def test_tree_template_shape_and_order():
    parents, ranks, depths = tree.tree_template((4, 2, 2, 1, 1, 1, 1, 1))
    assert len(parents) == 4 + 8 + 16 * 6 and parents.dtype == ranks.dtype == depths.dtype == np.int32
    assert (parents < np.arange(len(parents))).all()
    assert list(parents[:8]) == [-1, -1, -1, -1, 0, 0, 1, 1] and list(ranks[:6]) == [0, 1, 2, 3, 0, 1]
    for n in range(len(parents)):
        kids = np.flatnonzero(parents == n)
        assert list(ranks[kids]) == list(range(len(kids)))
        assert len(kids) == ((4, 2, 2, 1, 1, 1, 1, 1) + (0,))[depths[n] + 1]
        assert depths[n] == (0 if parents[n] < 0 else depths[parents[n]] + 1)
    assert list(tree.tree_template([3])[0]) == [-1, -1, -1]
    assert list(tree.tree_template([1] * 5)[0]) == [-1, 0, 1, 2, 3]


@pytest.mark.parametrize("widths", [[], [2, 0], [2, -1], [1.5], [True]])
def test_tree_template_rejects_bad_widths(widths):
    with pytest.raises(ValueError, match="widths"):
        tree.tree_template(widths)


def tree_case(seed, v=300, c=8, b=7, m_dtype=np.float16):
    rng = np.random.default_rng(seed)
    m_ids = rng.integers(0, v, (v, c)).astype(np.int32)
    m_ids[rng.random((v, c)) < 0.15] = -1  # unknown entries
    m_ids[5] = -1  # a token never seen
    m_probs = rng.random((v, c)).astype(m_dtype)
    roots = np.concatenate([[5, -1, v + 3], rng.integers(0, v, b - 3)]).astype(np.int64)
    return m_ids, m_probs, roots


def naive_expand(m_ids, m_probs, roots, parents, ranks):
    tokens = np.full((len(roots), len(parents)), -1, dtype=np.int32)
    probs = np.zeros(tokens.shape, dtype=np.float32)
    for b, root in enumerate(roots):
        for n, (p, r) in enumerate(zip(parents, ranks)):
            t = root if p < 0 else tokens[b, p]
            if 0 <= t < len(m_ids) and m_ids[t, r] >= 0:
                tokens[b, n] = m_ids[t, r]
                probs[b, n] = m_probs[t, r]
    return tokens, probs


@pytest.mark.parametrize("widths", [(4, 2, 2, 1, 1, 1, 1, 1), (8,), (1,) * 6, (3, 3, 3)])
def test_expand_reference_numpy_and_torch(widths):
    parents, ranks, _ = tree.tree_template(widths)
    m_ids, m_probs, roots = tree_case(30)
    want = naive_expand(m_ids, m_probs, roots, parents, ranks)
    got = tree.expand_tree(m_ids, m_probs, roots, parents, ranks)  # numpy in: the reference, numpy out
    assert all(isinstance(a, np.ndarray) for a in got)
    assert got[0].dtype == np.int32 and got[1].dtype == np.float32
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert (got[0][1:3] == -1).all()  # roots -1 and out of range: nothing known
    t = torch.from_numpy
    as_torch = tree.expand_tree_reference(t(m_ids), t(m_probs), t(roots), t(parents), t(ranks))
    assert all(isinstance(a, torch.Tensor) for a in as_torch)
    np.testing.assert_array_equal(as_torch[0].numpy(), want[0])
    np.testing.assert_array_equal(as_torch[1].numpy(), want[1])


def test_expand_reference_rejects_ranks_beyond_the_matrix():
    parents, ranks, _ = tree.tree_template((9,))
    m_ids, m_probs, roots = tree_case(31)
    with pytest.raises(ValueError, match="ranks"):
        tree.expand_tree(m_ids, m_probs, roots, parents, ranks)


@needs_triton
@pytest.mark.parametrize("m_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("widths", [(4, 2, 2, 1, 1, 1, 1, 1), (8,), (2,) * 7])
def test_expand_triton_matches_reference(launched, m_dtype, widths):
    parents, ranks, _ = tree.tree_template(widths)
    m_ids, m_probs, roots = tree_case(40, m_dtype=m_dtype)
    want = tree.expand_tree_reference(m_ids, m_probs, roots, parents, ranks)
    assert launched == []  # numpy input never takes the Triton path
    t = torch.from_numpy
    tokens, probs = tree.expand_tree(t(m_ids), t(m_probs), t(roots), parents, ranks)
    assert launched == [EXPAND]
    assert tokens.dtype == torch.int32 and probs.dtype == torch.float32
    np.testing.assert_array_equal(tokens.numpy(), want[0])
    np.testing.assert_array_equal(probs.numpy(), want[1])


@needs_triton
def test_expand_triton_empty_batch(launched):
    parents, ranks, _ = tree.tree_template((4, 2))
    m_ids, m_probs, _ = tree_case(41)
    tokens, probs = tree.expand_tree(torch.from_numpy(m_ids), torch.from_numpy(m_probs),
                                     torch.empty(0, dtype=torch.int64), parents, ranks)
    assert tokens.shape == probs.shape == (0, 12) and launched == []


# ---------------------------------------------------------------------------------------------- packaging
def test_modules_import_and_fall_back_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    monkeypatch.setenv("FREESPEC_FORCE_TRITON", "1")
    for name in ("topk", "tree"):
        spec = importlib.util.spec_from_file_location(f"_no_triton_{name}", REPO / "kernels" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.triton is None and not module.use_triton(torch.zeros(1))
        if name == "topk":
            ids, _ = module.row_topk(torch.tensor([[0.0, 2.0, 1.0]]), 2)
            assert ids.tolist() == [[1, 2]]


COMPILE_FOR_H100 = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, sys.argv[1])
import topk, tree
assert topk._have_triton() and tree._have_triton()
target = GPUTarget("cuda", 90, 32)
block = dict(x_ptr="*bf16", stride_x="i32", V="i32", cand_ptr="*i64", bmax_ptr="*fp32", bsum_ptr="*fp32",
             NBLK="i32")
merge = dict(cand_ptr="*i64", bmax_ptr="*fp32", bsum_ptr="*fp32", ids_ptr="*i32", probs_ptr="*fp32",
             keys_ptr="*i64", m_ids_ptr="*i32", m_probs_ptr="*fp16", stride_m_ids="i32", stride_m_probs="i32",
             NBLK="i32")
expand = dict(m_ids_ptr="*i32", m_probs_ptr="*fp16", stride_ids="i32", stride_probs="i32", V="i32",
              roots_ptr="*i64", par_ptr="*i32", rank_ptr="*i32", depth_ptr="*i32", tokens_ptr="*i32",
              probs_ptr="*fp32", N="i32", n_levels="i32")
for fn, sig, consts, warps in [
    (topk._topk_block_kernel, block, dict(K=8, BLOCK_V=4096, NARROW=True), 8),
    (topk._topk_block_kernel, {**block, "x_ptr": "*fp32"}, dict(K=32, BLOCK_V=2048, NARROW=False), 4),
    (topk._topk_merge_kernel, merge, dict(K=8, KP=8, NC=512, NBP=64, SCATTER=True), 4),
    (topk._topk_merge_kernel, merge, dict(K=3, KP=4, NC=128, NBP=64, SCATTER=False), 4),
    (tree._expand_kernel, expand, dict(NP=128), 1),
]:
    sig = {**sig, **{name: "constexpr" for name in consts}}
    kernel = triton.compile(ASTSource(fn=triton.jit(fn), signature=sig, constexprs=consts), target=target,
                            options={"num_warps": warps})
    assert kernel.asm.get("cubin"), fn.__name__
print("compiled")
"""


@needs_triton
def test_kernels_compile_for_h100_without_a_gpu():
    """The interpreter skips Triton's compiler, so compile every kernel for sm_90 (ptxas ships with triton).

    A fresh process: this one imported triton in interpreter mode.
    """
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FREESPEC_FORCE_TRITON")}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when unset
    proc = subprocess.run([sys.executable, "-c", COMPILE_FOR_H100, str(REPO / "kernels")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
