"""Defaults chosen for the machine (the serving dtype) and how a run describes the machine."""
from __future__ import annotations

import re

from freespec.machine import (FEW_CORES, core_binding_advice, core_list, cpu_advice, cpu_flags, cpu_info, default_dtype,
                              describe_machine, intel_openmp_advice, machine_summary, ngram_advice)


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


ZEN3 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: other\n")


def test_describe_machine_names_the_cpu_its_bfloat16_and_the_core_binding(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(ZEN3)
    assert cpu_info(info)["model name"] == "AMD EPYC"  # the first CPU's block only
    machine = describe_machine(info, environ={"VLLM_CPU_OMP_THREADS_BIND": "0-1", "PATH": "/bin"}, cpu_build=True)
    assert (machine["cpu"], machine["cpu_family"], machine["cpu_model"]) == ("AMD EPYC", "25", "1")
    assert machine["native_bf16"] == [] and machine["avx512"] is False and machine["cores"] >= 1
    assert machine["binding_env"] == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}  # only the binding's own variables
    assert machine["runtime_env"] == {}
    assert machine_summary(machine) == (f"AMD EPYC (family 25, model 1), {machine['cores']} cores, no AVX512: "
                                        "bfloat16 emulated, VLLM_CPU_OMP_THREADS_BIND=0-1")
    preloaded = describe_machine(info, cpu_build=True, environ={
        "LD_PRELOAD": "/venv/lib/libiomp5.so:/usr/lib/libtcmalloc.so", "NUMBA_THREADING_LAYER": "workqueue"})
    assert machine_summary(preloaded).endswith(
        "vLLM's default core binding, LD_PRELOAD=libiomp5.so:libtcmalloc.so, NUMBA_THREADING_LAYER=workqueue")
    info.write_text(ZEN3.replace("fpu avx2", "avx2 avx512f avx512_bf16"))
    machine = describe_machine(info, environ={}, cpu_build=True)
    assert machine["native_bf16"] == ["avx512_bf16"]
    assert machine_summary(machine).endswith("native bfloat16 (avx512_bf16), vLLM's default core binding")
    gpu = describe_machine(info, environ={}, cpu_build=False)
    assert machine_summary(gpu) == f"AMD EPYC (family 25, model 1), {gpu['cores']} cores, hosting a GPU build of vLLM"
    assert describe_machine(tmp_path / "missing", environ={})["cpu"] is None
    assert machine_summary({"cores": 2}).startswith("unknown CPU, 2 cores, no AVX512")


def test_core_list_writes_ranges_as_vllm_reads_them():
    assert core_list([1, 0]) == "0-1"
    assert core_list([5, 0, 1, 2, 2]) == "0-2,5"
    assert core_list([3]) == "3" and core_list([0, 2, 4, 5, 6]) == "0,2,4-6"


def test_core_binding_advice_only_where_the_reserved_core_is_a_large_share():
    cpu2 = {"vllm_cpu_build": True, "cores": 2, "binding_env": {}}
    advice = core_binding_advice(cpu2, core_ids=[0, 1])
    assert "VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0" in advice
    assert advice.startswith("vLLM keeps 1 of these 2 cores") and "all 2 (" in advice and "docs/vllm-cpu.md" in advice
    assert "=2-5 " in core_binding_advice({**cpu2, "cores": 4}, core_ids=[2, 3, 4, 5])  # the cores it may use
    assert core_binding_advice({**cpu2, "binding_env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}}) is None  # chosen
    assert core_binding_advice({**cpu2, "vllm_cpu_build": False}) is None  # a GPU build: no CPU worker
    assert core_binding_advice({**cpu2, "cores": FEW_CORES + 1}) is None  # one core is a small share
    assert core_binding_advice({**cpu2, "cores": 1}) is None  # nothing to give


def test_ngram_advice_only_where_the_model_is_given_its_cores_and_numba_left_to_choose():
    bound = {"vllm_cpu_build": True, "cores": 2, "binding_env": {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}}
    assert "NUMBA_THREADING_LAYER=workqueue" in ngram_advice(bound)
    assert ngram_advice({**bound, "runtime_env": {"NUMBA_THREADING_LAYER": "tbb"}}) is None  # chosen
    assert ngram_advice({**bound, "binding_env": {}}) is None  # vLLM's default binding: not seen there
    assert ngram_advice({**bound, "vllm_cpu_build": False}) is None
    # Unbound, the binding's own note names the variable for ngram.
    assert "NUMBA_THREADING_LAYER=workqueue" in core_binding_advice({**bound, "binding_env": {}}, core_ids=[0, 1])


def test_intel_openmp_advice_where_it_is_installed_and_not_preloaded():
    cpu = {"vllm_cpu_build": True, "cores": 2, "binding_env": {}}
    advice = intel_openmp_advice(cpu, path="/venv/lib/libiomp5.so")
    assert "LD_PRELOAD=/venv/lib/libiomp5.so " in advice and "docs/vllm-cpu.md" in advice
    preloaded = {**cpu, "runtime_env": {"LD_PRELOAD": "/venv/lib/libiomp5.so"}}
    assert intel_openmp_advice(preloaded, path="/venv/lib/libiomp5.so") is None
    assert intel_openmp_advice({**cpu, "vllm_cpu_build": False}, path="/venv/lib/libiomp5.so") is None
    assert intel_openmp_advice(cpu, path="") is None  # not installed


def test_cpu_advice_gathers_the_notes_that_apply(monkeypatch):
    from freespec import machine

    monkeypatch.setattr(machine, "intel_openmp_path", lambda: None)
    bound = {"vllm_cpu_build": True, "cores": 2, "binding_env": {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}}
    assert cpu_advice(bound) == [ngram_advice(bound)]
    assert cpu_advice(bound, ngram=False) == []  # a bench without ngram
    monkeypatch.setattr(machine, "intel_openmp_path", lambda: "/venv/lib/libiomp5.so")
    assert [a.split(";")[0] for a in cpu_advice(bound, ngram=False)] == [
        "vLLM's CPU worker runs on GNU OpenMP unless Intel's is preloaded, as vLLM's CPU docs do"]


def test_no_advice_cites_the_one_machine_it_was_measured_on():
    """The notes say what holds on any machine they apply to; figures of one machine stay in the docs."""
    unbound = {"vllm_cpu_build": True, "cores": 2, "binding_env": {}}
    bound = {**unbound, "binding_env": {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}}
    notes = [core_binding_advice(unbound, core_ids=[0, 1]), ngram_advice(bound),
             intel_openmp_advice(bound, path="/venv/lib/libiomp5.so")]
    for note in notes:
        assert note and not re.search(r"\d-core machine|machine measured|two bound cores|Zen ?\d", note), note
