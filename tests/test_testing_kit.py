"""freespec.testing, the kit plugin authors test with: each check passes a sound plugin and fails a faulty one."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from freespec.proposers.base import Draft
from freespec.proposers.copy import CopyProposer
from freespec.testing import (
    EngineRuns,
    assert_breaker_engages,
    assert_greedy_identity,
    assert_refuses,
    assert_sampling_distribution,
    replay_tokens_per_forward,
)
from freespec.testing import engines as kit_engines
from freespec.testing.plugins import plugin_name


class RaisesAlways(CopyProposer):
    def draft(self, rows, step):
        raise RuntimeError("a bug every request hits")


class RefusesAtBind(CopyProposer):
    def bind(self, info):
        raise ValueError(f"option 'min_match' cannot be used with a vocabulary of {info.vocab_size}")


class DraftsTheNextTokens(CopyProposer):
    """Drafts 1, 2, 3, ... after the last token (right on the kit's tests' counting outputs)."""

    def draft(self, rows, step):
        return [Draft([int(r.tokens[-1]) + 1 + i for i in range(self.k)]) for r in rows]


def test_a_plugin_is_named_by_its_entry_point_or_its_class_path():
    assert plugin_name("copy") == "copy"
    assert plugin_name(RaisesAlways) == f"{__name__}:RaisesAlways"

    class Local(CopyProposer):
        pass

    with pytest.raises(ValueError, match="module level"):
        plugin_name(Local)
    with pytest.raises(TypeError):
        plugin_name(object)


def test_assert_refuses_needs_a_refusal_that_names_the_field():
    message = assert_refuses("copy", {"min_match": 0}, "min_match")
    assert "option 'min_match'" in message
    assert_refuses("copy", {"min_mach": 3}, "min_mach")  # unknown option
    with pytest.raises(AssertionError, match="accepted options"):
        assert_refuses("copy", {"min_match": 3}, "min_match")
    # refused, but for another field: every field is listed in "Allowed options", which does not count
    with pytest.raises(AssertionError, match="without naming 'max_match'"):
        assert_refuses("copy", {"min_match": 0}, "max_match")
    # refused by the plugin in the worker (bind): the field named as a word
    assert "vocabulary of 77" in assert_refuses(RefusesAtBind, {}, "min_match", vocab_size=77)
    with pytest.raises(AssertionError, match="without naming"):
        assert_refuses(RefusesAtBind, {}, "match")


def test_assert_breaker_engages_passes_a_sound_plugin_and_fails_one_that_raises_on_healthy_steps():
    states = assert_breaker_engages("copy")
    assert states["raise"]["opens"] == 1 and "injected fault" in states["raise"]["last_reason"]
    assert states["stall"]["opens"] == 1 and "budget" in states["stall"]["last_reason"]
    with pytest.raises(AssertionError, match="raised on a healthy run"):
        assert_breaker_engages(RaisesAlways)


def test_replay_tokens_per_forward_counts_target_forwards(tmp_path):
    counting = [([0], list(range(1, 61)))]
    assert replay_tokens_per_forward(DraftsTheNextTokens, {}, counting, k=4) == pytest.approx(60 / 13)  # 1 + 12 x 5
    assert replay_tokens_per_forward(DraftsTheNextTokens, {}, counting, k=4, vocab_size=100) == pytest.approx(60 / 13)
    path = tmp_path / "greedy.jsonl"
    path.write_text(json.dumps({"prompt": [0], "output": list(range(1, 61))}) + "\n")
    assert replay_tokens_per_forward(DraftsTheNextTokens, {}, path, k=4) == pytest.approx(60 / 13)
    assert replay_tokens_per_forward("copy", {}, [([5, 6], [7, 8, 9, 10])]) == 1.0  # nothing to copy from


def engine_results(spec, jobs):
    """What engine_run would write. Greedy: each prompt answered 0, 1, 2 (a plugin: 0, 1, 9 from prompt 1 on).
    Sampled (temperature > 0): random tokens, the same with or without a plugin, unless the plugin's options say
    ``follow``: then every sample is the greedy text (requests following the draft)."""
    out = {}
    rng = np.random.default_rng(0)
    for job in jobs:
        n, follow = len(job["prompts"]), (spec or {}).get("follow")
        if job.get("temperature", 0.0) > 0:
            ids = [[0, 1, 2, 3] if follow else [int(t) for t in rng.integers(0, 4, 4)] for _ in range(n)]
        else:
            ids = [[0, 1, 2, 3] if spec is None or i == 0 else [0, 1, 9, 3] for i in range(n)]
        out[job["name"]] = {"texts": ["x"] * n, "token_ids": ids, "seconds": 1.0,
                            "top_logprobs": [[[-0.1, -3.0]] * 4] * n if job.get("logprobs") else None,
                            "spec": {} if spec is None else {"vllm:spec_decode_num_accepted_tokens": 2,
                                                             "vllm:spec_decode_num_draft_tokens": 4}}
    return out


def fake_engine(calls):
    def run(cmd, cwd, env, **_):
        spec_in, spec_out = cmd[-2:]
        spec = json.loads(open(spec_in).read())
        calls.append({"cmd": cmd, "cwd": cwd, "pythonpath": env["PYTHONPATH"], "spec": spec})
        json.dump(engine_results(spec["speculative_config"], spec["jobs"]), open(spec_out, "w"))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_engine_runs_run_each_configuration_once_in_its_own_process(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", fake_engine(calls))
    runs = EngineRuns("model-dir", tmp_path)
    jobs = [{"name": "greedy", "prompts": ["a"], "max_tokens": 3}]
    first, _ = runs.run(None, None, jobs)
    again, _ = runs.run(None, None, jobs)
    runs.run(None, {"plugin": "copy", "num_speculative_tokens": 2}, jobs)
    assert first is again and len(calls) == 2
    assert calls[0]["cmd"][1:3] == ["-m", "freespec.testing.engine_run"] and calls[0]["spec"]["model"] == "model-dir"
    # the engine imports what this process imports (a test module's plugin class)
    assert calls[0]["pythonpath"].split(os.pathsep)[:len(sys.path)] == [p for p in sys.path if p]
    assert calls[1]["spec"]["speculative_config"] == {"plugin": "copy", "num_speculative_tokens": 2}

    def failing(cmd, **_):
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback: the engine died")

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(pytest.fail.Exception, match="the engine died"):
        runs.run("other", None, jobs)


def test_greedy_identity_compares_with_no_speculation_and_allows_only_ties(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", fake_engine(calls))
    monkeypatch.setattr(kit_engines, "_sessions", {"m": EngineRuns("m", tmp_path)})
    got = assert_greedy_identity("copy", {}, prompts=["one"], model="m")  # one prompt: identical
    assert got["spec"]["vllm:spec_decode_num_accepted_tokens"] == 2
    assert calls[0]["spec"]["jobs"][0]["logprobs"] == 2 and calls[0]["spec"]["speculative_config"] is None
    assert calls[1]["spec"]["speculative_config"] == {"plugin": "copy", "num_speculative_tokens": 6}
    with pytest.raises(AssertionError, match="prompt 1: diverges at token 2 where the target's top-2 differ by 2.90e"):
        assert_greedy_identity("copy", {}, prompts=["one", "two"], model="m")


def test_sampling_distribution_fails_a_plugin_whose_samples_follow_the_draft(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", fake_engine(calls))
    monkeypatch.setattr(kit_engines, "_sessions", {"m": EngineRuns("m", tmp_path)})
    assert_sampling_distribution("copy", {}, model="m", samples=40, max_tokens=4)
    jobs = calls[0]["spec"]["jobs"]
    assert [j["name"] for j in jobs] == ["sample_prefix", "sample", "sample_greedy"] and len(calls) == 2
    assert len(jobs[1]["prompts"]) == 40 and jobs[1]["temperature"] == 0.8
    with pytest.raises(AssertionError, match="sampled outputs differ from no speculation"):
        assert_sampling_distribution("copy", {"follow": True}, model="m", samples=40, max_tokens=4)
