"""A config with a state_dir is measured from an empty folder per server group (round, level): pure logic and
whole fake-server runs, no vLLM."""
from __future__ import annotations

import json
import os
import stat
import sys

from bench_helpers import fake_server_script

from freespec.bench import run, server, serving
from freespec.bench.configs import parse_config_list
from freespec.bench.state_dirs import fresh_state
from freespec.bench.workloads import chat, runner
from freespec.cli import bench
from test_bench_run import parse_bench_args

STARTED = "2026-12-03T19:52:07"


def hybrid_target(state_dir, label_extra=""):
    options = {"state_dir": str(state_dir), **({"min_support": 0.1} if label_extra else {})}
    (config,) = [c for c in parse_config_list(["hybrid:" + json.dumps(options)], 8) if c.name == "hybrid"]
    return run.Target(config=config, model="m")


def test_each_round_level_and_config_gets_its_own_new_private_folder(tmp_path, capsys):
    (tmp_path / "operators-own-file.bin").write_bytes(b"x")
    target = hybrid_target(tmp_path)
    folders = [fresh_state(target, [1], 0, STARTED).config.speculative_config["state_dir"],
               fresh_state(target, [1], 1, STARTED).config.speculative_config["state_dir"],
               fresh_state(target, [4], 0, STARTED).config.speculative_config["state_dir"],
               fresh_state(hybrid_target(tmp_path, "other"), [1], 0, STARTED).config.speculative_config["state_dir"]]
    assert len(set(folders)) == 4
    for folder in folders:
        assert os.path.dirname(folder) == str(tmp_path) and os.listdir(folder) == []
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert "round2-c1" in folders[1] and "20261203195207" in folders[0]
    assert (tmp_path / "operators-own-file.bin").read_bytes() == b"x"  # left alone
    assert target.config.speculative_config["state_dir"] == str(tmp_path)  # the run's config is not changed
    assert "state_dir for this group" in capsys.readouterr().out


def test_configs_without_a_folder_to_make_are_left_as_they_are(tmp_path, capsys):
    (none,) = parse_config_list(["none"], 8)
    plain = run.Target(config=none, model="m")
    assert fresh_state(plain, [1], 0, STARTED) is plain
    running = hybrid_target(tmp_path)
    running.base_url = "http://127.0.0.1:9"
    assert fresh_state(running, [1], 0, STARTED) is running  # not our server
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o500)
    target = hybrid_target(read_only)
    if os.geteuid() != 0:  # root may write anywhere
        assert fresh_state(target, [1], 0, STARTED) is target
        assert "no new state_dir folder could be made" in capsys.readouterr().out


def test_rounds_of_a_workload_run_never_share_a_folder_and_a_replica_shares_its_servers(tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "installed_data_files", lambda: [])
    script = fake_server_script(tmp_path, monkeypatch)
    commands = []

    def fake_command(model, port, config, options, cpu):
        commands.append(config.speculative_config)
        return [sys.executable, str(script), str(port), "plain"]

    monkeypatch.setattr(serving, "server_command", fake_command)
    monkeypatch.setattr(runner, "server_command", fake_command)
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    config = "hybrid:" + json.dumps({"state_dir": str(state)})
    args = parse_bench_args(
        "--workload", "rag", "--model", "fake-model", "--configs", config, "--sessions", "1", "--turns", "1",
        "--max-tokens", "4", "--warmup", "1", "--dtype", "float32", "--out", str(tmp_path / "out"),
        "--server-timeout", "60", "--repeat-traffic", "replica", "--rounds", "2")
    assert bench.run(args) == 0
    folders = [c["state_dir"] for c in commands if c is not None]
    # per round: the server, then its replica, in one folder; the rounds apart
    assert len(folders) == 4 and folders[0] == folders[1] and folders[2] == folders[3] and folders[0] != folders[2]
    assert sorted(os.listdir(state)) == sorted(os.path.basename(f) for f in {folders[0], folders[2]})
