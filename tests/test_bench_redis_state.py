"""``freespec bench`` with a ``state_dir`` that is a Redis URL (``freespec/bench/state_dirs.py``): each server group
starts from a Redis emptied of freespec's learning, the replica pass shares that Redis with its first server, the
report names the backend, and no result file holds the URL's password. A real ``redis-server``
(``tests/redis_helpers.py``) and fake servers (no vLLM)."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from bench_helpers import fake_server_script
from redis_helpers import redis_missing, wait_until
from test_bench_run import parse_bench_args

from freespec.bench import server, serving
from freespec.bench.configs import parse_config_list
from freespec.bench.run import Target
from freespec.bench.state_dirs import backend, fresh_state, redacted_command
from freespec.bench.workloads import chat, runner
from freespec.cli import bench
from freespec.proposers.api import SHARED_SCOPE

pytestmark = pytest.mark.skipif(redis_missing() is not None, reason=str(redis_missing()))


def hybrid_target(url: str) -> Target:
    (config,) = [c for c in parse_config_list(["hybrid:" + json.dumps({"state_dir": url})], 8) if c.name == "hybrid"]
    return Target(config=config, model="m")


def learned(url: str) -> int:
    from freespec.proposers.learned.redis_stream import list_state

    return sum(s.records for s in list_state(url))


def test_a_group_starts_from_a_redis_emptied_of_what_freespec_learned(redis_server, capsys):
    from freespec.proposers.learned.redis_stream import RedisResponses

    b = RedisResponses(redis_server.url, fingerprint="sha256:t", vocab_size=100, max_responses=10, max_tokens=1000)
    b.add(SHARED_SCOPE, np.array([1, 2, 3]))
    assert b.wait_idle() and wait_until(lambda: learned(redis_server.url) == 1)
    b.close()
    target = hybrid_target(redis_server.url)
    assert fresh_state(target, [1], 0, "2026-12-07T22:00:00") is target  # the same URL: one Redis
    assert learned(redis_server.url) == 0
    out = capsys.readouterr().out
    assert "1 learned record(s) purged" in out and backend(target.config) == "redis"


def test_the_replica_pass_shares_the_redis_and_the_report_names_it_without_the_password(tmp_path, monkeypatch,
                                                                                       redis_server):
    monkeypatch.setattr(chat, "installed_data_files", lambda: [])
    script = fake_server_script(tmp_path, monkeypatch)
    commands = []

    def fake_command(model, port, config, options, cpu):
        commands.append(config.speculative_config)
        return [sys.executable, str(script), str(port), "plain", "--speculative-config",
                json.dumps(config.speculative_config)]

    monkeypatch.setattr(serving, "server_command", fake_command)
    monkeypatch.setattr(runner, "server_command", fake_command)
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)
    # a config's label is the text the operator wrote, so the password comes from the environment, not the URL
    url = f"redis://127.0.0.1:{redis_server.port}/0"
    redis_server.client().config_set("requirepass", "pw-s3cret")
    monkeypatch.setenv("FREESPEC_REDIS_PASSWORD", "pw-s3cret")
    out = tmp_path / "out"
    args = parse_bench_args(
        "--workload", "rag", "--model", "fake-model", "--configs", "hybrid:" + json.dumps({"state_dir": url}),
        "--sessions", "1", "--turns", "1", "--max-tokens", "4", "--warmup", "1", "--dtype", "float32",
        "--out", str(out), "--server-timeout", "60", "--repeat-traffic", "replica")
    assert bench.run(args) == 0
    assert [c["state_dir"] for c in commands if c is not None] == [url, url]  # the server and its replica
    report = (out / "results.md").read_text()
    assert "Learned state (`state_dir`): hybrid" in report and f": redis ({url})" in report
    results = (out / "results.json").read_text()
    assert "pw-s3cret" not in results + report and '"state_backend": "redis"' in results


def test_a_recorded_command_and_config_hide_a_redis_password():
    from freespec.bench.state_dirs import shown

    cmd = ["vllm", "--speculative-config", json.dumps({"state_dir": "rediss://u:p@ss:w@h:6380/1"})]
    assert "p@ss" not in " ".join(redacted_command(cmd)) and "rediss://u:***@h:6380/1" in redacted_command(cmd)[2]
    target = hybrid_target("redis://:pw@h:6379/0")
    assert shown(target.config)["state_dir"] == "redis://:***@h:6379/0"
    assert target.config.speculative_config["state_dir"] == "redis://:pw@h:6379/0"  # the server still gets it
