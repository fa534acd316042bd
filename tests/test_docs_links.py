"""The user docs link only what exists: every relative markdown link in README.md, docs/*.md and the results
pages points to a file or folder of this checkout, and every `results/...` path the docs name is there.

results/ keeps only what the docs quote (results/README.md); a folder deleted from it, or a doc page
renamed, must not leave a dead link behind.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS_PAGES = sorted((ROOT / "results").rglob("*.md"))

# [text](target) or [text](target "title"); images (![alt](target)) match too.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# A path into results/ as the docs write it (in a link, in backticks or in a command), not bench_results/
# and not a file of an older commit (`git show COMMIT:results/...`).
RESULTS_PATH = re.compile(r"(?<![\w./:-])(?:\.\./)?(results/[\w.*/-]*)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _lines(path: Path):
    """(line number, text) of a markdown file, fenced code blocks left out of the link check."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def _is_relative(target: str) -> bool:
    return not (re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith(("#", "/")))


def dead_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    dead = []
    for page in pages:
        for number, line in _lines(page):
            for match in LINK.finditer(line):
                target = match.group(1)
                if not _is_relative(target):
                    continue
                path = target.split("#", 1)[0].split("?", 1)[0]
                if path and not (page.parent / path).exists():
                    dead.append(f"{page.relative_to(root)}:{number}: {target}")
    return dead


def missing_results_paths(pages: list[Path], root: Path = ROOT) -> list[str]:
    missing = []
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for match in RESULTS_PATH.finditer(line):
                path = match.group(1).rstrip(".,;:)/")
                if path == "results":
                    continue
                if not any(root.glob(path)) and not (root / path).exists():
                    missing.append(f"{page.relative_to(root)}:{number}: {path}")
    return missing


def test_the_pages_are_found():
    assert (ROOT / "README.md") in DOCS and len(DOCS) > 5
    assert (ROOT / "results" / "README.md") in RESULTS_PAGES


@pytest.mark.parametrize("page", DOCS + RESULTS_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert dead_links([page]) == []


def test_every_results_path_the_docs_name_exists():
    assert missing_results_paths(DOCS) == []


def test_results_holds_no_code_and_stays_small():
    files = [p for p in (ROOT / "results").rglob("*") if p.is_file()]
    code = [str(p.relative_to(ROOT)) for p in files if p.suffix in {".py", ".sh", ".patch"}]
    assert code == []
    assert sum(p.stat().st_size for p in files) <= 5 * 2**20


def test_the_checks_catch_a_dead_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](missing.md#part) [web](https://example.com) [here](#top)\n"
                    "```\n[in code](not-checked.md)\n```\n"
                    "see `results/no-such-run/results.md` and bench_results/anything\n")
    assert dead_links([page], tmp_path) == ["page.md:1: missing.md#part"]
    assert missing_results_paths([page], tmp_path) == ["page.md:5: results/no-such-run/results.md"]
