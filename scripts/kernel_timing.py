"""Time freespec's Triton kernels (kernels/topk.py, kernels/tree.py) against their torch references on a GPU.

Run from anywhere; it needs only torch and triton (freespec need not be installed: this checkout's kernels
are loaded, under a bare `freespec` package over its folders):

    python scripts/kernel_timing.py --out kernel_timing.json
    python scripts/kernel_timing.py --graph --out kernel_timing_graph.json   # device time alone
    python scripts/kernel_timing.py --smoke          # CPU, Triton interpreter, tiny shapes: checks the script

What it does, in order:
1. Parity on the device: Triton vs reference for row top-k (fp32 without ties: same ids; bf16 with ties,
   a -inf row: same values, distinct ids), topk_scatter with duplicate and -1 keys, and the tree
   expansion with unknown entries. Any mismatch aborts before timing (exit status 1).
2. Row top-k, k=8, vocab 49152 and 151936, rows 1..256, bf16 and fp32 logits: torch reference vs the
   Triton kernel (each stage-1 block size of --block-v), and topk_scatter (reference vs fused kernel).
   Times come from CUDA events around --reps calls after --warmup calls (with --graph: around one replay
   of a CUDA graph holding the --reps calls, so the host's launch time is left out); each call reads a
   different logits buffer (the buffers together are twice the L2 size), so the bandwidth is HBM's, not L2's.
   Achieved bandwidth = logits bytes read / time, next to the card's peak.
3. Tree expansion with the default widths (4,2,2,1,1,1,1,1) over a 151936 x 8 matrix, B = 1, 32, 256.

Prints markdown tables; --out also writes everything as JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WIDTHS = (4, 2, 2, 1, 1, 1, 1, 1)
PEAK_TBPS = (("H200", None, 4.8), ("H100", "PCIE", 2.0), ("H100", "SXM", 3.35), ("H100", "HBM3", 3.35))


def load_kernels():
    """freespec.kernels.topk and .tree from this checkout, whether or not freespec is installed: a bare
    ``freespec`` package over this checkout's folders stands in for the installed one (whose ``__init__``
    reads the distribution's metadata), so the kernel modules' own ``freespec.*`` imports resolve here."""
    package = types.ModuleType("freespec")
    package.__path__ = [str(REPO / "freespec"), str(REPO)]  # freespec.settings; freespec.kernels -> kernels/
    sys.modules["freespec"] = package
    from freespec.kernels import topk, tree

    return topk, tree


def peak_tbps(device_name: str):
    """Peak HBM bandwidth in TB/s for the cards we know (H100 SXM reports itself as 'H100 80GB HBM3')."""
    name = device_name.upper()
    for model, variant, tbps in PEAK_TBPS:
        if model in name and (variant is None or variant in name):
            return tbps
    return None


def timer(torch, device, warmup: int, reps: int, graph: bool = False):
    def timed(fn, inputs) -> float:
        """Mean microseconds per call of fn(x), x cycling through inputs (a different buffer each call)."""
        if device.type == "cuda" and graph:
            return graph_us(torch, fn, inputs, warmup, reps)
        for i in range(warmup):
            fn(inputs[i % len(inputs)])
        if device.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(reps):
                fn(inputs[(warmup + i) % len(inputs)])
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3 / reps
        t0 = time.perf_counter()
        for i in range(reps):
            fn(inputs[(warmup + i) % len(inputs)])
        return (time.perf_counter() - t0) * 1e6 / reps

    return timed


def graph_us(torch, fn, inputs, warmup: int, reps: int) -> float:
    """Mean microseconds per call on the device alone: ``reps`` calls captured into one CUDA graph and
    replayed, so the host's launch time is not counted. NaN where the call cannot be captured (it waits
    for the host)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup):
            fn(inputs[i % len(inputs)])
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            for i in range(reps):
                fn(inputs[i % len(inputs)])
    except Exception:  # noqa: BLE001 - a host sync inside fn: not capturable
        torch.cuda.synchronize()
        return float("nan")
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def bind(fn, *rest, **kwargs):
    """fn with every argument but the first fixed now (a lambda in a loop would see later values)."""
    return lambda x: fn(x, *rest, **kwargs)


# ---------------------------------------------------------------------------------------------- parity
def check_topk(torch, topk, x, k, ids, probs, exact: bool) -> list[str]:
    ref_ids, ref_probs = topk.row_topk_reference(x, k)
    x32 = x.float()
    problems = []
    if not bool(((ids >= 0) & (ids < x.shape[1])).all()):
        problems.append("ids out of range")
    elif not torch.equal(x32.gather(1, ids.long()), x32.gather(1, ref_ids.long())):
        problems.append("top-k values differ")
    if bool((ids.sort(dim=1).values.diff(dim=1) == 0).any()):
        problems.append("ids repeat within a row")
    if exact and not torch.equal(ids, ref_ids):
        problems.append("ids differ (no ties in this input)")
    if not torch.allclose(probs, ref_probs, rtol=1e-5, atol=1e-8):
        problems.append(f"probs differ by up to {float((probs - ref_probs).abs().max()):.3g}")
    return problems


def parity(torch, topk, tree, device, vocabs) -> list[str]:
    failures = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    no_ties = [0, 1, 2, 3, 4, 7]  # rows 5 (all -inf) and 6 (half tied) may legitimately differ in ids
    for v in vocabs:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(8, v, generator=gen) * 4
            x[5] = float("-inf")
            x[6, : v // 2] = 1.0
            x = x.to(dtype).to(device)
            x32 = x.float()
            for k in (1, 8, 32):
                ids, probs = topk.row_topk_triton(x, k)
                for msg in check_topk(torch, topk, x, k, ids, probs, exact=False):
                    failures.append(f"row_topk V={v} {dtype} k={k}: {msg}")
                ref_ids = topk.row_topk_reference(x, k)[0]
                if dtype == torch.float32 and not torch.equal(ids[no_ties], ref_ids[no_ties]):
                    failures.append(f"row_topk V={v} fp32 k={k}: ids differ on rows without ties")
            # Winning rows: key 3 <- row 7, key 7 <- row 5, key 2 <- row 6; -1 and v + 5 write nothing.
            keys = torch.tensor([3, -1, 3, 7, v + 5, 7, 2, 3], device=device)
            mats = []
            for fn in (topk.topk_scatter_reference, topk.topk_scatter_triton):
                m_ids = torch.full((v, 8), -1, dtype=torch.int32, device=device)
                m_probs = torch.zeros((v, 8), dtype=torch.float16, device=device)
                fn(x, keys, m_ids, m_probs, 8)
                mats.append((m_ids, m_probs))
            (ri, rp), (ti, tp) = mats
            untouched = torch.ones(v, dtype=torch.bool, device=device)
            untouched[[3, 7, 2]] = False
            if not ((ti[untouched] == -1).all() and (tp[untouched] == 0).all()):
                failures.append(f"topk_scatter V={v} {dtype}: wrote rows it should not")
            for key, row in ((3, 7), (7, 5), (2, 6)):
                if not torch.equal(x32[row, ti[key].long()], x32[row, ri[key].long()]):
                    failures.append(f"topk_scatter V={v} {dtype}: matrix row {key} is not row {row}'s top-k")
            if not torch.allclose(rp.float(), tp.float(), rtol=1e-3, atol=1e-6):
                failures.append(f"topk_scatter V={v} {dtype}: matrix probabilities differ")
    parents, ranks, _ = tree.tree_template(DEFAULT_WIDTHS)
    v = vocabs[-1]
    m_ids = torch.randint(0, v, (v, 8), generator=gen, dtype=torch.int32)
    m_ids[torch.rand(v, 8, generator=gen) < 0.2] = -1
    m_probs = torch.rand(v, 8, generator=gen).half()
    roots = torch.cat([torch.tensor([-1, 0]), torch.randint(0, v, (30,), generator=gen)])
    want = tree.expand_tree_reference(m_ids.numpy(), m_probs.numpy(), roots.numpy(), parents, ranks)
    got = tree.expand_tree_triton(m_ids.to(device), m_probs.to(device), roots.to(device), parents, ranks)
    if not all(torch.equal(g.cpu(), torch.from_numpy(w)) for g, w in zip(got, want)):
        failures.append("expand_tree: Triton differs from the numpy reference")
    return failures


# ---------------------------------------------------------------------------------------------- timing
def buffers(torch, device, shape, dtype, l2_bytes: int, gen):
    """Enough copies of random logits that cycling through them keeps L2 cold (at least 2 x L2)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    n = max(1, math.ceil(2 * l2_bytes / max(nbytes, 1)))
    data = torch.empty((n, *shape), dtype=dtype, device=device)
    for i in range(n):  # one copy at a time: no transient float32 tensor of the whole pile
        data[i] = (torch.randn(shape, generator=gen, device=device) * 4).to(dtype)
    return data, nbytes


def time_topk(torch, topk, device, timed, args, l2_bytes):
    gen = torch.Generator(device=device).manual_seed(1)
    rows_out = []
    block_sizes = sorted(set(args.block_v) | {topk.DEFAULT_BLOCK_V})
    k = args.k
    for v in args.vocabs:
        m_ids = torch.full((v, k), -1, dtype=torch.int32, device=device)
        m_probs = torch.zeros((v, k), dtype=torch.float16, device=device)
        for dtype in (torch.bfloat16, torch.float32):
            for r in args.rows:
                data, nbytes = buffers(torch, device, (r, v), dtype, l2_bytes, gen)
                keys = torch.randperm(v, device=device)[:r]
                ref_us = timed(bind(topk.row_topk_reference, k), data)
                per_block = {b: timed(bind(topk.row_topk_triton, k, block_v=b), data) for b in block_sizes}
                scatter_ref_us = timed(bind(topk.topk_scatter_reference, keys, m_ids, m_probs, k), data)
                scatter_us = timed(bind(topk.topk_scatter_triton, keys, m_ids, m_probs, k), data)
                tri_us = per_block[topk.DEFAULT_BLOCK_V]
                best = min(per_block, key=per_block.get)
                name = str(dtype).replace("torch.", "")
                rows_out.append({
                    "vocab": v, "dtype": name, "rows": r, "k": k, "logits_bytes": nbytes,
                    "buffers": len(data),
                    "torch_us": ref_us, "triton_us": tri_us, "speedup": ref_us / tri_us,
                    "triton_tbps": nbytes / (tri_us * 1e-6) / 1e12,
                    "triton_us_by_block_v": per_block, "best_block_v": best, "best_us": per_block[best],
                    "best_tbps": nbytes / (per_block[best] * 1e-6) / 1e12,
                    "scatter_torch_us": scatter_ref_us, "scatter_triton_us": scatter_us,
                })
                print(f"  V={v} {name} R={r}: torch {ref_us:.1f} us, triton {tri_us:.1f} us", flush=True)
                del data
    return rows_out


def time_tree(torch, tree, device, timed, args):
    gen = torch.Generator(device="cpu").manual_seed(2)
    v = args.tree_vocab
    parents, ranks, _ = tree.tree_template(DEFAULT_WIDTHS)
    m_ids = torch.randint(0, v, (v, 8), generator=gen, dtype=torch.int32)
    m_ids[torch.rand(v, 8, generator=gen) < 0.1] = -1
    m_ids = m_ids.to(device)
    m_probs = torch.rand(v, 8, generator=gen).half().to(device)
    out = []
    for b in args.tree_batches:
        roots = [torch.randint(0, v, (b,), generator=gen).to(device) for _ in range(8)]
        ref_us = timed(lambda x: tree.expand_tree_reference(m_ids, m_probs, x, parents, ranks), roots)
        tri_us = timed(lambda x: tree.expand_tree_triton(m_ids, m_probs, x, parents, ranks), roots)
        out.append({"batch": b, "nodes": len(parents), "matrix": [v, 8], "torch_us": ref_us,
                    "triton_us": tri_us, "speedup": ref_us / tri_us})
        print(f"  tree B={b}: torch {ref_us:.1f} us, triton {tri_us:.1f} us", flush=True)
    return out


def markdown(result) -> str:
    peak = result["peak_tbps"]
    lines = [
        (f"Device: {result['device']}; peak HBM bandwidth: {f'{peak} TB/s' if peak else 'unknown'}; "
         f"torch {result['torch']}, triton {result['triton']}; k={result['k']}; default block_v "
         f"{result['default_block_v']}; times are mean microseconds per call ({result['timing']})."),
        "",
        ("| vocab | dtype | rows | torch us | triton us | speedup | triton TB/s | % of peak | best block_v "
         "| best us | scatter torch us | scatter triton us |"),
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["topk"]:
        pct = f"{100 * r['triton_tbps'] / peak:.0f}%" if peak else "unknown"
        lines.append(
            f"| {r['vocab']} | {r['dtype']} | {r['rows']} | {r['torch_us']:.1f} | {r['triton_us']:.1f} | "
            f"{r['speedup']:.2f}x | {r['triton_tbps']:.3f} | {pct} | {r['best_block_v']} | "
            f"{r['best_us']:.1f} | "
            f"{r['scatter_torch_us']:.1f} | {r['scatter_triton_us']:.1f} |"
        )
    lines += ["", f"Tree expansion, widths {list(DEFAULT_WIDTHS)}:", "",
              "| batch | nodes | matrix | torch us | triton us | speedup |", "|---:|---:|---|---:|---:|---:|"]
    for r in result["tree"]:
        lines.append(f"| {r['batch']} | {r['nodes']} | {r['matrix'][0]}x{r['matrix'][1]} | "
                     f"{r['torch_us']:.1f} | "
                     f"{r['triton_us']:.1f} | {r['speedup']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--block-v", type=int, nargs="+", default=[2048, 4096, 8192],
                        help="stage-1 block sizes to time (the module default is always included)")
    parser.add_argument("--tree-batches", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--tree-vocab", type=int, default=151936)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--graph", action="store_true",
                        help="time on the device alone: each case's calls replayed from one CUDA graph, "
                             "so the host's launch time is left out")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU + Triton interpreter with tiny shapes: exercises this script without a GPU")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9's default, set to silence its warning
    if args.smoke:
        # Must precede triton's first import (the kernel modules import it lazily, on first use).
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["FREESPEC_FORCE_TRITON"] = "1"
        args.vocabs, args.rows, args.block_v = [1000 + 7], [1, 3], [256]
        args.tree_batches, args.tree_vocab, args.warmup, args.reps = [1, 4], 1000, 1, 2

    import torch

    topk, tree = load_kernels()
    if not topk._have_triton():
        print("triton is not importable", file=sys.stderr)
        return 2
    if args.smoke:
        device, l2_bytes = torch.device("cpu"), 0
        name = f"CPU ({platform.processor() or platform.machine()}), Triton interpreter"
    elif torch.cuda.is_available():
        device = torch.device("cuda")
        props = torch.cuda.get_device_properties(device)
        name, l2_bytes = props.name, getattr(props, "L2_cache_size", 0) or 64 << 20
    else:
        print("no CUDA device (use --smoke to check the script on a CPU)", file=sys.stderr)
        return 2
    import triton

    result = {"device": name, "peak_tbps": peak_tbps(name), "torch": torch.__version__,
              "triton": triton.__version__,
              "k": args.k, "default_block_v": topk.DEFAULT_BLOCK_V, "warmup": args.warmup, "reps": args.reps,
              "timing": ("interpreter: not a speed" if device.type != "cuda" else
                         "CUDA graph replay, device time alone, L2 cold" if args.graph else
                         "CUDA events, L2 cold, the host's launch time included")}
    print(f"{name}: checking parity ...", flush=True)
    failures = parity(torch, topk, tree, device, args.vocabs)
    result["parity"] = failures or "ok"
    if failures:
        print("PARITY FAILURES:\n  " + "\n  ".join(failures), file=sys.stderr)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2))
        return 1
    timed = timer(torch, device, args.warmup, args.reps, args.graph)
    print("timing row top-k ...", flush=True)
    result["topk"] = time_topk(torch, topk, device, timed, args, l2_bytes)
    print("timing tree expansion ...", flush=True)
    result["tree"] = time_tree(torch, tree, device, timed, args)
    table = markdown(result)
    result["markdown"] = table
    print()
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
