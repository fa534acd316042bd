"""scripts/fleet_sync_cost.py's pure parts: its arguments, the ratios against the smallest fleet, the table and
the verdict on issue 87's aim (the runs themselves are a measurement: results/fleet-sync-zen3)."""
from __future__ import annotations

import pytest
from script_loader import load_script

fleet = load_script("fleet_sync_cost")


def row(backend: str, writers: int, cpu: float, read: float) -> dict:
    return {"backend": backend, "writers": writers, "window_s": 60.0, "bg_cpu_s_min": cpu * 0.9,
            "engine_cpu_s_min": cpu * 0.1, "cpu_s_min": cpu, "read_mb_min": read, "written_mb_min": 1.0,
            "work": "w"}


def test_defaults_are_the_issues_and_quick_is_a_small_run():
    a = fleet.parse_args([])
    assert a.backends == ["snapshots", "folder-log", "redis"] and a.writers == [2, 8, 32]
    assert (a.seconds, a.rate, a.tokens, a.store) == (60.0, 20.0, 200, 10_000)
    q = fleet.parse_args(["--quick"])
    assert q.writers == [2] and q.seconds <= 5 and q.store < a.store


@pytest.mark.parametrize("bad", [["--writers", "1"], ["--rate", "0"], ["--save-every", "-1"]])
def test_bad_arguments_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        fleet.parse_args(bad)
    assert "error" in capsys.readouterr().err


def test_ratios_are_against_the_smallest_fleet_of_the_same_backend():
    rows = fleet.with_ratios([row("snapshots", 8, 7.0, 56.0), row("snapshots", 2, 1.0, 8.0),
                              row("redis", 2, 2.0, 1.0), row("redis", 32, 2.2, 1.0), row("x", 2, 0.0, 0.0)])
    got = {(r["backend"], r["writers"]): (r["cpu_x"], r["read_x"]) for r in rows}
    assert got[("snapshots", 8)] == (7.0, 7.0) and got[("snapshots", 2)] == (1.0, 1.0)
    assert got[("redis", 32)] == pytest.approx((1.1, 1.0))
    assert got[("x", 2)] == (None, None)


def test_table_has_a_line_a_row_and_the_verdict_says_how_far_from_the_aim():
    rows = fleet.with_ratios([row("snapshots", 2, 1.0, 8.0), row("snapshots", 32, 36.0, 250.0),
                              row("redis", 2, 2.0, 1.0), row("redis", 32, 2.2, 1.1)])
    text = fleet.table(rows)
    assert len(text.splitlines()) == 2 + 4 and "| snapshots | 32 | 60 |" in text and "36.00x" in text
    snapshots, redis = fleet.verdicts(rows)
    assert "36.00x" in snapshots and "31.25x" in snapshots and "24.0x past the aim" in snapshots
    assert redis.startswith("redis: 32 writers against 2") and "within the aim" in redis
    assert fleet.verdicts([row("redis", 2, 1.0, 1.0)]) == []


def test_per_minute():
    assert fleet.per_minute(3.0, 30.0) == 6.0
