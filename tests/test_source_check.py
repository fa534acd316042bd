"""The static seam check (vllm_plugins/source_check.py) on a small synthetic vLLM tree, offline.

The tree holds, file by file, only the facts each seam rests on, laid out as
vLLM 0.32.0 has them; every check passes on it. Each doctored copy moves one
seam the way a release could, and exactly that seam must fail, naming what
moved. A last test reads the vLLM installed here (its source, never imported).
"""
from __future__ import annotations

import importlib.util
import json
import textwrap
import zipfile
from pathlib import Path

import pytest
from freespec.vllm_plugins import probes, source_check
from freespec.vllm_plugins.source_check import Source, run_checks

RANK_LAYOUT_CODE = """\
    group_ranks = torch.arange(world_size).reshape(
        -1, data_parallel_size, pipeline_model_parallel_size,
        prefill_context_model_parallel_size, tensor_model_parallel_size,
    )
"""

FILES = {
    "_version.py": "__version__ = version = '0.32.0'\n",
    "plugins/__init__.py": """
        GROUP = "vllm.general_plugins"

        def load_general_plugins():
            return GROUP
    """,
    "engine/arg_utils.py": """
        class EngineArgs:
            speculative_config: dict | None = None
            additional_config: dict = None

            def __post_init__(self):
                from vllm.plugins import load_general_plugins
                load_general_plugins()

            def create_speculative_config(self, target_model_config, target_parallel_config):
                return SpeculativeConfig(**self.speculative_config)

            def create_engine_config(self):
                speculative_config = self.create_speculative_config(1, 2)
                return VllmConfig(speculative_config=speculative_config, additional_config=self.additional_config)
    """,
    "config/vllm.py": """
        class VllmConfig:
            additional_config: dict = None

            def _get_v2_model_runner_unsupported_features(self):
                unsupported = []
                if self.speculative_config.method in ("suffix", "custom_class"):
                    unsupported.append("speculative method")
                return unsupported
    """,
    "config/speculative.py": """
        EagleModelTypes = Literal["eagle", "eagle3"]
        SpeculativeMethod = Literal["ngram", "suffix", "custom_class", EagleModelTypes]

        class SpeculativeConfig:
            method: SpeculativeMethod | None = None
            model: str | None = None
            num_speculative_tokens: int | None = None
    """,
    "v1/spec_decode/custom_class_proposer.py": """
        def create_custom_proposer(vllm_config):
            return None
    """,
    "v1/worker/gpu_model_runner.py": """
        class GPUModelRunner:
            def execute_model(self, scheduler_output, intermediate_tensors=None):
                pass

            def sample_tokens(self, hidden_states, logits_indices):
                sample_hidden_states = hidden_states[logits_indices]
                logits = self.model.compute_logits(sample_hidden_states)
                self._draft_token_ids = self.propose_draft_token_ids(logits)

            def propose_draft_token_ids(self, spec_config, sampled_token_ids, slot_mappings):
                if spec_config.method == "ngram":
                    pass
                elif spec_config.method == "custom_class":
                    draft_token_ids = self.drafter.propose(
                        sampled_token_ids,
                        self.input_batch.num_tokens_no_spec,
                        self.input_batch.token_ids_cpu,
                        slot_mappings=slot_mappings,
                    )

            def load_model(self):
                self.drafter.load_model(self.model)

            def _calc_spec_decode_metadata(self, num_draft_tokens):
                num_sampled_tokens = num_draft_tokens + 1
                return np.repeat(num_sampled_tokens, 2)
    """,
    "v1/worker/gpu_input_batch.py": """
        @dataclass
        class CachedRequestState:
            req_id: str
            sampling_params: SamplingParams | None

        class InputBatch:
            @property
            def req_ids(self):
                return self._req_ids
    """,
    "v1/worker/cpu_model_runner.py": """
        class CPUModelRunner:
            def load_model(self):
                self.drafter.load_model(self.model)
    """,
    "platforms/cpu.py": """
        class CpuPlatform:
            @classmethod
            def register_triton_kernel_overrides(cls):
                from vllm.triton_utils.dispatcher import register_kernels
                register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": impl})
    """,
    "triton_utils/dispatcher.py": """
        def register_kernels(kernels):
            pass
    """,
    "v1/sample/rejection_sampler.py": """
        def expand_kernel(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS):
            pass
    """,
    "utils/cpu_triton_utils.py": """
        def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
            torch.ops._C.expand_kernel_impl(_ensure_int64(output), input_val, cu_num_tokens, replace_from, replace_to)
    """,
    "v1/core/sched/scheduler.py": """
        class Scheduler:
            def add_request(self, request):
                self.waiting.add_request(request)

            def _free_request(self, request, delay_free_blocks=False):
                return None, None
    """,
    "v1/request.py": """
        class Request:
            def __init__(self, request_id, sampling_params, cache_salt=None):
                self.sampling_params = sampling_params
                self.cache_salt: str | None = cache_salt
    """,
    "sampling_params.py": """
        class SamplingParams:
            max_tokens: int | None = 16
            extra_args: dict[str, Any] | None = None
    """,
    "v1/core/sched/output.py": """
        @dataclass
        class NewRequestData:
            req_id: str
            sampling_params: SamplingParams | None

        @dataclass
        class SchedulerOutput:
            num_scheduled_tokens: dict[str, int]
            total_num_scheduled_tokens: int
    """,
    "v1/core/kv_cache_manager.py": """
        class KVCacheManager:
            def allocate_slots(self, request, num_new_tokens):
                num_tokens_to_cache = min(
                    total_computed_tokens + num_new_tokens,
                    request.num_tokens,
                )
                self.coordinator.cache_blocks(request, num_tokens_to_cache)

            def cache_blocks(self, request, num_computed_tokens):
                pass
    """,
    "v1/spec_decode/metrics.py": "NAMES = [" + ", ".join(f'"{m}"' for m in probes.SPEC_METRICS) + "]\n",
    "v1/metrics/prometheus.py": """
        def get_prometheus_registry():
            if os.getenv("PROMETHEUS_MULTIPROC_DIR") is not None:
                registry = CollectorRegistry()
                multiprocess.MultiProcessCollector(registry)
                return registry
            return REGISTRY
    """,
    "entrypoints/cli/main.py": """
        import importlib.metadata

        def main():
            return importlib.metadata.version("vllm")
    """,
    "distributed/parallel_state.py": """
        def model_parallel_is_initialized():
            pass

        def get_tp_group():
            pass

        def get_pcp_group():
            pass

        def initialize_model_parallel(tensor_model_parallel_size, pipeline_model_parallel_size):
    """ + textwrap.indent(textwrap.dedent(RANK_LAYOUT_CODE), " " * 12),
    "v1/executor/multiproc_executor.py": """
        class MultiprocExecutor:
            def _get_output_rank(self):
                return (
                    self.world_size
                    - self.parallel_config.tensor_parallel_size
                    * self.parallel_config.prefill_context_parallel_size
                )

            def take_draft_token_ids(self):
                return self.collective_rpc("take_draft_token_ids", unique_reply_rank=self.output_rank)
    """,
    "v1/executor/abstract.py": """
        class Executor:
            def take_draft_token_ids(self):
                output = self.collective_rpc("take_draft_token_ids")
                return output[0]
    """,
}

# One move per seam: (file, text in the 0.32.0 layout, what a release could have instead).
MOVES = {
    "general_plugins": ("plugins/__init__.py", '"vllm.general_plugins"', '"vllm.plugins.general"'),
    "frontend": ("engine/arg_utils.py", "def create_speculative_config", "def build_speculative_config"),
    "spec_config": ("config/speculative.py", '"custom_class", ', ""),
    "custom_class": ("v1/worker/gpu_model_runner.py", "self.input_batch.num_tokens_no_spec,\n", ""),
    "cpu_rejection_sampler": ("platforms/cpu.py", "def register_triton_kernel_overrides", "def register_kernels"),
    "cpu_expand_kernel": ("v1/sample/rejection_sampler.py", "replace_from, replace_to, MAX", "replace_to, replace_from, MAX"),
    "target_topk": ("v1/worker/gpu_model_runner.py", "num_sampled_tokens = num_draft_tokens + 1",
                    "num_sampled_tokens = num_draft_tokens"),
    "spec_metrics": ("v1/spec_decode/metrics.py", '"vllm:spec_decode_num_drafts"', '"vllm:spec_decode_drafts"'),
    "metrics_registry": ("v1/metrics/prometheus.py", "multiprocess.MultiProcessCollector(registry)", "pass"),
    "vllm_cli": ("entrypoints/cli/main.py", "def main():", "def main(argv):"),
    "draft_rank": ("v1/executor/multiproc_executor.py", "unique_reply_rank=self.output_rank", "timeout=5"),
    "request_ids": ("v1/worker/gpu_input_batch.py", "def req_ids", "def request_ids"),
    "cache_salt": ("v1/request.py", "self.cache_salt: str | None = cache_salt", "self.salt = cache_salt"),
    "last_step_cache": ("v1/core/kv_cache_manager.py", "def cache_blocks(self, request, num_computed_tokens)",
                        "def cache_blocks(self, request, num_tokens)"),
    "step_times": ("v1/worker/gpu_model_runner.py", "def execute_model(self, scheduler_output,",
                   "def execute_model(self, batch,"),
}


# vLLM 0.34.0's layout (Model Runner V2 only): the V1 runner's files gone, the registry and V2's speculator seams.
V1_RUNNER_FILES = ("v1/worker/gpu_model_runner.py", "v1/worker/gpu_input_batch.py",
                   "v1/spec_decode/custom_class_proposer.py", "platforms/cpu.py", "v1/sample/rejection_sampler.py")
FILES_V2 = {rel: text for rel, text in FILES.items() if rel not in V1_RUNNER_FILES} | {
    "_version.py": "__version__ = version = '0.34.0'\n",
    "config/speculative.py": """
        SpeculativeMethod = Literal["ngram", "suffix", "eagle"]

        class SpeculativeConfig:
            method: SpeculativeMethod | str | None = None
            model: str | None = None
            num_speculative_tokens: int | None = None
            speculator_options: dict[str, Any] | None = None

            def __post_init__(self):
                if (custom_cls := get_custom_speculator_config_class(self.method)) is not None:
                    self.custom_method = self.method
                config_cls = get_method_config_class(self)
                config_cls.apply_options(self)
    """,
    "v1/worker/gpu/spec_decode/speculator_config.py": """
        class SpeculatorConfig:
            base_method: ClassVar[str | None] = None
            speculator_class: ClassVar[str | None] = None
            supported_options: ClassVar[frozenset[str]] = frozenset()

            @classmethod
            def configure(cls, spec):
                pass

            @classmethod
            def apply_options(cls, spec):
                return

        def register_speculative_method(name, config_cls):
            CUSTOM[name] = config_cls
    """,
    "v1/worker/gpu/spec_decode/__init__.py": """
        def init_speculator(vllm_config, device, req_states):
            return factory(vllm_config, device, req_states=req_states)
    """,
    "v1/worker/gpu/spec_decode/speculator.py": """
        class BaseSpeculator:
            def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                        num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                        dp_sync_state=None, num_speculative_tokens=None):
                pass

            def add_request(self, req_index):
                return

            def on_requests_finished(self, finished_req_ids):
                return

            def reset_state(self):
                return
    """,
    "v1/worker/gpu/model_runner.py": """
        class GPUModelRunner:
            def add_requests(self, scheduler_output):
                for new_req_data in scheduler_output.scheduled_new_reqs:
                    sampling_params = new_req_data.sampling_params
                    req_index = self.req_states.req_id_to_index[new_req_data.req_id]
                    self.speculator.add_request(req_index)

            def sample_tokens(self, grammar_output):
                self.postprocess_sampled(input_batch.idx_mapping, sampled, num_sampled)
                draft_tokens = self.speculator.propose(input_batch, num_sampled)
    """,
    "v1/worker/gpu/states.py": """
        class RequestState:
            def __init__(self, max_num_reqs, max_model_len):
                self.req_id_to_index: dict[str, int] = {}
                self.all_token_ids = StagedWriteTensor((max_num_reqs, max_model_len))
                self.total_len = StagedWriteTensor(max_num_reqs)
                self.last_sampled_tokens = torch.zeros(max_num_reqs, 1)
    """,
    "v1/worker/gpu/input_batch.py": """
        @dataclass
        class InputBatch:
            req_ids: list[str]
            num_reqs: int
            idx_mapping: torch.Tensor
            idx_mapping_np: np.ndarray
    """,
}
# One move per V2 seam, in the 0.34.0 layout.
MOVES_V2 = {
    "v2_registry": ("v1/worker/gpu/spec_decode/speculator_config.py", "def register_speculative_method(",
                    "def register_method("),
    "v2_propose": ("v1/worker/gpu/spec_decode/speculator.py", "num_sampled, num_rejected, last_sampled",
                   "num_rejected, num_sampled, last_sampled"),
    "v2_token_history": ("v1/worker/gpu/states.py", "self.total_len = ", "self.seq_len = "),
    "v2_salt_route": ("v1/worker/gpu/model_runner.py", "sampling_params = new_req_data.sampling_params", "pass"),
}


def write_tree(root: Path, move: str | None = None, files: dict | None = None) -> Path:
    """The synthetic vLLM tree under ``root`` (the folder above ``vllm/``), with one seam moved if asked;
    ``files``: another layout (``FILES_V2``)."""
    moves = MOVES | MOVES_V2
    for rel, text in (files or FILES).items():
        text = textwrap.dedent(text)
        if move is not None and moves[move][0] == rel:
            old, new = moves[move][1:]
            assert old in text, f"the move of {move} does not apply to {rel}"
            text = text.replace(old, new, 1)
        path = root / "vllm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def by_seam(results) -> dict:
    return {r.seam: r for r in results}


def test_every_probe_has_a_static_check_and_a_move_in_this_test():
    seams = {probes.seam_name(p) for p in probes.PROBES}
    checks = {source_check.seam_of(c) for c in source_check.CHECKS}
    assert seams <= checks, f"probes without a static check: {seams - checks}"
    assert set(MOVES) | set(MOVES_V2) == checks


def test_the_0_32_layout_passes_every_check(tmp_path):
    results = run_checks(Source(write_tree(tmp_path)))
    failed = {r.seam: r.detail for r in results if not r.ok}
    assert not failed
    details = by_seam(results)
    assert "defect still upstream" in details["cpu_expand_kernel"].detail
    assert "num_tokens_no_spec" in details["custom_class"].detail
    assert "defect still upstream" in details["last_step_cache"].detail


@pytest.mark.parametrize("seam", sorted(MOVES))
def test_a_moved_seam_fails_and_only_that_one(tmp_path, seam):
    results = by_seam(run_checks(Source(write_tree(tmp_path, move=seam))))
    assert [s for s, r in results.items() if not r.ok] == [seam]
    assert results[seam].detail  # says what moved


def test_the_failure_names_what_moved(tmp_path):
    results = by_seam(run_checks(Source(write_tree(tmp_path, move="spec_metrics"))))
    assert "vllm:spec_decode_num_drafts" in results["spec_metrics"].detail
    results = by_seam(run_checks(Source(write_tree(tmp_path / "b", move="frontend"))))
    assert "create_speculative_config is gone" in results["frontend"].detail


def test_a_missing_file_fails_its_seam_by_path(tmp_path):
    write_tree(tmp_path)
    (tmp_path / "vllm" / "v1" / "spec_decode" / "custom_class_proposer.py").unlink()
    results = by_seam(run_checks(Source(tmp_path)))
    assert not results["custom_class"].ok
    assert "vllm/v1/spec_decode/custom_class_proposer.py is gone" in results["custom_class"].detail


def test_custom_class_fails_when_it_leaves_the_v1_runner(tmp_path):
    write_tree(tmp_path)
    path = tmp_path / "vllm" / "config" / "vllm.py"
    path.write_text(path.read_text().replace('("suffix", "custom_class")', '("suffix",)'))
    results = by_seam(run_checks(Source(tmp_path)))
    assert not results["custom_class"].ok and "Model Runner V2" in results["custom_class"].detail


def test_options_read_before_the_speculative_config_is_built_fail_frontend(tmp_path):
    write_tree(tmp_path)
    path = tmp_path / "vllm" / "engine" / "arg_utils.py"
    text = path.read_text().replace(
        "        speculative_config = self.create_speculative_config(1, 2)\n",
        "        extra = dict(additional_config=self.additional_config)\n"
        "        speculative_config = self.create_speculative_config(1, 2)\n",
    )
    path.write_text(text)
    results = by_seam(run_checks(Source(tmp_path)))
    assert not results["frontend"].ok and "before create_speculative_config" in results["frontend"].detail


def test_a_wheel_is_read_in_place_and_its_metadata_gives_the_version(tmp_path):
    tree = write_tree(tmp_path / "tree")
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path in (tree / "vllm").rglob("*.py"):
            z.write(path, path.relative_to(tree).as_posix())
        z.writestr("vllm-0.33.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    src = Source(wheel)
    assert src.version() == "0.33.0"
    assert all(r.ok for r in run_checks(src))
    assert Source(tree).version() == "0.32.0"  # a folder: vllm/_version.py


def test_main_writes_json_and_exits_1_only_for_a_blocking_seam(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert source_check.main([str(write_tree(tmp_path / "ok")), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["vllm"] == "0.32.0" and data["supported"] is True and data["blocking_failed"] == []
    assert set(data["probes"]) == set(MOVES) | set(MOVES_V2)
    # A reporting seam (metric names) is printed as a warning; a blocking one fails the run.
    assert source_check.main([str(write_tree(tmp_path / "m", move="spec_metrics"))]) == 0
    assert "[WARN] spec_metrics" in capsys.readouterr().out
    assert source_check.main([str(write_tree(tmp_path / "c", move="custom_class"))]) == 1
    assert "[FAIL] custom_class" in capsys.readouterr().out


def test_on_the_0_34_layout_every_blocking_seam_holds_and_the_v1_only_ones_only_warn(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert source_check.main([str(write_tree(tmp_path / "v2", files=FILES_V2)), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["vllm"] == "0.34.0" and "V2" in data["runner"] and data["blocking_failed"] == []
    assert all(data["probes"][seam]["ok"] for seam in MOVES_V2)
    assert not data["probes"]["custom_class"]["ok"] and "custom_class" not in data["blocking"]
    printed = capsys.readouterr().out
    assert "[WARN] custom_class" in printed and "[ok] v2_registry" in printed


@pytest.mark.parametrize("seam", sorted(MOVES_V2))
def test_a_moved_v2_seam_fails_on_the_0_34_layout(tmp_path, seam):
    before = {s for s, r in by_seam(run_checks(Source(write_tree(tmp_path / "a", files=FILES_V2)))).items()
              if not r.ok}
    results = by_seam(run_checks(Source(write_tree(tmp_path / "b", move=seam, files=FILES_V2))))
    assert {s for s, r in results.items() if not r.ok} - before == {seam}
    code = source_check.main([str(tmp_path / "b")])
    assert code == (0 if seam == "v2_salt_route" else 1)  # a moved salt route only reports: without it `salt` learns nothing across requests, never wrongly


def test_proposing_before_the_sampled_tokens_are_written_fails_v2_propose(tmp_path):
    write_tree(tmp_path, files=FILES_V2)
    path = tmp_path / "vllm" / "v1" / "worker" / "gpu" / "model_runner.py"
    lines = path.read_text().splitlines()
    lines[-2], lines[-1] = lines[-1], lines[-2]
    path.write_text("\n".join(lines) + "\n")
    result = by_seam(run_checks(Source(tmp_path)))["v2_propose"]
    assert not result.ok and "one step late" in result.detail


def test_v2_seams_are_not_used_on_a_v1_release(tmp_path):
    results = by_seam(run_checks(Source(write_tree(tmp_path))))
    assert all(results[seam].ok and "not used" in results[seam].detail for seam in MOVES_V2)


def test_bad_arguments_are_refused(tmp_path, capsys):
    assert source_check.main([str(tmp_path)]) == 2  # no vllm/ there
    assert "holds no vllm/ package" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not a vllm requirement"):
        source_check.download("torch; rm -rf /", tmp_path)
    with pytest.raises(SystemExit):
        source_check.main([])


def test_the_installed_vllm_source_passes_every_blocking_check():
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no vLLM installed")
    results = by_seam(run_checks(Source(Path(next(iter(spec.submodule_search_locations))).parent)))
    failed = {s: r.detail for s, r in results.items() if not r.ok and s in source_check.BLOCKING}
    assert not failed


def test_every_seam_is_declared_once_and_both_readers_derive_from_it():
    from freespec.vllm_plugins.seams import SEAMS

    names = [s.name for s in SEAMS]
    assert len(names) == len(set(names))
    assert [source_check.seam_of(c) for c in source_check.CHECKS] == names
    assert [probes.seam_name(p) for p in probes.PROBES] == [s.name for s in SEAMS if s.role != "loaded"]


def test_the_installed_vllm_and_its_source_agree_on_every_declared_fact():
    """The runtime reader (import, inspect) and the static one (ast) of one declaration say the same thing."""
    from freespec.vllm_plugins.seams import SEAMS, Fact

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no vLLM installed")
    src = Source(Path(next(iter(spec.submodule_search_locations))).parent)
    for seam in SEAMS:
        for fact in seam.facts:
            assert (probes.installed_problem(fact) is None) == (source_check.source_problem(src, fact) is None), fact
    moved = (
        Fact("engine/arg_utils.py", "EngineArgs.build_speculative_config"),
        Fact("v1/spec_decode/metrics.py", holds=('"vllm:spec_decode_drafts"',), why="renamed"),
        Fact("v1/core/kv_cache_manager.py", "KVCacheManager.cache_blocks", params=("self", "blocks"), exact=True),
        Fact("v1/core/sched/scheduler.py", "Scheduler._free_request", holds=("no such line",)),
        Fact("config/speculative.py", "SpeculativeConfig.draft_rank_table", field=True),
    )
    for fact in moved:
        problem = probes.installed_problem(fact)
        assert problem and problem == source_check.source_problem(src, fact), fact
