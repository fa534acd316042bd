"""scripts/compare_configs.py: one config against another from a results.json, per category and round."""
from __future__ import annotations

import json
import sys

from script_loader import load_script


def test_ratios_per_category_pooled_and_by_round(tmp_path, monkeypatch, capsys):
    # a: 100 tokens a block; b: 50; block walls differ by round, so the ratio's interval is not a point.
    def row(config, category, concurrency, speeds):
        return {"config": config, "category": category, "concurrency": concurrency,
                "per_sample": [{"round": rd, "repeat": 0, "tok_per_s": v} for rd, v in enumerate(speeds)]}

    aggregates = [row(config, category, 1, [tokens / 10.0, tokens / 20.0])
                  for config, tokens in (("a", 100), ("b", 50)) for category in ("all", "x", "y")]
    aggregates.append(row("a", "x", 4, [999.0]))
    path = tmp_path / "results.json"
    texts = {("a", "x"): (1, 2), ("b", "x"): (0, 2), ("a", "y"): (2, 2), ("a", "all"): (3, 4), ("b", "all"): (0, 2)}
    for r in aggregates:  # as freespec bench counts them; b has none for y
        if (r["config"], r["category"]) in texts and r["concurrency"] == 1:
            r["text_identical"], r["text_compared"] = texts[(r["config"], r["category"])]
    path.write_text(json.dumps({"aggregates": aggregates}))
    monkeypatch.setattr(sys, "argv", ["compare_configs.py", str(path), "a", "b"])
    load_script("compare_configs").main()
    out = capsys.readouterr().out
    # (10+5)/(5+2.5); slowest a 5 over fastest b 5; a wrote none's text in 1 of 2 samples of x, b in none
    assert "| x | 2.000 | 1.000–4.000 | 2.000 2.000 | 1/2, 0/2 |" in out
    assert "| y | 2.000 | 1.000–4.000 | 2.000 2.000 | 2/2, – |" in out  # b has no outputs for y
    assert "| all | 2.000 | 1.000–4.000 | 2.000 2.000 | 3/4, 0/2 |" in out
