"""Named patch ``prometheus_multiproc``: a multiprocess directory for Prometheus, so metrics written in the
engine's worker processes reach ``/metrics`` (``metrics.export_from_api_server``)."""
from __future__ import annotations

import freespec.vllm_plugins.metrics as metrics


def install_prometheus_multiproc() -> str:
    """Named patch ``prometheus_multiproc`` in the general plugin (``freespec serve`` applies it before vLLM starts):
    in the API server of a plain ``vllm serve``, what ``freespec serve`` does. Returns what it did
    (``metrics.export_from_api_server``)."""
    return metrics.export_from_api_server()
