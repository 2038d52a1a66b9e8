"""The fenced code blocks of README.md and of the docs (``docs/**/*.md``) and the test
markers above them.

A marker is an HTML comment on the line right above a block's opening fence (invisible once
rendered); ``tests/process/test_readme.py`` runs every Python block accordingly:

* no marker: run once, as a program, with a master started by the test (``MASTER``);
* ``<!-- run: N peers ... -->``: run as N processes at once against that master;
* ``<!-- not run: REASON -->``: an API sketch, only compiled (keep these to a minimum).
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs, in a stable order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page(relative: str) -> Path:
    """A docs page by its path under ``docs/``."""
    return DOCS / relative

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_CLOSE = re.compile(r"^\s*```\s*$")
_HEADING = re.compile(r"^#+\s+(.*?)\s*$")
_COMMENT = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")
_RUN = re.compile(r"^run: (\d+) peers?\b")
_NOT_RUN = re.compile(r"^not run: (\S.*)$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block."""

    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    section: str  # the nearest heading above it
    note: str  # the HTML comment on the line right above the fence, or ""
    path: str = "README.md"  # the page, relative to the repository

    @property
    def not_run(self) -> str:
        """The reason given in a ``not run:`` marker, else ""."""
        m = _NOT_RUN.match(self.note)
        return m.group(1) if m else ""

    @property
    def peers(self) -> int:
        """How many processes run this block at once (1 unless a ``run: N peers`` marker)."""
        m = _RUN.match(self.note)
        return int(m.group(1)) if m else 1

    def check_note(self) -> None:
        """ValueError if the marker above a Python block is none of the known ones."""
        if self.note and not (_RUN.match(self.note) or _NOT_RUN.match(self.note)):
            raise ValueError(f"{self.path} line {self.line}: unknown marker {self.note!r} above a "
                             "code block (expected 'run: N peers ...' or 'not run: REASON')")


def blocks(text: str, path: str = "README.md") -> list[Block]:
    """Every fenced block of a Markdown text, in order; ValueError for an unclosed fence."""
    lines = text.splitlines()
    out: list[Block] = []
    section, i = "", 0
    while i < len(lines):
        heading, fence = _HEADING.match(lines[i]), _FENCE.match(lines[i])
        if heading:
            section = heading.group(1)
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not _CLOSE.match(lines[i]):
            i += 1
        if i == len(lines):
            raise ValueError(f"README line {start + 1}: code block never closed")
        note = _COMMENT.match(lines[start - 1]) if start else None
        code = textwrap.dedent("\n".join(lines[start + 1:i])) + "\n"
        out.append(Block(fence.group(2), code, start + 1, section,
                         note.group(1) if note else "", path))
        i += 1
    return out


def all_blocks() -> list[Block]:
    """Every block of the README and the docs."""
    return [b for p in pages() for b in blocks(p.read_text(), str(p.relative_to(ROOT)))]


def python_blocks() -> list[Block]:
    """The Python blocks of the README and the docs, each marker checked."""
    found = [b for b in all_blocks() if b.lang in ("python", "py")]
    for b in found:
        b.check_note()
    return found
