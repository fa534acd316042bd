"""``--configs`` entries: ``none``, vLLM's own methods, or a freespec plugin with JSON options.

``ngram-table``, ``suffix-table`` and ``draft_model-table`` are stock vLLM at its best under load: the method
with vLLM 0.32's batch-size table (``num_speculative_tokens_per_batch_size``, dynamic speculative decoding; see
``freespec.bench.batch_table``), the default table unless the options give one.

vLLM's own methods run as users get them: no freespec patch acts in their servers (``FREESPEC_FIX_VLLM`` is
cleared for them). ``NAME+fixes`` (``suffix+fixes``, ``ngram-table+fixes``) is the same method with
freespec's fixes of vLLM defects turned on for that server only (``FREESPEC_FIX_VLLM=all``).

A plugin's speculative config is checked here by the same rules ``vllm serve`` applies to it
(``freespec.vllm_plugins.frontend.translate``: option names and values, reserved keys), so a typo fails
before a server is started instead of minutes later in its log.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from freespec.bench.batch_table import TABLE_CONFIGS, TABLE_KEY, check_table, default_table
from freespec.bench.errors import ConfigSpecError
from freespec.proposers.registry import UnknownPluginError
from freespec.vllm_plugins.frontend import FreespecConfigError, translate

DEFAULT_CONFIGS = ("none", "ngram", "suffix", "hybrid")
BASELINE = "none"

# vLLM's own speculative methods that need no plugin; anything else is a
# freespec plugin name and goes into the speculative config as ``"plugin"``.
VLLM_METHODS = ("ngram", "suffix", "draft_model")
# vLLM 0.32 (vllm/config/speculative.py) fills prompt_lookup_min/max with 5 and
# 5 when neither is given; they are written out so the recorded config is
# complete. Override with e.g. ``ngram:{"prompt_lookup_min":2,"prompt_lookup_max":4}``.
NGRAM_DEFAULTS = {"prompt_lookup_max": 5, "prompt_lookup_min": 5}

# A stock method with freespec's fixes of vLLM defects (patches.VLLM_FIXES), e.g. ``suffix+fixes``.
FIXES_SUFFIX = "+fixes"
FIX_ENV = "FREESPEC_FIX_VLLM"
STOCK_ENV = {FIX_ENV: ""}  # a server of vLLM as users get it, whatever the shell running the benchmark sets
FIXES_ENV = {FIX_ENV: "all"}

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


@dataclass
class BenchConfig:
    label: str  # as the user wrote it; unique within a run
    name: str  # none | ngram | suffix | plugin name
    speculative_config: dict[str, Any] | None  # None for ``none``
    env: dict[str, str] = field(default_factory=lambda: dict(STOCK_ENV))  # set for this config's server only

    @property
    def is_baseline(self) -> bool:
        return self.speculative_config is None

    def path_option(self, key: str) -> str | None:
        """A plugin option that names a file or folder (``datastore``, ``state_dir``), when given as a string."""
        value = (self.speculative_config or {}).get(key)
        return value if isinstance(value, str) else None

    @property
    def method(self) -> str | None:
        """vLLM's method (``ngram``, ``suffix``, ...) for stock configs, table ones included; else None."""
        return (self.speculative_config or {}).get("method")


def split_config_list(text: str) -> list[str]:
    """Split ``none,ngram,copy:{"a":1,"b":2}`` at commas outside JSON braces and strings."""
    items: list[str] = []
    depth = 0
    in_string = False
    escaped = False
    current: list[str] = []
    for ch in text:
        if in_string:
            current.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    items.append("".join(current).strip())
    return [item for item in items if item]


def _options(spec: str, name: str, options_text: str) -> dict[str, Any]:
    options_text = options_text.strip()
    if not options_text:
        raise ConfigSpecError(
            f"config {spec!r}: nothing after ':'; write options as JSON, e.g. {name}:{{\"key\": 1}}"
        )
    try:
        options = json.loads(options_text)
    except json.JSONDecodeError as exc:
        raise ConfigSpecError(
            f"config {name!r}: options {options_text!r} are not valid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if not isinstance(options, dict):
        raise ConfigSpecError(
            f"config {name!r}: options must be a JSON object like {{\"key\": 1}}, got {type(options).__name__}"
        )
    return options


def parse_config_spec(spec: str, num_speculative_tokens: int) -> BenchConfig:
    """Turn one ``--configs`` entry into a BenchConfig.

    ``none``: no speculation. ``ngram`` / ``suffix`` / ``draft_model``: vLLM's methods. Anything else names
    a freespec plugin, checked by the front-end's rules. Options follow a colon as a JSON object
    (``copy:{"min_match":3}``) and are merged into the speculative config; they may override
    ``num_speculative_tokens``. The name chooses the method: options cannot name another. A spec that is a
    JSON object is a whole plugin config (``{"plugin": "package.module:Class"}``).
    """
    spec = spec.strip()
    if spec.startswith("{"):
        return _whole_plugin_config(spec, num_speculative_tokens)
    name, sep, options_text = spec.partition(":")
    name = name.strip()
    fixes = name.endswith(FIXES_SUFFIX)
    base = name.removesuffix(FIXES_SUFFIX)
    if not base or not _NAME_RE.match(base):
        raise ConfigSpecError(f"config {spec!r}: {name!r} is not a config name (e.g. none, ngram, suffix, copy)")
    options = _options(spec, name, options_text) if sep else {}
    if name == BASELINE:
        if options:
            raise ConfigSpecError(f"config {spec!r}: '{BASELINE}' (no speculation) takes no options")
        return BenchConfig(label=BASELINE, name=BASELINE, speculative_config=None)
    method = TABLE_CONFIGS.get(base, base)
    chooser = "method" if method in VLLM_METHODS else "plugin"
    if fixes and chooser == "plugin":
        raise ConfigSpecError(f"config {spec!r}: '{FIXES_SUFFIX}' is for vLLM's own methods ({', '.join(VLLM_METHODS)}); "
                              "a freespec plugin's server has the fixes already")
    if chooser in options:
        raise ConfigSpecError(f"config {spec!r}: option {chooser!r} is set by the config name; leave it out")
    sc: dict[str, Any] = {chooser: method, "num_speculative_tokens": num_speculative_tokens}
    if method == "ngram" and not ({"prompt_lookup_min", "prompt_lookup_max"} & options.keys()):
        sc.update(NGRAM_DEFAULTS)
    if base in TABLE_CONFIGS and TABLE_KEY not in options:
        sc[TABLE_KEY] = default_table(int(options.get("num_speculative_tokens", num_speculative_tokens)))
    if method == "draft_model" and "model" not in options:
        raise ConfigSpecError(
            f"config {spec!r}: {base} needs option 'model', the draft checkpoint, "
            f"e.g. {name}:{{\"model\": \"/path/to/draft\"}}"
        )
    sc.update(options)
    if chooser == "plugin":
        _check_plugin_config(spec, sc)
    elif TABLE_KEY in sc:
        problem = check_table(sc[TABLE_KEY])
        if problem:
            raise ConfigSpecError(f"config {spec!r}: {TABLE_KEY}: {problem}")
    env = dict(FIXES_ENV if fixes else STOCK_ENV)
    return BenchConfig(label=spec, name=name, speculative_config=sc, env=env)


def _check_plugin_config(spec: str, sc: dict[str, Any]) -> None:
    """A plugin's config checked by the front-end's rules, as `vllm serve` would check it, before any server."""
    try:
        translate(sc, None)
    except (FreespecConfigError, UnknownPluginError) as exc:
        raise ConfigSpecError(f"config {spec!r}: {exc}") from None


def _whole_plugin_config(spec: str, num_speculative_tokens: int) -> BenchConfig:
    """A whole freespec speculative config as JSON, ``{"plugin": "package.module:Class", ...}``: how a plugin
    named by its import path is compared (the colon of ``module:Class`` cannot go in ``name:{options}``)."""
    example = '{"plugin": "mypackage.drafts:MyProposer"}'
    try:
        options = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise ConfigSpecError(f"config {spec!r}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(options, dict) or not isinstance(options.get("plugin"), str):
        raise ConfigSpecError(f"config {spec!r}: a JSON config names its 'plugin', e.g. {example}")
    sc: dict[str, Any] = {"num_speculative_tokens": num_speculative_tokens, **options}
    _check_plugin_config(spec, sc)
    return BenchConfig(label=spec, name=options["plugin"], speculative_config=sc)


def parse_config_list(entries: Iterable[str], num_speculative_tokens: int) -> list[BenchConfig]:
    """Parse all ``--configs`` entries; the baseline ``none`` is put first (added if missing)."""
    configs: list[BenchConfig] = []
    seen: set[str] = set()
    for entry in entries:
        for item in split_config_list(entry):
            config = parse_config_spec(item, num_speculative_tokens)
            if config.label in seen:
                raise ConfigSpecError(f"config {config.label!r} is listed twice")
            seen.add(config.label)
            configs.append(config)
    if not configs:
        raise ConfigSpecError("no configs given")
    baseline = [c for c in configs if c.is_baseline]
    others = [c for c in configs if not c.is_baseline]
    if not baseline:
        baseline = [BenchConfig(label=BASELINE, name=BASELINE, speculative_config=None)]
    return baseline + others
