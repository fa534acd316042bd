"""The Model Runner V2 speculators on a GPU, without vLLM's compiled parts: propose on device tensors, step by
step, against the CPU reference.

    python scripts/device_v2_check.py --device cuda --out v2.json        # a GPU; vLLM's source found as below
    TRITON_INTERPRET=1 python scripts/device_v2_check.py --device cpu    # any machine: proves the script
    python scripts/device_v2_check.py --pack                             # build/vllm034-src.tar.gz + wheels

1. ``suffix``: vLLM 0.34's ``SuffixSpeculator`` (``v1/worker/gpu/spec_decode/suffix/speculator.py``: its
   Triton kernels, the corpus of finished responses, adaptive verification) in a scripted greedy run over
   recorded turns (tests/data/issue69_agent_turns.jsonl) on ``--device``; the reference is the same run on
   CPU tensors under Triton's interpreter (a child process with TRITON_INTERPRET=1). Drafts, valid counts
   and confidences must match at every step.
2. ``freespec_<plugin>``: freespec's V2 speculators (``vllm_plugins/v2/speculator.py``: copy, hybrid over
   copy; ``freespec_hybrid_gpu``: hybrid's defaults, built on the suffix speculator by ``v2/suffix_hybrid.py``)
   in the same run with the request state on ``--device``, against the same speculator on CPU tensors (which
   tests_vllm034 holds to the V1 proposer). Needs pydantic (``--pack`` downloads its wheels).

No vLLM is imported: a bare ``vllm`` package over the source folder (``--vllm-src``: a folder holding
``vllm/``; else build/vllm034-src.tar.gz; else the installed vllm's folder, found without importing it)
loads the suffix speculator's file alone, with light stand-ins for the heavy modules it names (config,
logger, triton_utils, torch_utils, input_batch, ``BaseSpeculator``). freespec is this checkout's, under a
bare ``freespec`` package (as scripts/kernel_timing.py does). Exit status 1 on any mismatch or failure.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
PACK = REPO / "build" / "vllm034-src.tar.gz"  # build/ is ignored: carried, never committed
WHEELS = REPO / "build" / "device-wheels"
SUFFIX_DIR = "vllm/v1/worker/gpu/spec_decode/suffix"
# What the tarball holds: the suffix speculator, and the files its stand-ins replace (for the record).
PACKED = (f"{SUFFIX_DIR}/__init__.py", f"{SUFFIX_DIR}/speculator.py", f"{SUFFIX_DIR}/config.py",
          "vllm/v1/worker/gpu/spec_decode/speculator.py", "vllm/v1/worker/gpu/spec_decode/speculator_config.py",
          "vllm/version.py", "vllm/_version.py")
K = 6
MAX_REQS = 4
# Nothing timed decides a draft, so two runs draft alike: the goodput cut (priced from measured step times), the
# step-aside (plugin time against plain decoding) and the circuit breaker's step budget (slow steps) are off.
DETERMINISTIC = {"policy": "fixed", "step_aside": False, "step_budget_ms": 60_000.0}
# freespec_hybrid_gpu: hybrid with its default sources, which freespec_hybrid builds on vLLM's suffix speculator
# (v2/suffix_hybrid.py: Triton kernels, a corpus per scope); freespec_hybrid with sources [copy] drafts on the host.
SPECULATOR_CONFIGS = {"freespec_copy": DETERMINISTIC,
                    "freespec_hybrid": {"sources": ["copy"], "scope": "global", **DETERMINISTIC},
                    "freespec_hybrid_gpu": {"scope": "global"}}
TRITON_CONFIGS = ("suffix", "freespec_hybrid_gpu")  # their CPU reference runs Triton's interpreter


def installed_vllm_src() -> Path | None:
    """The folder holding the installed ``vllm`` package, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def vllm_src(given: str | None) -> Path:
    if given:
        return Path(given)
    if PACK.exists():
        out = Path(tempfile.mkdtemp(prefix="vllm-src-"))
        with tarfile.open(PACK) as tar:
            tar.extractall(out, filter="data")
        return out
    found = installed_vllm_src()
    if found is None:
        sys.exit("device_v2_check: no vLLM source: give --vllm-src, carry build/vllm034-src.tar.gz (--pack) or "
                 "install vllm")
    return found


def pack(src: Path) -> int:
    """build/vllm034-src.tar.gz (the files PACKED names) and build/device-wheels (pydantic for freespec, cp312)."""
    PACK.parent.mkdir(exist_ok=True)
    with tarfile.open(PACK, "w:gz") as tar:
        for name in PACKED:
            if (src / name).exists():
                tar.add(src / name, arcname=name)
    print(f"{PACK}: {PACK.stat().st_size} bytes")
    import importlib.metadata as md

    wanted = [f"{n}=={md.version(n)}" for n in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")]
    platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for a in ("--platform", p)]
    rc = subprocess.call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                          "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(WHEELS),
                          *wanted])
    size = sum(f.stat().st_size for f in WHEELS.glob("*.whl"))
    print(f"{WHEELS}: {len(list(WHEELS.glob('*.whl')))} wheels, {size} bytes")
    return rc


def install_stand_ins(src: Path) -> None:
    """A bare ``vllm`` over ``src/vllm`` whose heavy modules are stand-ins; freespec over this checkout."""
    import torch
    import triton
    import triton.language as tl

    def module(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
        mod = types.ModuleType(name)
        if path is not None:
            mod.__path__ = [str(path)]
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    def async_tensor_h2d(data, device=None, dtype=None, out=None):  # vllm.utils.torch_utils's, without pinning
        return torch.as_tensor(data, dtype=dtype).to(device)

    class BaseSpeculator:  # vLLM's is an ABC over the model-based speculators' machinery; nothing here uses it
        pass

    root = src / "vllm"
    for name in ("vllm", "vllm.v1", "vllm.v1.worker", "vllm.v1.worker.gpu", "vllm.v1.worker.gpu.spec_decode",
                 "vllm.utils"):
        module(name, root.joinpath(*name.split(".")[1:]))
    module("vllm.config", VllmConfig=object)
    module("vllm.logger", init_logger=logging.getLogger)
    module("vllm.triton_utils", HAS_TRITON=True, tl=tl, triton=triton)
    module("vllm.utils.torch_utils", async_tensor_h2d=async_tensor_h2d)
    module("vllm.v1.worker.gpu.input_batch", InputBatch=object)
    module("vllm.v1.worker.gpu.spec_decode.speculator", BaseSpeculator=BaseSpeculator)
    # freespec's salt route asks whether it wrapped GPUModelRunner.add_requests: here it did not.
    module("vllm.v1.worker.gpu.model_runner", GPUModelRunner=type("GPUModelRunner", (), {"add_requests": None}))
    package = types.ModuleType("freespec")
    package.__path__ = [str(REPO / "freespec"), str(REPO)]  # freespec.vllm_plugins -> vllm_plugins/, ...
    sys.modules["freespec"] = package


def bool_masks_in_interpreter() -> None:
    """Under TRITON_INTERPRET=1: masks reach the interpreter's loads and stores as bool. Its ``x.to(tl.int64)``
    can leave ``x`` itself int64 (seen with triton 3.9: the suffix scan's ``active`` after
    ``match_len += active.to(tl.int64)``), and a later mask built from it then fails ("mask has unsupported
    dtype"); compiled, those masks are i1. A cast to bool keeps what each mask selects."""
    import numpy as np
    import triton.runtime.interpreter as interpreter

    native = interpreter._interpreter

    class BoolMasks:
        def __getattr__(self, name):
            return getattr(native, name)

        def load(self, ptrs, mask, other, dtype):
            return native.load(ptrs, mask if mask.dtype == np.bool_ else mask != 0, other, dtype)

        def store(self, ptrs, value, mask):
            return native.store(ptrs, value, mask if mask.dtype == np.bool_ else mask != 0)

    interpreter._interpreter = BoolMasks()


class HistoryState:
    """What a V2 speculator reads of vLLM 0.34's ``RequestState``, on ``device``, filled as vLLM fills it."""

    def __init__(self, device: str, max_len: int) -> None:
        import numpy as np
        import torch

        self.req_id_to_index: dict[str, int] = {}
        self.free = list(range(MAX_REQS))
        self.all_token_ids = SimpleNamespace(gpu=torch.zeros((MAX_REQS, max_len), dtype=torch.int32, device=device))
        self.total_len = SimpleNamespace(gpu=torch.zeros(MAX_REQS, dtype=torch.int32, device=device))
        self.prompt_len = SimpleNamespace(np=np.zeros(MAX_REQS, dtype=np.int32))
        self.last_sampled_tokens = torch.zeros(MAX_REQS, 1, dtype=torch.int64, device=device)
        self.device = device

    def add_request(self, req_id: str, prompt: list[int]) -> int:
        import torch

        slot = self.free.pop()
        self.req_id_to_index[req_id] = slot
        self.prompt_len.np[slot] = len(prompt)
        self.all_token_ids.gpu[slot, : len(prompt)] = torch.tensor(prompt, dtype=torch.int32, device=self.device)
        self.total_len.gpu[slot] = len(prompt)
        return slot

    def append(self, slot: int, tokens: list[int]) -> None:
        import torch

        length = int(self.total_len.gpu[slot])
        self.all_token_ids.gpu[slot, length: length + len(tokens)] = torch.tensor(tokens, dtype=torch.int32,
                                                                                  device=self.device)
        self.total_len.gpu[slot] = length + len(tokens)
        self.last_sampled_tokens[slot, 0] = tokens[-1]

    def remove_request(self, req_id: str) -> None:
        self.free.append(self.req_id_to_index.pop(req_id))


def vllm_config(method: str, options: dict | None, max_len: int) -> SimpleNamespace:
    """The parts of a VllmConfig the speculators read; a freespec method's options as its config leaves them."""
    method = method.removesuffix("_gpu")
    spec = SimpleNamespace(method=method, custom_method=method, num_speculative_tokens=K, speculator_options=options,
                           suffix_decoding_max_tree_depth=24, suffix_decoding_corpus_tokens=1 << 16,
                           suffix_decoding_max_cached_requests=10_000, enable_adaptive_verification=True)
    if method.startswith("freespec_"):
        from freespec.vllm_plugins.v2.options import normalized_speculator_options

        spec.speculator_options = normalized_speculator_options(method.removeprefix("freespec_"), K, options)
    model = SimpleNamespace(get_vocab_size=lambda: 49_152, max_model_len=max_len, model="recorded",
                            tokenizer="recorded")
    return SimpleNamespace(speculative_config=spec, model_config=model,
                           scheduler_config=SimpleNamespace(max_num_seqs=MAX_REQS))


def speculator_class(method: str):
    if method == "suffix":
        from vllm.v1.worker.gpu.spec_decode.suffix.speculator import SuffixSpeculator

        return SuffixSpeculator
    from freespec.vllm_plugins.v2 import speculator as v2  # (v2/config.py names them, but imports vLLM's registry)

    v2._tokenizer_fingerprint = lambda path: "recorded-turns"
    if method == "freespec_hybrid_gpu":  # what freespec_hybrid registers: it picks the GPU or the host path
        from freespec.vllm_plugins.v2.suffix_hybrid import HybridV2Speculator

        return HybridV2Speculator
    return {"freespec_copy": v2.CopySpeculator, "freespec_hybrid": v2.HybridSpeculator}[method]


def scripted_run(method: str, device: str, turns: list[dict], max_live: int = 3) -> list[dict]:
    """Each step's drafts (batch order: rows shuffled by a fixed rule), valid counts and, for suffix, confidences.
    The target accepts a draft's common prefix with the recorded output, plus one token of its own."""
    import torch

    # The model length the turns need, in whole 256-token blocks (fewer scan blocks: a quicker interpreter).
    max_len = -(-max(len(t["prompt"]) + len(t["output"]) + K + 1 for t in turns) // 256) * 256
    config = vllm_config(method, SPECULATOR_CONFIGS.get(method), max_len)
    states = HistoryState(device, max_len)
    speculator = speculator_class(method)(config, torch.device(device), states)
    waiting = list(enumerate(turns))
    live: dict[str, dict] = {}
    record: list[dict] = []
    step = 0
    built = type(speculator).__name__
    while waiting or live:
        while waiting and len(live) < max_live:
            i, turn = waiting.pop(0)
            slot = states.add_request(f"req-{i}", list(turn["prompt"]))
            speculator.add_request(slot)
            live[f"req-{i}"] = dict(turn=turn, slot=slot, made=0, new=0, rejected=0)
        order = sorted(live, key=lambda r: ((int(r[4:]) * 7 + step) % 5, r))  # a batch order that changes
        slots = torch.tensor([live[r]["slot"] for r in order], dtype=torch.int32)
        batch = SimpleNamespace(num_reqs=len(order), req_ids=order, idx_mapping=slots.to(device),
                                idx_mapping_np=slots.numpy())
        num_sampled = torch.tensor([live[r]["new"] for r in order], dtype=torch.int32, device=device)
        num_rejected = torch.tensor([live[r]["rejected"] for r in order], dtype=torch.int32, device=device)
        drafts = speculator.propose(batch, None, None, None, None, num_sampled, num_rejected,
                                    states.last_sampled_tokens, None, None, None).cpu()
        valid = speculator.num_valid[: len(order)].cpu()
        entry = {"drafts": drafts.tolist(), "valid": valid.tolist()}
        if hasattr(speculator, "draft_token_confidence_probs"):
            entry["confidence"] = [[round(x, 5) for x in row]
                                   for row in speculator.draft_token_confidence_probs[: len(order)].cpu().tolist()]
        if not record:
            entry["speculator"] = built
        record.append(entry)
        for i, r in enumerate(order):
            st = live[r]
            draft = drafts[i, : int(valid[i])].tolist() if st["new"] else []
            out = st["turn"]["output"]
            accepted = 0
            while accepted < len(draft) and st["made"] + accepted < len(out) and draft[accepted] == out[st["made"] + accepted]:
                accepted += 1
            new = out[st["made"]: st["made"] + accepted + 1]
            states.append(st["slot"], new)
            st["made"] += len(new)
            st["new"], st["rejected"] = len(new), (K - accepted if st["new"] else 0)
        finished = sorted(r for r in order if live[r]["made"] >= len(live[r]["turn"]["output"]))
        if finished:
            speculator.on_requests_finished(finished)
            for r in finished:
                states.remove_request(r)
                del live[r]
        step += 1
    return record


def compare(name: str, got: list[dict], want: list[dict]) -> dict:
    """The first step where ``got`` differs from ``want``, with the drafted token count."""
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None and len(got) != len(want):
        first = min(len(got), len(want))
    drafted = sum(sum(entry["valid"]) for entry in want)
    result = {"config": name, "speculator": want[0].get("speculator") if want else None, "steps": len(want),
              "drafted": drafted, "ok": first is None and drafted > 0}
    if first is not None:
        result["first_difference"] = {"step": first, "got": got[first] if first < len(got) else None,
                                      "want": want[first] if first < len(want) else None}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="where the speculators run (cuda; cpu with TRITON_INTERPRET=1)")
    parser.add_argument("--vllm-src", help="a folder holding vllm/ (default: build/vllm034-src.tar.gz, else installed)")
    parser.add_argument("--turns", type=int, default=3, help="recorded turns the scripted run serves")
    parser.add_argument("--configs", nargs="+", default=["suffix", *SPECULATOR_CONFIGS], metavar="CONFIG",
                        choices=["suffix", *SPECULATOR_CONFIGS])
    parser.add_argument("--out", help="write the results here as JSON (and a .md beside it)")
    parser.add_argument("--pack", action="store_true", help="write build/vllm034-src.tar.gz and build/device-wheels")
    parser.add_argument("--record", help=argparse.SUPPRESS)  # a child: one config's run on --device, to this file
    args = parser.parse_args(argv)
    src = vllm_src(args.vllm_src)
    if args.pack:
        return pack(src)
    turns = [json.loads(line) for line in (REPO / "tests/data/issue69_agent_turns.jsonl").read_text().splitlines()]
    turns = turns[: args.turns]
    if args.record:  # a child process: each run starts with nothing learned (a plugin may share across instances)
        install_stand_ins(src)
        if os.environ.get("TRITON_INTERPRET") == "1":
            bool_masks_in_interpreter()
        Path(args.record).write_text(json.dumps(scripted_run(args.configs[0], args.device, turns)))
        return 0
    import torch
    import triton

    def run(name: str, device: str, interpret: bool) -> list[dict]:
        with tempfile.TemporaryDirectory() as tmp:
            record = Path(tmp) / "record.json"
            cmd = [sys.executable, __file__, "--record", str(record), "--configs", name, "--device", device,
                   "--turns", str(args.turns), "--vllm-src", str(src)]
            env = {**os.environ, **({"TRITON_INTERPRET": "1"} if interpret else {})}
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"{device} run failed: {proc.stderr.strip().splitlines()[-1:]}")
            return json.loads(record.read_text())

    results = {"device": args.device, "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "triton": triton.__version__, "vllm_src": str(src),
               "interpret": os.environ.get("TRITON_INTERPRET") == "1", "turns": len(turns), "checks": []}
    for name in args.configs:
        started = time.perf_counter()
        try:  # the reference: CPU tensors, and for suffix's Triton kernels the interpreter
            check = compare(name, run(name, args.device, False), run(name, "cpu", name in TRITON_CONFIGS))
        except Exception as e:  # recorded: the other configs still run
            check = {"config": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
        check["seconds"] = round(time.perf_counter() - started, 1)
        results["checks"].append(check)
        print(f"[v2] {name}: {'ok' if check['ok'] else 'FAILED'} {json.dumps(check)[:400]}", flush=True)
    lines = [f"V2 speculators on {results['device_name']} ({args.device}; torch {results['torch']}, triton "
             f"{results['triton']}), {len(turns)} recorded turns, K={K}; reference: CPU (suffix: Triton's interpreter)",
             "", "| config | speculator | verdict | steps | drafted tokens | seconds |", "|---|---|---|---:|---:|---:|"]
    for c in results["checks"]:
        verdict = "same as the reference" if c["ok"] else (c.get("error") or f"DIFFERS at step {c.get('first_difference', {}).get('step')}")
        lines.append(f"| {c['config']} | {c.get('speculator') or ''} | {verdict} | {c.get('steps', '')} | "
                     f"{c.get('drafted', '')} | {c['seconds']} |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0 if all(c["ok"] for c in results["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
