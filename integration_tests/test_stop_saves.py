"""A served engine saves what it learned when it is stopped: `freespec serve` of `hybrid` with a `state_dir`,
periodic saves off, one answer, then SIGTERM (as a restart or a pod's stop sends it). With vLLM's default
`--shutdown-timeout 0` the worker was killed before (or during) its final save: the responses were lost;
`freespec serve` now passes a timeout (vllm_plugins/vllm_cli.py)."""
from __future__ import annotations

import pytest

from freespec.bench.errors import BenchError
from integration_tests.serving import chat, start_server

pytestmark = pytest.mark.integration

HOUR = 3600  # save_every_s: no periodic save within the test, so only the final one can write


def test_a_sigterm_stop_saves_the_state_dir(model_path, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    spec = {"plugin": "hybrid", "num_speculative_tokens": 4, "state_dir": str(state),
            "suffix": {"save_every_s": HOUR}, "recycle": {"save_every_s": HOUR}}
    log = tmp_path / "server.log"
    try:
        server = start_server(model_path, spec, log)
    except BenchError as e:
        pytest.fail(str(e))
    try:
        assert chat(server, model_path, max_tokens=16)
        assert not [p for p in state.rglob("*") if p.is_file()], "a save before the stop: the test proves nothing"
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    assert "--shutdown-timeout" in text, text[-3000:]
    saved = sorted(p.relative_to(state).parts[0] for p in state.rglob("*") if p.is_file() and p.stat().st_size)
    assert saved == ["recycle", "suffix"], f"saved at the stop: {saved}\n{text[-3000:]}"
