"""The front page and the user docs stay short, and name a result by what it measured.

README.md is the operator's front page: at most 100 lines. docs/ says how to run, how to read and the latest
result, at most 2,500 lines in all; the history of how a figure was reached lives in results/. A result is
named by its folder (results/load-qwen), never by a run letter ("run BB", results/run-bb).
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 100
DOCS_MAX_LINES = 2500

# "run BB", "runs BG to BJ", "Run A" (not "runs C++"), and a results folder or path named by a letter.
RUN_LETTER = re.compile(r"\b[Rr]uns? [A-Z]{1,2}\b(?![+])|(?<![\w-])run-[a-z]{1,2}(?![\w-])")


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def run_letters(pages: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for match in RUN_LETTER.finditer(line):
                found.append(f"{page.relative_to(root)}:{number}: {match.group(0)}")
    return found


def test_readme_fits_in_100_lines():
    assert _line_count(ROOT / "README.md") <= README_MAX_LINES


def test_docs_fit_in_2500_lines():
    counts = {p.name: _line_count(p) for p in sorted((ROOT / "docs").glob("*.md"))}
    assert sum(counts.values()) <= DOCS_MAX_LINES, counts


def test_readme_and_docs_name_no_run_letters():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert run_letters(pages) == []


def test_the_run_letter_check_catches_each_spelling(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("as run BB showed\nRuns BG to BJ\n[x](../results/run-bb/results.md)\n"
                    "vLLM runs C++ kernels; run-to-run noise; results/load-qwen; a run of 39 requests\n")
    assert run_letters([page], tmp_path) == [
        "page.md:1: run BB", "page.md:2: Runs BG", "page.md:3: run-bb"]
