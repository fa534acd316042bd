"""freespec's Prometheus metrics, written in the process where vLLM runs the proposer.

vLLM serves ``/metrics`` from its API server, while the proposer runs in the engine's worker
process. Metrics cross that gap through prometheus_client's multiprocess mode, which vLLM
supports (``vllm/v1/metrics/prometheus.py``): when ``PROMETHEUS_MULTIPROC_DIR`` is set before vLLM
starts, every process writes its metrics to files there and the API server's registry collects them
all (probe ``metrics_registry``). Patch ``prometheus_multiproc`` sets it when it is not set:
``freespec serve`` before vLLM starts, and freespec's general plugin in the API server of a plain
``vllm serve`` (``export_from_api_server``): vLLM loads general plugins while it builds its argument parser,
after prometheus_client is imported but before any metric exists (vLLM 0.30 to 0.33), so switching
prometheus_client's value class there is the same as setting the variable before the start. Where that is
not so, the plugin logs a warning with the one-line fix (``MULTIPROC_FIX``). Without prometheus_client, or
with ``FREESPEC_METRICS=0``, every call here does nothing.

Names follow vLLM's (``vllm:`` there, ``freespec:`` here; docs/metrics.md lists them); label values come
from bounded sets (the configured plugin, fixed reasons). Per step: a few increments on label children
bound once, no loop over tokens.
"""
from __future__ import annotations

import logging
import os
import sys

from freespec import settings

logger = logging.getLogger("freespec")

# Seconds a plugin takes per step; vLLM's steps run from about a millisecond (GPU) to a second (CPU).
PROPOSE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Why a plugin is off, as a bounded label: the circuit breaker's reasons (``adapter.CircuitBreaker``), and
# the front-end's at engine start (``patches``: the vLLM release is unsupported, or a seam moved).
MAX_SOURCES = 16  # distinct source labels per plugin; more are counted as "other"
FILE_EVENTS = ("save", "save_error", "merge")
OFF_REASONS = ("error", "over_budget", "stall", "trial_failed", "unsupported_vllm", "seam_moved")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# What an operator runs before ``vllm serve`` where freespec cannot set the variable itself.
MULTIPROC_FIX = "export PROMETHEUS_MULTIPROC_DIR=$(mktemp -d)"
# ``__main__`` modules that run vLLM's API server: the deprecated ``python -m vllm.entrypoints.openai.api_server``
# and vLLM's CLI (``vllm serve``; the console script's ``__main__`` is its own file, told by ``argv[0]``).
API_SERVER_MAINS = ("vllm.entrypoints.openai.api_server",)
CLI_MAINS = ("vllm.entrypoints.cli.main",)

_families: dict | None = None
_multiproc_dir = None  # the TemporaryDirectory export_from_api_server made (removed when the process exits)


def _make_families() -> dict:
    """The metric families, created once per process (prometheus_client refuses a name registered twice)."""
    from prometheus_client import Counter, Gauge, Histogram

    return {
        "draft_tokens": Counter("freespec:draft_tokens", "Draft tokens a plugin proposed.", ["plugin", "source"]),
        "accepted_tokens": Counter(
            "freespec:accepted_tokens", "Draft tokens the target model accepted.", ["plugin", "source"]
        ),
        "source_seconds": Counter(
            "freespec:source_seconds", "Seconds the plugin took to propose, by source (under the plugin's own name: "
            "its time outside its sources, all of it for a one-source plugin).", ["plugin", "source"],
        ),
        "steps": Counter(
            "freespec:steps", "Engine steps the plugin was asked for drafts, with and without a draft.",
            ["plugin", "drafted"],
        ),
        "propose_seconds": Histogram(
            "freespec:propose_seconds", "Seconds the plugin took to propose, per step.", ["plugin"],
            buckets=PROPOSE_BUCKETS,
        ),
        "errors": Counter("freespec:errors", "Steps (or releases) in which the plugin raised.", ["plugin"]),
        "enabled": Gauge(
            "freespec:plugin_enabled", "1 while the plugin drafts, 0 while its circuit breaker keeps it off.",
            ["plugin"], multiprocess_mode="min",
        ),
        "disabled": Counter(
            "freespec:plugin_disabled", "Times the circuit breaker switched the plugin off, by reason.",
            ["plugin", "reason"],
        ),
        "token_cost": Gauge(
            "freespec:token_cost", "The policy's bar: accepted tokens a draft token must bring to be drafted.",
            ["plugin"], multiprocess_mode="mostrecent",
        ),
        "file_events": Counter(
            "freespec:state_file_events", "Persisted-state work: saves, failed saves and merges of replicas' files.",
            ["plugin", "event"],
        ),
        "step_fit": Gauge(
            "freespec:step_time_fit_seconds", "The policy's step-time fit: base seconds and seconds per token.",
            ["plugin", "term"], multiprocess_mode="mostrecent",
        ),
    }


def families() -> dict | None:
    """The process's metric families, or None when metrics are off (``FREESPEC_METRICS=0``, no prometheus_client)."""
    global _families
    if not settings.metrics_enabled():
        return None
    if _families is None:
        try:
            _families = _make_families()
        except ImportError:
            return None
    return _families


def exported() -> bool:
    """Whether this process's metrics reach the API server's ``/metrics`` (prometheus_client multiprocess mode)."""
    try:
        from prometheus_client import values
    except ImportError:
        return False
    return bool(getattr(values.ValueClass, "_multiprocess", False))


def api_server_process(argv: list[str] | None = None, main_module: str | None = None) -> bool:
    """Whether this process is the API server of ``vllm serve`` or ``python -m vllm.entrypoints.openai.api_server``.

    Not a multiprocessing child (vLLM's engine core and workers are; they inherit the variable), and started as
    one of vLLM's server commands. ``argv`` and ``main_module`` (``__main__``'s module name) default to this
    process's.
    """
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return False
    argv = sys.argv if argv is None else argv
    if main_module is None:
        main_module = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)
    if main_module in API_SERVER_MAINS:
        return True
    cli = main_module in CLI_MAINS or (bool(argv) and os.path.basename(argv[0]) == "vllm")
    return cli and list(argv[1:2]) == ["serve"]


def metrics_created() -> bool:
    """Whether a prometheus_client metric exists in the default registry (its value class is then fixed).

    True when the registry cannot be read (a prometheus_client without ``_collector_to_names``): the caller
    then leaves the variable to the operator.
    """
    from prometheus_client import REGISTRY
    from prometheus_client.metrics import MetricWrapperBase

    collectors = getattr(REGISTRY, "_collector_to_names", None)
    if collectors is None:
        return True
    return any(isinstance(c, MetricWrapperBase) for c in list(collectors))


def export_from_api_server() -> str:
    """Patch ``prometheus_multiproc`` in the general plugin: in vLLM's API server, a fresh ``PROMETHEUS_MULTIPROC_DIR``.

    What it did, as a word: ``set`` (a fresh directory, removed when the API server exits; the engine's
    processes inherit it), ``already`` (set by the operator, ``freespec serve`` or vLLM), ``off``
    (``FREESPEC_METRICS=0`` or no prometheus_client), ``not_api_server`` (the engine's processes, offline
    ``LLM``, other launchers: nothing to do), ``too_late`` (a metric already exists in the API server, so its
    multiprocess mode is decided: one warning naming ``MULTIPROC_FIX``).
    """
    global _multiproc_dir
    if MULTIPROC_ENV in os.environ or MULTIPROC_ENV.lower() in os.environ:
        return "already"
    if not settings.metrics_enabled():
        return "off"
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        return "off"
    if not api_server_process():
        return "not_api_server"
    values = sys.modules.get("prometheus_client.values")
    if values is not None and (metrics_created() or not hasattr(values, "get_value_class")):
        logger.warning(
            "freespec: freespec:* metrics will not reach this server's /metrics: prometheus_client metrics existed "
            "before freespec's plugin loaded, too late to turn on multiprocess mode. Fix: run `%s` before "
            "`vllm serve` (or start it as `freespec serve`); docs/metrics.md", MULTIPROC_FIX)
        return "too_late"
    import tempfile

    _multiproc_dir = tempfile.TemporaryDirectory(prefix="freespec-metrics-")
    os.environ[MULTIPROC_ENV] = _multiproc_dir.name
    if values is not None:
        # prometheus_client picks its value class at import; no metric exists yet, so picking it again now is
        # what importing it with the variable set would have done.
        values.ValueClass = values.get_value_class()
    logger.info("freespec: PROMETHEUS_MULTIPROC_DIR=%s set in vLLM's API server, so freespec:* metrics from the "
                "engine's workers reach /metrics (patch prometheus_multiproc)", _multiproc_dir.name)
    return "set"


def refused(plugin: str, reason: str) -> None:
    """The front-end dropped speculation at engine start (in the API server): the plugin never runs."""
    f = families()
    if f is not None:
        f["enabled"].labels(plugin).set(0)
        f["disabled"].labels(plugin, reason).inc()


class PluginMetrics:
    """One adapter's metrics: label children bound once, so a step costs a few increments."""

    def __init__(self, plugin: str) -> None:
        f = families()
        self.on = f is not None
        if not self.on:
            return
        # source: where the drafted tokens came from (Proposer.draft_sources); the plugin for one-source plugins.
        self._plugin = plugin
        self._f = f
        self._draft = f["draft_tokens"].labels(plugin, plugin)
        self._accepted = f["accepted_tokens"].labels(plugin, plugin)
        self._by_source: dict[str, tuple] = {}
        self._file_events = {e: f["file_events"].labels(plugin, e) for e in FILE_EVENTS}
        self._file_seen = {e: 0 for e in FILE_EVENTS}
        self._with = f["steps"].labels(plugin, "yes")
        self._without = f["steps"].labels(plugin, "no")
        self._seconds = f["propose_seconds"].labels(plugin)
        self._own_seconds = f["source_seconds"].labels(plugin, plugin)
        self._errors = f["errors"].labels(plugin)
        self._enabled = f["enabled"].labels(plugin)
        self._disabled = {r: f["disabled"].labels(plugin, r) for r in OFF_REASONS}
        self._token_cost = f["token_cost"].labels(plugin)
        self._fit = {t: f["step_fit"].labels(plugin, t) for t in ("base", "per_token")}
        self._last_cost: float | None = None
        self._enabled.set(1)
        if not exported():
            logger.info("freespec: metrics for plugin %r are kept in this process only; to see them on vLLM's "
                        "/metrics, run `%s` before starting vLLM (freespec serve and the plugin in `vllm serve` do it "
                        "themselves; docs/metrics.md)", plugin, MULTIPROC_FIX)

    def step(self, draft_tokens: int, accepted_tokens: int, drafted: bool, seconds: float | None,
             draft_by: dict[str, int] | None = None, accepted_by: dict[str, int] | None = None,
             seconds_by: dict[str, float] | None = None) -> None:
        """One engine step: tokens drafted now, tokens of the last drafts accepted, the plugin's time (None: skipped).

        ``draft_by``/``accepted_by``/``seconds_by``: the same tokens and seconds split by source, for plugins
        that name their sources; the seconds not spent in a source go to the plugin's own name.
        """
        if not self.on:
            return
        self._add(0, draft_tokens, draft_by)
        self._add(1, accepted_tokens, accepted_by)
        (self._with if drafted else self._without).inc()
        if seconds is None:
            return
        self._seconds.observe(seconds)
        own = seconds
        for source, s in (seconds_by or {}).items():
            if source != self._plugin:
                self._source(source)[2].inc(s)
                own -= s
        if own > 0:
            self._own_seconds.inc(own)

    def _add(self, which: int, total: int, by_source: dict[str, int] | None) -> None:
        """Count drafted (``which`` 0) or accepted (1) tokens, under the plugin or split by source."""
        if by_source is None:
            if total:
                (self._draft, self._accepted)[which].inc(total)
            return
        for source, n in by_source.items():
            self._source(source)[which].inc(n)

    def _source(self, source: str) -> tuple:
        """The (drafted, accepted, seconds) children of a source label; at most MAX_SOURCES, then "other"."""
        children = self._by_source.get(source)
        if children is None:
            label = source if len(self._by_source) < MAX_SOURCES else "other"
            children = (self._f["draft_tokens"].labels(self._plugin, label),
                        self._f["accepted_tokens"].labels(self._plugin, label),
                        self._f["source_seconds"].labels(self._plugin, label))
            self._by_source[source] = children
        return children

    def file_events(self, counts: dict[str, int]) -> None:
        """The plugin's persisted-state counts so far (``Proposer.file_events``): exported as increments."""
        if not self.on:
            return
        for event, total in counts.items():
            seen = self._file_seen.get(event)
            if seen is not None and total > seen:
                self._file_events[event].inc(total - seen)
                self._file_seen[event] = total

    def error(self) -> None:
        if self.on:
            self._errors.inc()

    def switched(self, enabled: bool, reason: str = "") -> None:
        """The circuit breaker switched the plugin on or off (``reason``: one of ``OFF_REASONS``, when off)."""
        if not self.on:
            return
        self._enabled.set(1 if enabled else 0)
        if not enabled:
            self._disabled[reason].inc()

    def token_cost(self, cost: float | None) -> None:
        """The policy's bar for this step (None: the plugin's fixed bar; not exported)."""
        if self.on and cost is not None and cost != self._last_cost:
            self._last_cost = cost
            self._token_cost.set(cost)

    def step_fit(self, fit: tuple[float, float] | None) -> None:
        """The policy's step-time fit (base seconds, seconds per token), when identified."""
        if self.on and fit is not None:
            self._fit["base"].set(fit[0])
            self._fit["per_token"].set(fit[1])
