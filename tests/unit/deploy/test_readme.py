"""The README's figures cannot drift from the files they come from: every number in its Results table
appears in the file that row links to, and every step time it quotes is BENCHMARKS.md's. The licence
and citation files say what pyproject.toml says."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?")
"""A figure: 0.650, 49.5, 4.6e-3, 2.4 (of 2.4x); not the 90 of p90."""
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)[^)]*\)")


def section(text: str, title: str) -> str:
    parts = text.split(f"\n## {title}\n", 1)
    assert len(parts) == 2, f"no '## {title}' section"
    return parts[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the first Markdown table in ``text``, as stripped cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) > 2 and set(lines[1].replace("|", "").strip()) <= set("-: "), lines[:2]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]


def appears(figure: str, text: str) -> bool:
    return re.search(rf"(?<![\d.]){re.escape(figure)}(?!\.?\d)", text) is not None


def missing_figures(figure_cell: str, source_cell: str, base: Path) -> list[str]:
    """The numbers of ``figure_cell`` that none of the files linked in ``source_cell`` contains (or,
    for a cell without numbers, the cell's text itself)."""
    targets = [base / dest for dest in LINK.findall(source_cell)]
    assert targets, f"no link in {source_cell!r}"
    text = "\n".join(t.read_text(encoding="utf-8") for t in targets)
    numbers = NUMBER.findall(figure_cell)
    if not numbers:
        return [] if figure_cell.lower() in text.lower() else [figure_cell]
    return [n for n in numbers if not appears(n, text)]


def test_every_results_figure_is_in_the_file_it_links() -> None:
    rows = table_rows(section(README, "Results"))
    assert len(rows) >= 8
    problems = []
    for what, figure, source in rows:
        missing = missing_figures(figure, source, REPO)
        if missing:
            problems.append(f"{what!r}: {missing} not in {source}")
    assert not problems, "\n".join(problems)


def test_the_figure_check_catches_a_drifted_number(tmp_path: Path) -> None:
    (tmp_path / "B.md").write_text(
        "| step | 49.5 / 76.9 s |\nratio **1.025**; 4.6e-3; 2.4x; not measured yet.\n"
    )
    link = "[B.md](B.md)"
    assert missing_figures("49.5 s median, 76.9 s p90; 1.025; 4.6e-3; 2.4x", link, tmp_path) == []
    assert missing_figures("49.6 s median", link, tmp_path) == ["49.6"]
    assert missing_figures("49 s", link, tmp_path) == ["49"]  # 49.5 is not 49
    assert missing_figures("1.02", link, tmp_path) == ["1.02"]  # nor is 1.025 1.02
    assert missing_figures("not measured yet", link, tmp_path) == []
    assert missing_figures("measured at last", link, tmp_path) == ["measured at last"]


def test_the_readme_quotes_the_step_time_benchmarks_md_measured() -> None:
    benchmarks = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    quoted = re.findall(r"(\d+(?:\.\d+)?) s/step", README)
    assert quoted
    assert [q for q in quoted if not appears(q, benchmarks)] == []


def test_license_and_citation_match_pyproject() -> None:
    license_text = (REPO / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == {"text": "Apache-2.0"}
    assert "Apache License\n                           Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0"
    assert citation["version"] == PYPROJECT["project"]["version"]
    assert citation["license"] == "Apache-2.0"
    arxiv = {ref["doi"].removeprefix("10.48550/arXiv.") for ref in citation["references"]}
    assert arxiv == {"2512.04220", "2503.09516"}
    for arxiv_id in arxiv:
        assert f"arXiv:{arxiv_id}" in section(README, "Citation")
