"""docs/options.md is exactly what scripts/options_table.py generates, and the generator misses nothing."""
from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


gen = load_script("options_table")


def test_docs_options_md_equals_the_generators_output():
    assert (ROOT / "docs" / "options.md").read_text(encoding="utf-8") == gen.render(), (
        "docs/options.md is stale: run python scripts/options_table.py"
    )


def test_every_freespec_variable_in_the_sources_has_a_description():
    found = gen.scan_env()
    assert "FREESPEC_STATS_INTERVAL_S" in found  # the scan reaches the package sources
    assert sorted(set(found) - set(gen.ENV_DESCRIPTIONS)) == []


def test_an_undescribed_variable_fails_the_generator(tmp_path, monkeypatch):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "new.py").write_text('os.environ.get("FREESPEC_NOT_DESCRIBED_YET")\n')
    assert gen.scan_env(tmp_path) == {"FREESPEC_NOT_DESCRIBED_YET": ["cli/new.py"]}
    with pytest.raises(gen.UndocumentedVariable, match="FREESPEC_NOT_DESCRIBED_YET.*cli/new.py"):
        gen.render(tmp_path)


def test_every_registered_plugin_and_every_option_is_in_the_page():
    from freespec.proposers.registry import available_plugins

    text = gen.render()
    options = gen.plugin_options()
    own = {name for name, target in available_plugins().items() if target.startswith("freespec.")}
    assert set(options) == own and {"copy", "hybrid"} <= own
    for name, options_cls in options.items():
        section = text.split(f"## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        for field in options_cls.model_fields:
            assert f"| `{field}` |" in section, (name, field)


def test_rows_carry_type_default_and_bounds_from_the_model():
    from typing import Literal, Optional

    from pydantic import BaseModel, Field

    class Example(BaseModel):
        depth: int = Field(2, ge=1, le=100_000, description="how | deep")
        share: float = Field(0.5, gt=0, lt=1)
        path: str = Field(..., description="a path")
        names: tuple[str, ...] = Field(("a", "b"), min_length=1, max_length=4)
        mode: Literal["x", "y"] = "x"
        extra: Optional[dict] = None  # noqa: UP045 - the spelling the plugins' models use

    rows = {row[0]: row[1:] for row in gen.option_rows(Example)}
    assert rows["`depth`"] == ("int", "`2`", "1 ≤ x ≤ 100,000", "how \\| deep")
    assert rows["`share`"] == ("float", "`0.5`", "0 < x < 1", "")
    assert rows["`path`"] == ("str", "required", "", "a path")
    assert rows["`names`"] == ("list of str", '`["a", "b"]`', "length 1–4", "")
    assert rows["`mode`"] == ('"x" or "y"', '`"x"`', "", "")
    assert rows["`extra`"] == ("object or null", "`null`", "", "")


def test_the_policy_key_lists_its_values_and_default():
    from freespec.vllm_plugins.adapter_options import AdapterOptions

    rows = {row[0]: row for row in gen.config_keys()}
    assert rows["`policy`"][2] == f'`"{AdapterOptions().policy}"`'
    assert rows["`num_speculative_tokens`"][2] == "required"


PACKAGE_FOLDERS = ("freespec", "vllm_plugins", "proposers", "scorers", "kernels", "cli")


def test_architecture_md_names_every_module_under_its_folder():
    """docs/architecture.md lists the modules that exist: a new module without its line fails here."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    for folder in PACKAGE_FOLDERS:
        assert f"\n`{folder}/` (" in modules, f"docs/architecture.md has no `{folder}/` paragraph"
        section = re.split(r"\n`[a-z_]+/` \(", modules.split(f"\n`{folder}/` (", 1)[1], maxsplit=1)[0]
        missing = [p.name for p in sorted((ROOT / folder).glob("*.py"))
                   if p.name != "__init__.py" and f"`{p.name}`" not in section]
        assert missing == [], f"docs/architecture.md does not list {folder}/{missing}"
