"""scripts/pearl_stats.py: pearl's stats lines in a server log, split into one-request and batched windows."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pearl_stats.py"
_spec = importlib.util.spec_from_file_location("pearl_stats", SCRIPT)
pearl_stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pearl_stats)
read_stats, summarise = pearl_stats.read_stats, pearl_stats.summarise


def line(**counters):
    return f"(Worker pid=1) INFO 11-22 05:00:00 [pearl.py:1] freespec: pearl {counters!r}"


def test_windows_are_split_by_rows_per_step_and_a_restarted_server_starts_over():
    log = "\n".join([
        "unrelated line",
        line(steps=10, rows=10, step_wait=0.5, idle=2.0, hits=4, chains=8, chain_tokens=24, placement="process"),
        line(steps=30, rows=30, step_wait=1.5, idle=6.0, hits=12, chains=28, chain_tokens=84),
        line(steps=40, rows=70, step_wait=2.5, idle=6.5, hits=20, chains=60, chain_tokens=164),  # 4 rows a step
        "freespec: pearl {not a dict",
        line(steps=5, rows=5, step_wait=0.1, idle=1.0, hits=1, chains=5, chain_tokens=10),  # a new server
    ])
    stats = read_stats(log)
    assert len(stats) == 4
    s = summarise(stats)
    # A server's first line counts from start-up: left out.
    assert s["c1"]["steps"] == 20 and s["c1"]["target_wait_ms"] == 50.0 and s["c1"]["draft_idle_ms"] == 200.0
    assert s["batched"] == {**s["batched"], "steps": 10, "rows_per_step": 4.0, "target_wait_ms": 100.0,
                            "draft_idle_ms": 50.0, "hits_per_row": 0.2, "mean_chain": 2.5}
