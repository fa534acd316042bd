"""scripts/compare_configs.py: one config against another from a results.json, per category and round."""
from __future__ import annotations

import json
import sys

from script_loader import load_script


def test_ratios_per_category_pooled_and_by_round(tmp_path, monkeypatch, capsys):
    requests, blocks = [], []
    # a: 100 tokens a block; b: 50; block walls differ by round, so the ratio's interval is not a point.
    for config, tokens in (("a", 100), ("b", 50)):
        for rd, wall in ((0, 10.0), (1, 20.0)):
            for category in ("x", "y"):
                requests.append({"config": config, "category": category, "round": rd, "concurrency": 1,
                                 "completion_tokens": tokens})
                blocks.append({"config": config, "category": category, "round": rd, "concurrency": 1,
                               "wall_s": wall})
    requests.append({"config": "a", "category": "x", "round": 0, "concurrency": 4, "completion_tokens": 999})
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"requests": requests, "blocks": blocks}))
    monkeypatch.setattr(sys, "argv", ["compare_configs.py", str(path), "a", "b"])
    load_script("compare_configs").main()
    out = capsys.readouterr().out
    assert "| x | 2.000 | 1.000–4.000 | 2.000 2.000 |" in out  # (10+5)/(5+2.5); slowest a 5 over fastest b 5
    assert "| all | 2.000 | 1.000–4.000 | 2.000 2.000 |" in out
