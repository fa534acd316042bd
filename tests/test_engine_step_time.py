"""The diagnosis patch step_times (vllm_plugins/step_timer.py) on a stand-in runner class, and the tables of
scripts/engine_step_time.py (the engine runs themselves are a measurement: results/issue69-zen3)."""
from __future__ import annotations

import time

from script_loader import load_script

from freespec.vllm_plugins import step_timer
from freespec.vllm_plugins.probes import probe_step_times

engine_step_time = load_script("engine_step_time")


class Output:
    def __init__(self, tokens: dict[str, int]) -> None:
        self.num_scheduled_tokens = tokens
        self.total_num_scheduled_tokens = sum(tokens.values())


def runner_class(forward_s: float = 0.004):
    """A fresh stand-in runner class a test (the patch wraps the class, so none is shared between tests).
    vLLM's order: execute_model (the forward), then sample_tokens, which calls the drafter when it drafts."""

    class Runner:
        def __init__(self, drafts: bool) -> None:
            self.drafts = drafts

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            time.sleep(forward_s)

        def sample_tokens(self, grammar_output):
            time.sleep(0.001)
            if self.drafts:
                self.propose_draft_token_ids()
            return "sampled"

        def propose_draft_token_ids(self):
            time.sleep(0.002)
            return [[1, 2]]

    return Runner


def test_each_step_is_timed_in_its_parts_and_the_methods_still_return_what_they_did():
    Runner = runner_class()
    timer = step_timer.StepTimes()
    timer.install(Runner)
    timer.install(Runner)  # idempotent: not wrapped twice
    runner = Runner(drafts=True)
    runner.execute_model(Output({"a": 3}))
    assert runner.sample_tokens(None) == "sampled"
    runner.drafts = False
    runner.execute_model(Output({"a": 1, "b": 1}))
    runner.sample_tokens(None)
    first, second = timer.steps
    assert (first.tokens, first.requests, second.tokens, second.requests) == (3, 1, 2, 2)
    assert first.forward_s >= 0.004 and first.draft_s >= 0.002 and first.sample_s >= first.draft_s + 0.001
    assert second.draft_s == 0.0 and second.start >= first.end


def test_sampling_without_a_forward_before_it_is_not_a_step_and_steps_stop_at_the_bound(monkeypatch):
    monkeypatch.setattr(step_timer, "MAX_STEPS", 2)

    Quick = runner_class(forward_s=0.0)
    timer = step_timer.StepTimes()
    timer.install(Quick)
    runner = Quick(drafts=False)
    runner.sample_tokens(None)
    assert timer.steps == []
    for _ in range(3):
        runner.execute_model(Output({"a": 1}))
        runner.sample_tokens(None)
    assert len(timer.steps) == 2


def test_the_installed_vllm_has_the_seam():
    assert probe_step_times().ok


def _run(label, rnd, forward_ms, draft_ms, tokens=(2, 3, 9, 40), texts=("x",)):
    steps, t = [], 0.0
    for n in tokens:
        f, d = forward_ms / 1e3, draft_ms / 1e3
        steps.append({"tokens": n, "requests": 1, "start": t, "forward_s": f, "sample_s": d + 0.001, "draft_s": d,
                      "end": t + f + d + 0.001})
        t += f + d + 0.001 + 0.0005
    return {"label": label, "round": rnd, "wall_s": t, "texts": list(texts), "steps": steps}


def test_summary_counts_decode_steps_only_and_splits_the_sampling_from_the_drafter():
    s = engine_step_time.summary(_run("suffix", 1, 50.0, 0.2), k=8)
    assert s["steps"] == 4
    assert round(s["forward_ms"], 6) == 50.0  # the 40-token prefill is left out of the means
    assert round(s["draft_ms"], 6) == 0.2 and round(s["sampling_ms"], 6) == 1.0 and round(s["between_ms"], 6) == 0.5


def test_tables_say_which_processes_took_the_first_ones_steps_and_text_and_give_each_configs_range():
    runs = [_run("suffix", 1, 50.0, 0.2), _run("H0", 1, 55.0, 0.5), _run("suffix", 2, 60.0, 0.2, tokens=(2, 2, 9, 40)),
            _run("H0", 2, 57.0, 0.5, texts=("y",))]
    text = engine_step_time.tables(runs, k=8)
    lines = text.splitlines()
    assert "| suffix | 1 | " in lines[2] and "| yes, yes | 50.00 |" in lines[2]
    assert "| no, yes |" in lines[4] and "| yes, no |" in lines[5]
    assert "| suffix | 2 | " in text and "55.00 (50.00 to 60.00)" in text and "56.00 (55.00 to 57.00)" in text


def test_memory_is_read_from_the_rollup_and_shown_in_megabytes(tmp_path):
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text("55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss:  2097152 kB\nAnonHugePages:  1048576 kB\n"
                      "FilePmdMapped:        0 kB\n")
    kb = engine_step_time.memory_kb(str(rollup))
    assert kb == {"Rss": 2097152, "AnonHugePages": 1048576, "FilePmdMapped": 0}
    run = _run("none", 1, 40.0, 0.0)
    run["memory_kb"] = kb
    assert "| 2,048 (1,024, 0) |" in engine_step_time.tables([run], k=8)
    assert engine_step_time.memory_kb(str(tmp_path / "missing")) == {}
