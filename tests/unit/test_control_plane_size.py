"""``ControlPlane`` stays small: its vote state is the vote book's (``core/votes.py``), its
session's the ``Session``'s. Counted on the source (AST): every ``self.x`` a method of the
class assigns is an attribute."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(10)

SOURCE = Path(__file__).resolve().parents[2] / "pccl_aio" / "_peer" / "session" / "control.py"
MAX_ATTRIBUTES = 20
MAX_LINES = 400


def attributes(source: str, cls: str) -> set[str]:
    """The names ``self.<name>`` assigned (plain, annotated, augmented, unpacked) in the
    methods of class ``cls``."""
    [node] = [n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.ClassDef) and n.name == cls]
    names: set[str] = set()
    for fn in node.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for stmt in ast.walk(fn):
            if isinstance(stmt, ast.Assign):
                targets = stmt.targets
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                targets = [stmt.target]
            else:
                continue
            for target in targets:
                for t in ast.walk(target):
                    if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                            and t.value.id == "self"):
                        names.add(t.attr)
    return names


def test_the_count_sees_every_form_of_assignment():
    src = ("class C:\n def __init__(self):\n  self.a = 1\n  self.b: int = 2\n"
           "  self.c, self.d = 3, 4\n  self.e = self.f = 5\n"
           " def g(self):\n  self.a += 1\n  self.h = 6\n  other.i = 7\n")
    assert attributes(src, "C") == {"a", "b", "c", "d", "e", "f", "h"}


def test_control_plane_has_at_most_20_attributes():
    names = attributes(SOURCE.read_text(encoding="utf-8"), "ControlPlane")
    assert len(names) <= MAX_ATTRIBUTES, sorted(names)


def test_control_module_has_at_most_400_lines():
    assert len(SOURCE.read_text(encoding="utf-8").splitlines()) <= MAX_LINES
