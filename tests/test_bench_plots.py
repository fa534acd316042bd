"""The charts: speed-up per config at each load with its interval, and TPOT against load."""
from __future__ import annotations

import pytest
from bench_helpers import repeated_run, synthetic_run

from freespec.bench import plots
from freespec.bench.stats import aggregate

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def bars(monkeypatch):
    """The keyword arguments of every bar call."""
    import matplotlib.axes

    calls = []
    original = matplotlib.axes.Axes.bar
    monkeypatch.setattr(matplotlib.axes.Axes, "bar", lambda self, *a, **kw: calls.append((a, kw)) or original(self, *a, **kw))
    return calls


def _two_loads(run):
    requests, blocks = run()
    return (requests + [dict(r, concurrency=4) for r in requests],
            blocks + [dict(b, concurrency=4, wall_s=2 * b["wall_s"]) for b in blocks])


def test_speedup_chart_has_a_bar_per_load_for_each_config(tmp_path, bars):
    rows = aggregate(*_two_loads(synthetic_run))
    path = tmp_path / "results.png"
    assert plots.plot_speedup(rows, path)
    assert path.read_bytes()[:8] == PNG
    ((xs, values), kw), = bars  # one config besides none: one bar call, one bar per load
    assert len(xs) == 2 and values == [pytest.approx(0.8), pytest.approx(0.8)]  # the "all" rows' ratios
    assert "yerr" not in kw  # one measurement: no interval, no error bars
    only_baseline = [r for r in rows if r["config"] == "none"]
    assert not plots.plot_speedup(only_baseline, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_speedup_chart_error_bars_span_the_ratio_interval(tmp_path, bars):
    rows = aggregate(*repeated_run())
    assert plots.plot_speedup(rows, tmp_path / "results.png")
    (_, kw), = bars
    (below,), (above,) = kw["yerr"]
    ngram_all = next(r for r in rows if (r["config"], r["category"]) == ("ngram", "all"))
    assert below == pytest.approx(ngram_all["ratio"] - ngram_all["ratio_low"])
    assert above == pytest.approx(ngram_all["ratio_high"] - ngram_all["ratio"])


def test_tpot_chart_draws_every_config_against_load(tmp_path, monkeypatch):
    import matplotlib.axes

    lines = []
    original = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda self, *a, **kw: lines.append((a, kw)) or original(self, *a, **kw))
    requests, blocks = _two_loads(synthetic_run)
    for r in requests:
        r.update(ttft_s=0.1, tpot_s=0.01 * r["concurrency"], itl_s=[0.01])
    rows = aggregate(requests, blocks)
    path = tmp_path / "tpot.png"
    assert plots.plot_tpot(rows, path)
    assert path.read_bytes()[:8] == PNG
    assert [kw["label"] for _, kw in lines] == ["none", "ngram"]
    assert [list(a[1]) for a, _ in lines] == [[pytest.approx(10.0), pytest.approx(40.0)]] * 2
    assert not plots.plot_tpot(aggregate(*synthetic_run()), tmp_path / "none.png")  # no streamed timings
