"""A served engine saves what it learned when it is stopped, and when it falls idle.

Stopped: `freespec serve` of `hybrid` with a `state_dir`, periodic saves off, one answer, then SIGTERM (as a
restart or a pod's stop sends it). With vLLM's default `--shutdown-timeout 0` the worker was killed before (or
during) its final save: the responses were lost; `freespec serve` now passes a timeout (vllm_plugins/vllm_cli.py).

Idle: periodic saves run on engine steps, and vLLM tells the worker a request finished only at the next step,
which an idle engine never takes; a server killed in a quiet spell lost its last answers however long ago they
came (three answers, then 40 s idle: its file held none). The adapter's idle save (vllm_plugins/idle_save.py)
writes them without a step."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from freespec.bench.errors import BenchError
from integration_tests.serving import chat, start_server

pytestmark = pytest.mark.integration

HOUR = 3600  # save_every_s: no periodic save within the test, so only the final one can write


def hybrid_server(model_path: str, tmp_path: Path, **sources):
    """`freespec serve` of `hybrid` with a new state directory: the server, the folder and the log's path."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    spec = {"plugin": "hybrid", "num_speculative_tokens": 4, "state_dir": str(state), **sources}
    log = tmp_path / "server.log"
    try:
        return start_server(model_path, spec, log), state, log
    except BenchError as e:
        pytest.fail(str(e))


def test_a_sigterm_stop_saves_the_state_dir(model_path, tmp_path):
    server, state, log = hybrid_server(model_path, tmp_path, suffix={"save_every_s": HOUR},
                                       recycle={"save_every_s": HOUR})
    try:
        assert chat(server, model_path, max_tokens=16)
        assert not [p for p in state.rglob("*") if p.is_file()], "a save before the stop: the test proves nothing"
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    assert "--shutdown-timeout" in text, text[-3000:]
    saved = sorted(p.relative_to(state).parts[0] for p in state.rglob("*") if p.is_file() and p.stat().st_size)
    assert saved == ["recycle", "suffix"], f"saved at the stop: {saved}\n{text[-3000:]}"


def responses_saved(state: Path) -> int:
    """Responses in the suffix source's log segments of ``state`` (every record read and checked)."""
    from freespec.proposers.learned.folder_log import EXT, read_segment

    return sum(len(read_segment(str(p), vocab_size=1 << 20, max_tokens=1 << 20, limit=1 << 30)[2])
               for p in (state / "suffix").rglob(f"*{EXT}"))


def test_an_idle_server_saves_its_last_answer_without_another_request_or_a_stop(model_path, tmp_path):
    server, state, log = hybrid_server(model_path, tmp_path, suffix={"save_every_s": 2})
    try:
        assert chat(server, model_path, max_tokens=16)
        deadline = time.monotonic() + 60  # idle_save.IDLE_S, then a save due within save_every_s
        while responses_saved(state) == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        saved = responses_saved(state)  # read while the server runs: no stop's final save counted
    finally:
        server.stop()
    assert saved == 1, log.read_text(errors="replace")[-3000:]
