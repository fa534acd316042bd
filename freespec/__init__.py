"""freespec: speculative-decoding proposers for stock vLLM.

The code lives in the top-level folders of the repository (``proposers/``,
``vllm_plugins/``, ...), installed as ``freespec.<folder>`` via setuptools
``package-dir``; this file only makes ``freespec`` a regular package.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vllm-freespec")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"
