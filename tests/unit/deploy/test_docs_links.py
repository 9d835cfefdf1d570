"""Every relative link in the repository's Markdown resolves: the file (or folder) it names is part of
the tree, and a ``#anchor`` into a Markdown file names one of its headings (GitHub's heading ids).

Links are read as GitHub reads them: relative to the linking file, or to the repository root when they
start with ``/`` (which is how a section stitched into BENCHMARKS.md from docs/ links the same file
from both places). Absolute URLs (``https:``, ``mailto:``) are not checked: no network here. Text in
code blocks and code spans is not a link."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[3]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # [text], one level of nested brackets
    r"\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"  # (dest or <dest>
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"  # optional title)
)
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
HTML_ID = re.compile(r"<[a-z][^>]*?\s(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def tree_files(repo: Path) -> set[str]:
    """Paths (POSIX, relative) of the working tree that a clone would have: tracked files plus
    untracked ones git does not ignore (a file being added counts; runs/ and venvs do not)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return {f for f in out.split("\0") if f and (repo / f).exists()}


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        lines.append((number, line))
    return lines


def links(text: str) -> list[tuple[int, str]]:
    """(line number, destination) of every link and image of a Markdown text."""
    found: list[tuple[int, str]] = []
    for number, line in outside_fences(text):
        line = CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line)
        for pattern in (INLINE_LINK, REFERENCE_DEF, HTML_LINK):
            for m in pattern.finditer(line):
                dest = m.group(1).strip()
                if dest.startswith("<") and dest.endswith(">"):
                    dest = dest[1:-1]
                found.append((number, dest))
    return found


def github_slug(heading: str) -> str:
    """The id GitHub gives a heading: its text without markup, lower-cased, punctuation other than
    ``-`` and ``_`` dropped, spaces turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    text = text.strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every id a reader can link to in a Markdown file: its headings' (GitHub numbers repeats
    ``-1``, ``-2``...) and explicit HTML ids."""
    ids: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in outside_fences(text):
        m = ATX_HEADING.match(line)
        if m:
            slug = github_slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            ids.add(slug if n == 0 else f"{slug}-{n}")
        ids.update(HTML_ID.findall(line))
    return ids


def broken_links(repo: Path, files: set[str]) -> list[str]:
    """One line per link of a Markdown file in ``files`` that names nothing in ``files``, or a
    heading its target does not have."""
    folders = {p.as_posix() for f in files for p in Path(f).parents}
    problems: list[str] = []
    for source in sorted(f for f in files if f.endswith(".md")):
        text = (repo / source).read_text(encoding="utf-8")
        for number, dest in links(text):
            if not dest or SCHEME.match(dest) or dest.startswith("//"):
                continue
            path_part, _, anchor = dest.partition("#")
            path_part = unquote(path_part.split("?", 1)[0])
            where = f"{source}:{number}: ({dest})"
            if path_part:
                base = Path() if path_part.startswith("/") else Path(source).parent
                target = (repo / base / path_part.lstrip("/")).resolve()
                try:
                    rel = target.relative_to(repo.resolve()).as_posix()
                except ValueError:
                    problems.append(f"{where} points outside the repository")
                    continue
            else:
                rel = source
            if rel not in files and rel not in folders:
                exists = (repo / rel).exists()
                problems.append(
                    f"{where}: {rel} " + ("is ignored by git or untracked" if exists else "does not exist")
                )
                continue
            if anchor and rel.endswith(".md") and rel in files:
                if unquote(anchor).lower() not in anchors((repo / rel).read_text(encoding="utf-8")):
                    problems.append(f"{where}: {rel} has no heading with id #{anchor}")
    return problems


@pytest.fixture(scope="module")
def repo_files() -> set[str]:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tree's file list comes from git")
    return tree_files(REPO)


def test_every_relative_link_in_the_docs_resolves(repo_files: set[str]) -> None:
    sources = [f for f in repo_files if f.endswith(".md")]
    assert "README.md" in sources and len(sources) > 10, sources
    problems = broken_links(REPO, repo_files)
    assert not problems, "dead links:\n" + "\n".join(problems)


def test_the_readme_links_into_itself_and_the_docs(repo_files: set[str]) -> None:
    """The README's quick links are anchors: they are checked, so there must be some."""
    dests = [d for _, d in links((REPO / "README.md").read_text(encoding="utf-8"))]
    assert sum(d.startswith("#") for d in dests) >= 5, dests
    assert sum(d.startswith("docs/") for d in dests) >= 5, dests


def test_the_checker_finds_what_is_dead(tmp_path: Path) -> None:
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "guide.md").write_text(
        '# Guide\n\n## Set-up (`make run`)\n\n## Set-up (`make run`)\n\n<a id="custom"></a>\n'
    )
    (tmp_path / "docs" / "sub" / "data.jsonl").write_text("{}\n")
    (tmp_path / "docs" / "ignored.log").write_text("on disk, not in the tree\n")
    (tmp_path / "README.md").write_text(
        "\n".join(
            [
                "[ok](docs/guide.md) [ok](docs/guide.md#set-up-make-run) [ok](docs/guide.md#set-up-make-run-1)",
                "[ok](./docs/sub/data.jsonl) [ok](docs/sub/) [ok](/docs/guide.md#custom) [ok](#readme)",
                "![ok](docs/sub/data.jsonl 'title') [ok](https://example.com/nowhere) [ok](<docs/guide.md>)",
                "`[not a link](nowhere.md)`",
                "```",
                "[not a link](nowhere.md)",
                "```",
                "[dead](docs/missing.md) [dead anchor](docs/guide.md#setup) [dead](docs/sub/data.json)",
                "[dead](../outside.md) [dead](docs/ignored.log)",
                "[ref]: docs/gone.md",
                '<img src="docs/none.png">',
                "# Readme",
            ]
        )
        + "\n"
    )
    (tmp_path / "docs" / "back.md").write_text("[ok](../README.md#readme) [dead](README.md)\n")
    files = {"README.md", "docs/guide.md", "docs/sub/data.jsonl", "docs/back.md"}
    problems = broken_links(tmp_path, files)
    dead = sorted(p.split(": (", 1)[1].split(")", 1)[0] for p in problems)
    assert dead == sorted(
        [
            "docs/missing.md",
            "docs/guide.md#setup",
            "docs/sub/data.json",
            "../outside.md",
            "docs/gone.md",
            "docs/none.png",
            "README.md",
            "docs/ignored.log",
        ]
    ), problems
    assert any("docs/ignored.log is ignored by git or untracked" in p for p in problems)


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Quickstart (CPU, no GPU needed)", "quickstart-cpu-no-gpu-needed"),
        ("GPU quickstart (`docker compose up`)", "gpu-quickstart-docker-compose-up"),
        ("CPU preset (SmolLM2-135M): 100 steps, `kill -9` of the whole tree at step 50, `--resume`",
         "cpu-preset-smollm2-135m-100-steps-kill--9-of-the-whole-tree-at-step-50---resume"),
        ("Float32 vs bfloat16 autocast on the CPU (SmolLM2-135M shape, 2 cores)",
         "float32-vs-bfloat16-autocast-on-the-cpu-smollm2-135m-shape-2-cores"),
        ("`llds_trainer` and [the spec](x.md)", "llds_trainer-and-the-spec"),
        ("What it does on this machine (measured)", "what-it-does-on-this-machine-measured"),
    ],
)  # fmt: skip
def test_github_heading_ids(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug
