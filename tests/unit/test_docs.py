"""The docs stay findable: README is short and opens with a contents list of its own sections,
and every relative link in README.md, docs/ and deploy/ reaches a file and heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import ROOT

README = ROOT / "README.md"
README_MAX_LINES = 500  # issue 28: a map, not a book; issue 41: room for a section
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
FENCE = re.compile(r"^ *```.*?^ *```$", flags=re.S | re.M)
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks, where a link is a link."""
    return FENCE.sub("", text)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation but - and _ dropped, spaces -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of a Markdown file make, repeated ones numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        base = anchor(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    return [target for _, target in LINK.findall(prose(path.read_text()))]


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines, over {README_MAX_LINES}: move reference text to docs/ "
        "and link it from README's Documentation list."
    )


def test_the_readme_opens_with_a_contents_list_of_its_sections():
    text = README.read_text()
    sections = re.findall(r"^## (.+)$", prose(text), flags=re.M)
    assert sections[0] == "Contents", "README's first section is its contents list"
    body = text.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)", body, flags=re.M)
    assert listed == [anchor(s) for s in sections[1:]], (
        "README's contents list must name every section, in order",
        listed,
        sections,
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_is_closed(doc: Path):
    fences = [
        n
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        if line.lstrip().startswith("```")
    ]
    assert len(fences) % 2 == 0, f"{doc.relative_to(ROOT)}: a ``` fence is not closed: {fences}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(doc: Path):
    broken = []
    for target in links(doc):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if not where.exists():
            broken.append(f"{target}: no file {where}")
        elif fragment and where.suffix == ".md" and fragment not in anchors(where):
            broken.append(f"{target}: no heading with anchor #{fragment} in {where.name}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize(
    "heading, expected",
    [
        ("Fault tolerance: exactly once", "fault-tolerance-exactly-once"),
        ("What `bench` measures", "what-bench-measures"),
        ("MaxText's data keys", "maxtexts-data-keys"),
        ("Hostile peers, files and servers (issue 27)", "hostile-peers-files-and-servers-issue-27"),
        ("Fan-in and TLS", "fan-in-and-tls"),
    ],
)
def test_anchors_follow_githubs_rule(heading: str, expected: str):
    assert anchor(heading) == expected


PACKAGES = ("input_server", "client/input_client")
GENERATED = "client/input_client/_proto/"  # one row for the generated stubs


def module_table() -> list[str]:
    """The paths in the first column of docs/architecture.md's module table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Modules, one stage each\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)


def test_the_module_table_lists_every_module_once():
    rows = module_table()
    modules = sorted(
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "__pycache__" not in p.parts and not str(p.relative_to(ROOT)).startswith(GENERATED)
    )
    missing = [m for m in modules if m not in rows]
    gone = [r for r in rows if not (ROOT / r).exists()]
    twice = sorted({r for r in rows if rows.count(r) > 1})
    assert not (missing or gone or twice), (
        "docs/architecture.md, 'Modules, one stage each': one row per module, "
        f"`path` | what it owns. Missing: {missing}; no longer there: {gone}; twice: {twice}"
    )
    assert GENERATED in rows
