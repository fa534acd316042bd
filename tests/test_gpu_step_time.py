"""scripts/gpu_step_time.py on the CPU: the stand-in step computes a real decoder step over its KV cache.

The GPU timings are only worth what the timed step computes: these check that a step of ``q`` query tokens
after ``n`` cached ones gives the logits of a plain causal forward over all ``n + q`` tokens (grouped heads,
rotary positions, the cache write), and that ``--smoke`` runs end to end.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_step_time.py"
spec = importlib.util.spec_from_file_location("gpu_step_time", SCRIPT)
gst = importlib.util.module_from_spec(spec)
sys.modules["gpu_step_time"] = gst  # its dataclass looks its module up there
spec.loader.exec_module(gst)


def plain_forward(m, ids: torch.Tensor) -> torch.Tensor:
    """The same weights as one causal forward without a cache, KV heads repeated for each query head."""
    s, d, q = m.s, m.d, ids.shape[0]
    group, pos, x = s.heads // s.kv_heads, torch.arange(q), m.embed[ids]
    for layer in m.layers:
        h = F.rms_norm(x, (s.hidden,), layer["n1"], 1e-6)
        xq, xk, xv = F.linear(h, layer["qkv"], layer["qkv_b"]).split([s.heads * d, s.kv_heads * d, s.kv_heads * d], -1)
        xq = m.rope(xq.view(q, s.heads, d).transpose(0, 1)[None], pos)
        xk = m.rope(xk.view(q, s.kv_heads, d).transpose(0, 1)[None], pos)
        xv = xv.view(q, s.kv_heads, d).transpose(0, 1)[None]
        a = F.scaled_dot_product_attention(xq, xk.repeat_interleave(group, 1), xv.repeat_interleave(group, 1),
                                           is_causal=True)
        x = x + F.linear(a[0].transpose(0, 1).reshape(q, -1), layer["o"])
        gate, up = F.linear(F.rms_norm(x, (s.hidden,), layer["n2"], 1e-6), layer["gate_up"]).chunk(2, -1)
        x = x + F.linear(F.silu(gate) * up, layer["down"])
    return F.linear(F.rms_norm(x, (s.hidden,), m.norm, 1e-6), m.embed)


def test_cached_steps_give_the_logits_of_a_plain_causal_forward():
    m = gst.Decoder(gst.SMOKE, 32, "cpu", torch.float32)
    ids = torch.randint(0, gst.SMOKE.vocab, (11,), generator=torch.Generator().manual_seed(1))
    first = m.forward(ids[:6], torch.arange(6), gst.query_mask(m, 0, 6))
    second = m.forward(ids[6:], torch.arange(6, 11), gst.query_mask(m, 6, 5))  # a verification step of 5 tokens
    want = plain_forward(m, ids)
    assert torch.allclose(torch.cat([first, second]), want, atol=1e-5)
    # a step that ignored the cache would differ from it
    alone = gst.Decoder(gst.SMOKE, 32, "cpu", torch.float32).forward(ids[6:], torch.arange(6, 11),
                                                                     gst.query_mask(m, 6, 5))
    assert not torch.allclose(alone, want[6:], atol=1e-3)


def test_smoke_run_prints_the_table():
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| smoke |")]
    assert len(rows) == 2 and all(float(r.split("|")[5]) > 0 for r in rows)
