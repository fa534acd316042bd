"""Write docs/options.md: every plugin option and every ``FREESPEC_*`` environment variable.

The option tables come from the pydantic ``Options`` model of each plugin freespec registers
(``freespec.proposers.registry``) and from the front-end's own keys (``vllm_plugins/frontend.py``);
the environment variables from a scan of the package and script sources, described by
``ENV_DESCRIPTIONS`` below. Generated, so the page cannot drift from the code:
``tests/test_options_table.py`` fails when docs/options.md differs from this script's output.

    python scripts/options_table.py           # rewrite docs/options.md
    python scripts/options_table.py --check   # exit 1 if docs/options.md is stale
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from freespec.settings import VARIABLES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "options.md"
# The folders that install as freespec.<folder>, and the user-facing scripts beside them.
SCANNED_DIRS = ("freespec", "vllm_plugins", "proposers", "scorers", "kernels", "cli", "scripts")
SCANNED_SUFFIXES = (".py", ".sh")
# This file names every variable in ENV_DESCRIPTIONS, so the scan skips it.
SELF = Path(__file__).name
ENV_PATTERN = re.compile(r"\bFREESPEC_[A-Z0-9_]+\b")

# One line per variable the code reads, from freespec/settings.py.
ENV_DESCRIPTIONS: dict[str, str] = VARIABLES


def _type_name(annotation: Any) -> str:
    """A JSON-ish name for a field's type, as a user writes the value in the speculative config."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (tuple, list):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {_type_name(inner[0])}" if inner else "list"
    if origin is dict or annotation is dict:
        return "object"
    if annotation is typing.Any:
        return "any"
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(annotation, getattr(annotation, "__name__",
                                                                                          str(annotation)))


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def _bounds(field: FieldInfo) -> str:
    """The field's declared numeric and length bounds ("1 ≤ x ≤ 8", "length 1–32")."""
    low = high = None
    low_strict = high_strict = False
    min_len = max_len = None
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            low = m.ge
        elif isinstance(m, annotated_types.Gt):
            low, low_strict = m.gt, True
        elif isinstance(m, annotated_types.Le):
            high = m.le
        elif isinstance(m, annotated_types.Lt):
            high, high_strict = m.lt, True
        elif isinstance(m, annotated_types.MinLen):
            min_len = m.min_length
        elif isinstance(m, annotated_types.MaxLen):
            max_len = m.max_length
    parts = []
    if low is not None and high is not None:
        parts.append(f"{_number(low)} {'<' if low_strict else '≤'} x {'<' if high_strict else '≤'} {_number(high)}")
    elif low is not None:
        parts.append(f"{'>' if low_strict else '≥'} {_number(low)}")
    elif high is not None:
        parts.append(f"{'<' if high_strict else '≤'} {_number(high)}")
    if min_len is not None or max_len is not None:
        if min_len is not None and max_len is not None:
            parts.append(f"length {min_len}–{max_len}")
        elif min_len is not None:
            parts.append(f"length ≥ {min_len}")
        else:
            parts.append(f"length ≤ {max_len}")
    return ", ".join(parts)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, tuple):
        value = list(value)
    return f"`{_number(value)}`" if isinstance(value, int) and not isinstance(value, bool) else f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def option_rows(options_cls: type[BaseModel]) -> list[tuple[str, str, str, str, str]]:
    """(name, type, default, bounds, description) for every field of a plugin's options model."""
    return [
        (f"`{name}`", _cell(_type_name(field.annotation)), _cell(_default(field)), _cell(_bounds(field)),
         _cell(field.description or ""))
        for name, field in options_cls.model_fields.items()
    ]


def plugin_options() -> dict[str, type[BaseModel]]:
    """Short name -> options model of each plugin freespec itself registers (third-party ones left out)."""
    from freespec.proposers.registry import available_plugins, load_proposer_class

    return {name: load_proposer_class(name).Options
            for name, target in sorted(available_plugins().items()) if target.startswith("freespec.")}


def config_keys() -> list[tuple[str, str, str, str, str]]:
    """The keys of a ``{"plugin": ...}`` config that are not a plugin's options (vllm_plugins/frontend.py)."""
    from freespec.vllm_plugins.frontend import MAX_SPECULATIVE_TOKENS, VLLM_KEYS

    rows = [("`plugin`", "str", "required", "",
             'a registered plugin name (tables below) or `"package.module:Class"`')]
    for key in VLLM_KEYS:
        if key == "num_speculative_tokens":
            rows.append((f"`{key}`", "int", "required", f"1 – {MAX_SPECULATIVE_TOKENS}",
                         "the most draft tokens per request and step (vLLM's own field, K)"))
        else:
            rows.append((f"`{key}`", "", "", "", "vLLM's own field"))
    from freespec.vllm_plugins.adapter_options import AdapterOptions

    rows.extend(option_rows(AdapterOptions))
    return rows


def scan_env(root: Path = ROOT) -> dict[str, list[str]]:
    """``FREESPEC_*`` name -> the source files (relative paths) that mention it."""
    found: dict[str, set[str]] = {}
    for folder in SCANNED_DIRS:
        for path in sorted((root / folder).rglob("*")):
            if (path.suffix not in SCANNED_SUFFIXES or not path.is_file() or "__pycache__" in path.parts
                    or path.name == SELF):
                continue
            for name in set(ENV_PATTERN.findall(path.read_text(encoding="utf-8", errors="replace"))):
                found.setdefault(name, set()).add(path.relative_to(root).as_posix())
    return {name: sorted(files) for name, files in sorted(found.items())}


class UndocumentedVariable(ValueError):
    """A ``FREESPEC_*`` variable is read in the sources but has no line in ENV_DESCRIPTIONS."""


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def render(root: Path = ROOT) -> str:
    """The whole of docs/options.md."""
    env = scan_env(root)
    missing = sorted(set(env) - set(ENV_DESCRIPTIONS))
    if missing:
        raise UndocumentedVariable(
            f"{', '.join(missing)} read in {', '.join(sorted({f for m in missing for f in env[m]}))} "
            "but not described in scripts/options_table.py ENV_DESCRIPTIONS"
        )
    header = ("option", "type", "default", "bounds", "description")
    out = [
        "# Options and environment variables",
        "",
        "<!-- Generated by scripts/options_table.py from the plugins' pydantic models; do not edit by hand:",
        "     run `python scripts/options_table.py` after changing an option or an environment variable. -->",
        "",
        "Every key goes in one speculative-config dict, on the command line or in Python:",
        "",
        "```bash",
        ("vllm serve MODEL --speculative-config '{\"plugin\": \"hybrid\", \"num_speculative_tokens\": 8, "
         "\"min_support\": 0.3}'"),
        "```",
        "",
        ("(`freespec serve` on CPU machines, with the same arguments; in Python, "
         "`LLM(MODEL, speculative_config={...})`.) An unknown plugin, an unknown option or a value out of bounds "
         "stops vLLM at start with a message naming the field. Checks between fields (for example `max_match` "
         "≥ `min_match`, a `datastore` that exists) are in each model's validators and name the field too."),
        "",
        "## Keys of every config",
        "",
        *_table(header, config_keys()),
    ]
    for name, options_cls in plugin_options().items():
        rows = option_rows(options_cls)
        out += ["", f"## `{name}`", ""]
        out += _table(header, rows) if rows else ["No options."]
    from freespec.proposers.suffix_tree import SuffixOptions

    out += ["", "## `hybrid`'s `suffix` source (`\"suffix\": {...}`)", "",
            *_table(header, option_rows(SuffixOptions))]
    out += [
        "",
        "## Environment variables",
        "",
        *_table(("variable", "read in", "description"),
                [(f"`{name}`", ", ".join(f"`{f}`" for f in files), _cell(ENV_DESCRIPTIONS[name]))
                 for name, files in env.items()]),
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/options.md differs; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC.relative_to(ROOT)} is stale: run python scripts/options_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
