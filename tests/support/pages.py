"""The project's pages as tests read them: README.md and docs/*.md, their sections and their
fenced code blocks (commands a test runs or parses as written)."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

README = (ROOT / "README.md").read_text()


def page(path: str) -> str:
    """The text of the page at `path` in the repository (`docs/pod.md`)."""
    return (ROOT / path).read_text()


def section(title: str, text: str = README) -> str:
    """The section `## TITLE` of `text`, to the next `## ` heading or the end."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)


def block(title: str, needle: str, text: str = README) -> str:
    """The one fenced block of section `title` that holds `needle` (fails if not one)."""
    (found,) = [code for _, code in code_blocks(section(title, text)) if needle in code]
    return found
