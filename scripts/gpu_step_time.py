"""Time a target model's forward pass on a GPU, as a speculative step verifies drafts: 1 + K query tokens.

What a freespec proposer's per-step time must be compared with on a GPU. Without vLLM (its CUDA wheel needs a
torch the machine may not have), this builds each fixture model's decoder from its shape alone (random bfloat16
weights: the time of a forward pass does not depend on the values) in plain torch, as vLLM runs it at batch 1:
RMSNorm, rotary attention over a static KV cache (one masked SDPA per KV head, its query heads folded into the
rows), SwiGLU MLP, and the logits of every query row (vLLM computes 1 + K rows of logits to verify K drafts).
The step is captured in a CUDA graph, as vLLM's decode steps are, and timed with CUDA events around --reps
replays; the eager time (host launches included, --eager-reps calls) and the number of kernels one step
launches are printed beside it. vLLM fuses more (its kernels for norms, rotary embedding, attention over paged
blocks, torch.compile's fusions), so its forward pass is likely faster than this one, while its scheduler,
sampler and output processing, not in this time, make a served step longer. Neither is measured here.

    python3 scripts/gpu_step_time.py --out gpu_step_time.json   # on a CUDA machine: torch only
    python3 scripts/gpu_step_time.py --smoke                    # CPU, tiny shapes: checks the script

Shapes (``MODELS``): SmolLM2-135M-Instruct from the fixture's config.json; the Qwen2.5-Coder pair from their
GGUF headers (the fixture wheels' metadata: block count, embedding and feed-forward lengths, head counts).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    qkv_bias: bool


MODELS = (
    Shape("smollm2-135m-instruct", 30, 576, 9, 3, 1536, 49152, False),
    Shape("qwen2.5-coder-0.5b-instruct", 24, 896, 14, 2, 4864, 151936, True),
    Shape("qwen2.5-coder-1.5b-instruct", 28, 1536, 12, 2, 8960, 151936, True),
)
SMOKE = Shape("smoke", 2, 64, 4, 2, 128, 1000, True)


class Decoder:
    """A Llama/Qwen2 decoder with random weights and a static KV cache of ``max_len`` positions."""

    def __init__(self, s: Shape, max_len: int, device: str, dtype: torch.dtype) -> None:
        self.s, self.d = s, s.hidden // s.heads
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=g, device=device) * 0.02).to(dtype)

        qkv = (s.heads + 2 * s.kv_heads) * self.d
        self.embed = w(s.vocab, s.hidden)  # tied with the output head, as in all three models
        self.layers = [dict(
            n1=torch.ones(s.hidden, device=device, dtype=dtype), n2=torch.ones(s.hidden, device=device, dtype=dtype),
            qkv=w(qkv, s.hidden), qkv_b=w(qkv) if s.qkv_bias else None, o=w(s.hidden, s.heads * self.d),
            gate_up=w(2 * s.ffn, s.hidden), down=w(s.hidden, s.ffn),
            k=torch.zeros(1, s.kv_heads, max_len, self.d, device=device, dtype=dtype),
            v=torch.zeros(1, s.kv_heads, max_len, self.d, device=device, dtype=dtype),
        ) for _ in range(s.layers)]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        inv = 1.0 / (1e6 ** (torch.arange(0, self.d, 2, device=device, dtype=torch.float32) / self.d))
        ang = torch.arange(max_len, device=device, dtype=torch.float32)[:, None] * inv[None]
        self.cos, self.sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([ang.sin()] * 2, -1).to(dtype)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits of every query row; writes the rows' keys and values at ``pos``; ``mask`` [group * q, max_len]
        (``query_mask``'s rows, once per query head of a KV head)."""
        s, d, q = self.s, self.d, ids.shape[0]
        group = s.heads // s.kv_heads
        x = self.embed[ids]
        for layer in self.layers:
            h = F.rms_norm(x, (s.hidden,), layer["n1"], 1e-6)
            qkv = F.linear(h, layer["qkv"], layer["qkv_b"])
            xq, xk, xv = qkv.split([s.heads * d, s.kv_heads * d, s.kv_heads * d], -1)
            xq = self.rope(xq.view(q, s.heads, d).transpose(0, 1)[None], pos)
            xk = self.rope(xk.view(q, s.kv_heads, d).transpose(0, 1)[None], pos)
            layer["k"].index_copy_(2, pos, xk)
            layer["v"].index_copy_(2, pos, xv.view(q, s.kv_heads, d).transpose(0, 1)[None])
            # grouped heads folded into the query rows (as GQA decode kernels do): one masked SDPA per KV head
            a = F.scaled_dot_product_attention(xq.reshape(1, s.kv_heads, group * q, d), layer["k"], layer["v"],
                                               attn_mask=mask[None, None])
            a = a.view(s.kv_heads * group, q, d).transpose(0, 1).reshape(q, s.heads * d)
            x = x + F.linear(a, layer["o"])
            h = F.rms_norm(x, (s.hidden,), layer["n2"], 1e-6)
            gate, up = F.linear(h, layer["gate_up"]).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        return F.linear(F.rms_norm(x, (s.hidden,), self.norm, 1e-6), self.embed)


def query_mask(model: Decoder, context: int, query: int) -> torch.Tensor:
    """[group * query, max_len]: each query row sees the context and the query rows up to itself."""
    device = model.embed.device
    mask = torch.zeros(query, model.layers[0]["k"].shape[2], dtype=torch.bool, device=device)
    mask[:, :context] = True
    mask[:, context:context + query] = torch.ones(query, query, dtype=torch.bool, device=device).tril()
    return mask.repeat(model.s.heads // model.s.kv_heads, 1)


def count_kernels(model: Decoder, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> int:
    """GPU kernels one eager step launches (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.forward(ids, pos, mask).argmax(-1)
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def time_step(model: Decoder, context: int, query: int, reps: int, eager_reps: int, graph: bool) -> dict:
    device = model.embed.device
    ids = torch.randint(0, model.s.vocab, (query,), device=device)
    pos = torch.arange(context, context + query, device=device)
    mask = query_mask(model, context, query)
    out = {"context": context, "query": query}
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(eager_reps):
            model.forward(ids, pos, mask).argmax(-1)
        out["eager_ms"] = (time.perf_counter() - t0) / eager_reps * 1e3
        return out
    for _ in range(3):
        model.forward(ids, pos, mask).argmax(-1)
    torch.cuda.synchronize()
    out["kernels"] = count_kernels(model, ids, pos, mask)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(eager_reps):
        model.forward(ids, pos, mask).argmax(-1)
    end.record()
    torch.cuda.synchronize()
    out["eager_ms"] = start.elapsed_time(end) / eager_reps
    if graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as graph capture requires
            for _ in range(2):
                model.forward(ids, pos, mask).argmax(-1)
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model.forward(ids, pos, mask).argmax(-1)
        g.replay()
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        out["graph_ms"] = start.elapsed_time(end) / reps
        del g
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, nargs="+", default=[1, 2, 3, 5, 9, 17],
                   help="query tokens per step: 1 + the draft length (default 1 2 3 5 9 17)")
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 2048], help="tokens already in the cache")
    p.add_argument("--reps", type=int, default=200, help="timed graph replays per cell (default 200)")
    p.add_argument("--eager-reps", type=int, default=30, help="timed eager steps per cell (default 30)")
    p.add_argument("--no-graph", action="store_true", help="eager only")
    p.add_argument("--smoke", action="store_true", help="CPU, one tiny model, a few steps: checks the script")
    p.add_argument("--out", default=None, help="also write the results as JSON")
    args = p.parse_args()
    if args.smoke:
        device, dtype, models, args.eager_reps, args.contexts, args.queries = "cpu", torch.float32, (SMOKE,), 2, [16], [1, 3]
    elif not torch.cuda.is_available():
        print("no CUDA device (use --smoke to check the script on a CPU)", file=sys.stderr)
        return 2
    else:
        device, dtype, models = "cuda", torch.bfloat16, MODELS
    info = {"torch": torch.__version__, "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": str(dtype)}
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    rows = []
    print("| model | context | query | graph ms | eager ms | kernels |\n|---|---:|---:|---:|---:|---:|")
    for shape in models:
        cache = -(-(max(args.contexts) + max(args.queries)) // 16) * 16  # aligned rows for the fused SDPA kernels
        model = Decoder(shape, cache, device, dtype)
        for context in args.contexts:
            for query in args.queries:
                r = {"model": shape.name,
                     **time_step(model, context, query, args.reps, args.eager_reps, not args.no_graph)}
                rows.append(r)
                graph = f"{r['graph_ms']:.3f}" if "graph_ms" in r else "-"
                print(f"| {shape.name} | {context} | {query} | {graph} | {r['eager_ms']:.3f} | {r.get('kernels', '-')} |",
                      flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"info": info, "shapes": [asdict(s) for s in models], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
