"""``freespec responses build``: choosing the prompts, refusing bad arguments before any engine starts, and the
store's raising save. The generation itself runs the real engine: integration_tests/test_hybrid_persistence.py."""
from __future__ import annotations

import json

import pytest
from freespec.cli.main import main
from freespec.cli.responses import MIN_PROMPT_CHARS, choose_prompts
from freespec.proposers.learned.response_store import ResponseStore, read_store

LONG = "x" * MIN_PROMPT_CHARS


def test_choose_prompts_keeps_the_first_distinct_long_enough_ones_in_order():
    texts = ["  a prompt that is long enough  ", "short", "a prompt that is long enough", LONG, "another long prompt here"]
    assert choose_prompts(texts, 10) == ["a prompt that is long enough", LONG, "another long prompt here"]
    assert choose_prompts(texts, 2) == ["a prompt that is long enough", LONG]
    assert choose_prompts(texts, 10, keep=lambda t: "another" not in t) == ["a prompt that is long enough", LONG]


def test_choose_prompts_stops_reading_at_the_limit():
    def endless():
        n = 0
        while True:
            n += 1
            yield f"{LONG} {n}"
    assert choose_prompts(endless(), 3) == [f"{LONG} 1", f"{LONG} 2", f"{LONG} 3"]


def prompts_file(tmp_path, texts) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t},
                                                     {"role": "assistant", "content": "an answer " * 5}]}) + "\n"
                            for t in texts))
    return str(path)


@pytest.mark.parametrize("extra, named", [
    (["--out", "/nonexistent-dir/r.bin"], "--out"),
    (["--out", "{tmp}/exists.bin"], "--force"),
    (["--out", "{tmp}/r.bin", "--max-tokens", "300", "--max-model-len", "256"], "--max-model-len"),
    (["--out", "{tmp}/r.bin", "--prompts", "{tmp}/missing.jsonl"], "missing.jsonl"),
    (["--out", "{tmp}/r.bin", "--model", "{tmp}/no-model"], "--model"),
    (["--out", "{tmp}/r.bin", "--roles", "system"], "--prompts"),
])
def test_bad_arguments_exit_2_naming_the_field(tmp_path, capsys, extra, named):
    (tmp_path / "exists.bin").write_bytes(b"")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    args = ["responses", "build", "--model", str(tmp_path / "model"),
            "--prompts", prompts_file(tmp_path, [LONG])]
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    for flag in ("--prompts", "--model"):  # a later value of the same flag replaces the one above
        if flag in extra:
            i = args.index(flag)
            del args[i:i + 2]
    assert main(args + extra) == 2
    assert named in capsys.readouterr().err


def test_limit_is_bounded_by_what_a_server_loads():
    with pytest.raises(SystemExit):
        main(["responses", "build", "--model", "m", "--prompts", "p.jsonl", "--out", "r.bin", "--limit", "10001"])


def test_store_save_writes_a_file_a_server_reads_and_raises_on_failure(tmp_path):
    store = ResponseStore(str(tmp_path / "r.bin"), fingerprint="sha256:v", vocab_size=100,
                          max_responses=10, max_tokens=100)
    store.add([1, 2, 3])
    store.add([4, 5])
    store.save()
    back = read_store(store.path, fingerprint="sha256:v", vocab_size=100, max_responses=10, max_tokens=100)
    assert [e.tokens.tolist() for e in back.entries] == [[1, 2, 3], [4, 5]]
    (tmp_path / "removed").mkdir()
    gone = ResponseStore(str(tmp_path / "removed" / "r.bin"), fingerprint="sha256:v", vocab_size=100,
                         max_responses=10, max_tokens=100)
    gone.add([1])
    (tmp_path / "removed").rmdir()
    with pytest.raises(OSError):
        gone.save()


@pytest.mark.parametrize("tail", [None, 0, 3])
def test_each_answer_is_stored_after_its_prompts_tail_as_a_server_learns_it(tmp_path, monkeypatch, tail):
    from freespec.proposers.suffix_tree import SuffixOptions
    from freespec.vllm_plugins import offline_answers

    answers = offline_answers.Answers(outputs=[[70, 71], [80]], prompts=[list(range(1, 21)), [5, 6]],
                                      vocab_size=100, fingerprint="sha256:v")
    monkeypatch.setattr(offline_answers, "greedy_answers", lambda *a, **k: answers)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    out = tmp_path / "r.bin"
    args = ["responses", "build", "--model", str(tmp_path / "model"), "--prompts", prompts_file(tmp_path, [LONG]),
            "--out", str(out)] + ([] if tail is None else ["--prompt-tail", str(tail)])
    assert main(args) == 0
    n = SuffixOptions().prompt_tail if tail is None else tail
    back = read_store(str(out), fingerprint="sha256:v", vocab_size=100, max_responses=10, max_tokens=100)
    assert [e.tokens.tolist() for e in back.entries] == [list(range(21 - n, 21)) + [70, 71], [5, 6][2 - min(n, 2):] + [80]]


def test_a_prompt_tail_beyond_the_sources_bound_is_refused():
    with pytest.raises(SystemExit):
        main(["responses", "build", "--model", "m", "--prompts", "p.jsonl", "--out", "r.bin", "--prompt-tail", "257"])
