"""scripts/replay_drafts.py: greedy outputs replayed through a drafting rule, on tiny synthetic inputs.

Under greedy decoding a draft's accepted tokens are its common prefix with the real continuation; the
replay counts target forward passes and models a step that verifies d draft tokens as 1 + cost * d plain
steps. These tests check that arithmetic with drafters whose drafts are always or never right, and run the
command line end to end with a freespec plugin on a JSON lines file such as `--generate` writes.
"""
from __future__ import annotations

import json
import sys

import pytest
from script_loader import load_script

replay_drafts = load_script("replay_drafts")


class Oracle:
    """Drafts the next ``k`` tokens of the known output: every draft token is accepted."""

    def __init__(self, prompt: list[int], output: list[int], k: int) -> None:
        self.text, self.k, self.released = prompt + output, k, []

    def propose(self, rows):
        return [[int(t) for t in self.text[len(row.tokens):len(row.tokens) + self.k]] for row in rows]

    def release(self, key: int) -> None:
        self.released.append(key)


class Wrong:
    """Drafts ``k`` tokens that never occur in the text: every draft is rejected."""

    def __init__(self, k: int) -> None:
        self.k, self.calls = k, 0

    def propose(self, rows):
        self.calls += 1
        return [[999] * self.k for _ in rows]

    def release(self, key: int) -> None:
        pass


PROMPT = [1, 2, 3, 4]
OUTPUT = list(range(10, 30))  # 20 tokens


def test_a_draft_that_is_always_right_saves_target_passes():
    oracle = Oracle(PROMPT, OUTPUT, k=4)
    drafts = []
    tokens, steps, spent = replay_drafts.replay(oracle, 7, PROMPT, OUTPUT, cost=0.1,
                                                on_draft=lambda d, a: drafts.append((len(d), a)))
    # The prefill gives token 1; each later step accepts 4 drafts plus the target's own token (5 tokens),
    # so 19 tokens take 4 steps: 5 forward passes in all, the last draft cut short by the output's end.
    assert (tokens, steps) == (20, 5)
    assert drafts == [(4, 4)] * 4
    assert spent == pytest.approx(1 + 4 * (1 + 0.1 * 4))
    assert oracle.released == [7]


def test_a_draft_that_is_never_right_costs_a_pass_per_token():
    wrong = Wrong(k=3)
    tokens, steps, spent = replay_drafts.replay(wrong, 0, PROMPT, OUTPUT, cost=0.05)
    assert (tokens, steps) == (20, 20)  # one token per forward pass, as without speculation
    assert wrong.calls == 19
    assert spent == pytest.approx(1 + 19 * (1 + 0.05 * 3))  # and each step paid for 3 rejected drafts


def test_an_empty_output_replays_nothing():
    assert replay_drafts.replay(Wrong(k=3), 0, PROMPT, [], cost=0.05) == (0, 0, 0.0)


def test_read_greedy_reads_generate_s_json_lines(tmp_path):
    path = tmp_path / "greedy.jsonl"
    path.write_text(json.dumps({"model": "m", "question_id": 1, "category": "coding", "prompt": PROMPT,
                                "output": OUTPUT}) + "\n\n")
    model, rows = replay_drafts.read_greedy(path)
    assert model == "m"
    assert rows == [("coding", PROMPT, OUTPUT)]


def _greedy_file(tmp_path):
    """Two questions whose outputs repeat their prompts (so a copying drafter has something to copy), without a
    recorded model (the vocabulary is then taken from the token ids)."""
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    path = tmp_path / "greedy.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": category, "prompt": text + [2] + text,
                                        "output": text + text[:6]}) + "\n"
                            for i, category in enumerate(("coding", "writing"))))
    return path


def test_the_command_line_replays_a_freespec_plugin(tmp_path, monkeypatch, capsys):
    path = _greedy_file(tmp_path)
    monkeypatch.setattr(sys, "argv", ["replay_drafts.py", str(path), "copy", "-k", "4", "--memory",
                                      "--cost", "0.05", "--time", "--evict-mb", "0"])
    assert replay_drafts.main() == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:] if line.split()}
    assert set(lines) >= {"coding", "writing", "all", "proposer"}
    tok_per_fwd, modeled = float(lines["all"][0]), float(lines["all"][1])
    assert 1.0 < tok_per_fwd <= 5.0  # copy drafts the repeated text: more than one token per target pass
    assert 1.0 < modeled < tok_per_fwd  # the drafts' modeled cost takes some of it back
    assert "warm caches" in out


def test_the_command_line_needs_a_plugin_and_outputs(tmp_path, monkeypatch, capsys):
    path = _greedy_file(tmp_path)
    monkeypatch.setattr(sys, "argv", ["replay_drafts.py", str(path)])
    with pytest.raises(SystemExit):
        replay_drafts.main()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    monkeypatch.setattr(sys, "argv", ["replay_drafts.py", str(empty), "copy"])
    assert replay_drafts.main() == 2
    assert "no greedy outputs to replay" in capsys.readouterr().err


def test_the_copy_ceiling_drafts_from_the_occurrence_the_output_goes_on_with():
    # Token 5 occurs twice in the prompt; the output goes on as after the second: the ceiling copies that one.
    prompt, output = [5, 6, 7, 8, 0, 5, 9, 10, 11, 0], [5, 9, 10, 11, 12]
    ceiling = replay_drafts.CopyCeiling(k=4)
    ceiling.expect(prompt, output)
    drafts = []
    tokens, steps, _ = replay_drafts.replay(ceiling, 0, prompt, output, cost=0.0,
                                            on_draft=lambda d, a: drafts.append((d, a)))
    assert drafts == [([9, 10, 11, 0], 3)]  # three right, then the target's own 12
    assert (tokens, steps) == (5, 2)


def test_the_copy_ceiling_bounds_a_copying_plugin(tmp_path, monkeypatch, capsys):
    path = _greedy_file(tmp_path)

    def all_tok_per_fwd(plugin):
        monkeypatch.setattr(sys, "argv", ["replay_drafts.py", str(path), plugin, "-k", "4"])
        assert replay_drafts.main() == 0
        return float(next(line.split()[1] for line in capsys.readouterr().out.splitlines()
                          if line.startswith("all")))

    assert all_tok_per_fwd("copy-ceiling") >= all_tok_per_fwd("copy") > 1.0


class CharTokenizer:
    """A chat template that writes each message as ``<role>content``; a token per character."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def __call__(self, text, add_special_tokens):
        return {"input_ids": [ord(c) for c in text]}


def test_a_workload_run_replays_each_turn_with_the_conversation_before_it():
    from freespec.bench.workloads import build_workloads

    session = build_workloads(["code-edit"], 1, 2, 3000, 6000)[0].sessions[0]
    settings = {"model": "m", "workloads": [{"name": "code-edit"}, {"name": "chat", "skipped": "no data"}],
                "sessions": 1, "turns": 2, "source_chars": 3000, "context_chars": 6000}

    def record(config, turn, output, **extra):
        return {"config": config, "concurrency": 1, "workload": "code-edit", "session_id": session.session_id,
                "turn": turn, "output": output, "pass": "first", "round": 0, **extra}

    run = {"settings": settings, "requests": [
        record("none", 0, "FIRST ANSWER"), record("suffix", 0, "other"), record("none", 1, "SECOND"),
        record("none", 0, "again", round=1), record("none", 0, "restarted", **{"pass": "restart"})]}
    rows = replay_drafts._workload_turns(run, CharTokenizer())
    assert [(category, "".join(map(chr, output))) for category, _, output in rows] == [
        ("code-edit", "FIRST ANSWER"), ("code-edit", "SECOND")]
    second = "".join(map(chr, rows[1][1]))
    assert second == (f"<system>{session.system}<user>{session.turns[0]}<assistant>FIRST ANSWER"
                      f"<user>{session.turns[1]}<assistant>")
