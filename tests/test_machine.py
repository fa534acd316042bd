"""Defaults chosen for the machine: the serving dtype."""
from __future__ import annotations

from freespec.machine import cpu_flags, default_dtype


def test_bfloat16_only_where_the_cpu_has_it_natively():
    assert default_dtype({"avx2", "amx_bf16"}, cpu=True) == "bfloat16"
    assert default_dtype({"avx512f", "avx512_bf16"}, cpu=True) == "bfloat16"
    assert default_dtype({"avx2", "avx512f"}, cpu=True) == "float32"
    assert default_dtype(set(), cpu=False) == "auto"  # a GPU build: vLLM chooses


def test_cpu_flags_reads_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()
