"""Every ``FREESPEC_*`` environment variable freespec reads, in one place.

Each is read when asked for (not at import), so a test or a launcher that sets one before the engine
starts is honoured. ``scripts/options_table.py`` lists them in docs/options.md from ``VARIABLES``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

# name -> what it does (docs/options.md is generated from this table)
VARIABLES = {
    "FREESPEC_CACHE": "root of freespec's cache: prepared models and the downloaded Spec-Bench questions "
                      "(default `~/.cache/freespec`)",
    "FREESPEC_QUESTIONS": "`freespec bench`: a question.jsonl to use when `--questions` is not given",
    "FREESPEC_QUESTIONS_URL": "`freespec bench`: where to download Spec-Bench's question.jsonl from (a mirror); "
                              "empty: never download",
    "FREESPEC_STATS_INTERVAL_S": "seconds between a worker's freespec statistics log lines "
                                 "(default: vLLM's stats interval, 10; 0 = never)",
    "FREESPEC_DISABLE_PATCHES": "comma-separated vLLM patch names not to apply (diagnosis only)",
    "FREESPEC_FORCE_TRITON": "`1`: run the Triton kernels on CPU tensors too (tests, with `TRITON_INTERPRET=1`)",
}


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``$FREESPEC_CACHE``, else ``~/.cache/freespec``."""
    return Path(_env(env).get("FREESPEC_CACHE") or "~/.cache/freespec").expanduser()


def questions_path(env: Mapping[str, str] | None = None) -> str | None:
    """``$FREESPEC_QUESTIONS``, or None when unset or empty."""
    return _env(env).get("FREESPEC_QUESTIONS") or None


def questions_url(default: str, env: Mapping[str, str] | None = None) -> str:
    """``$FREESPEC_QUESTIONS_URL`` when set (empty means never download), else ``default``."""
    return _env(env).get("FREESPEC_QUESTIONS_URL", default)


DEFAULT_STATS_INTERVAL_S = 10.0  # vLLM's own stats log interval (vllm.envs.VLLM_LOG_STATS_INTERVAL)


def stats_interval_s(env: Mapping[str, str] | None = None) -> float:
    """Seconds between statistics log lines: ``$FREESPEC_STATS_INTERVAL_S``, else vLLM's
    ``VLLM_LOG_STATS_INTERVAL``, else 10. ``0`` or less: never."""
    e = _env(env)
    for name in ("FREESPEC_STATS_INTERVAL_S", "VLLM_LOG_STATS_INTERVAL"):
        raw = e.get(name)
        if raw:
            try:
                return float(raw)
            except ValueError:
                continue
    return DEFAULT_STATS_INTERVAL_S


def disabled_patches(env: Mapping[str, str] | None = None) -> set[str]:
    """Patch names listed in ``$FREESPEC_DISABLE_PATCHES`` (comma-separated)."""
    return {p.strip() for p in _env(env).get("FREESPEC_DISABLE_PATCHES", "").split(",") if p.strip()}


def force_triton(env: Mapping[str, str] | None = None) -> bool:
    """``$FREESPEC_FORCE_TRITON=1``: Triton kernels on CPU tensors too."""
    return _env(env).get("FREESPEC_FORCE_TRITON") == "1"
