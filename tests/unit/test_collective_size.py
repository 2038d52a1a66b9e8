"""``Collective`` keeps what every kind shares and each data path its own: counted on the
source (AST), every ``self.x`` a method of the class (or of its bases in the same package)
assigns is an attribute."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_control_plane_size import attributes

pytestmark = pytest.mark.timeout(10)

DATA = Path(__file__).resolve().parents[2] / "pccl_aio" / "_peer" / "data"
MAX_ATTRIBUTES = 20
CLASSES = [("collective.py", "Collective"), ("pipeline.py", "Pipeline"),
           ("paths/ring.py", "RingPath"), ("paths/quant.py", "QuantRingPath"),
           ("paths/gather.py", "GatherPath")]


def _bases(source: str, cls: str) -> list[str]:
    [node] = [n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.ClassDef) and n.name == cls]
    return [b.id for b in node.bases if isinstance(b, ast.Name)]


def counted(path: str, cls: str) -> set[str]:
    """The attributes of ``cls`` and of the base classes it takes from its own package."""
    source = (DATA / path).read_text(encoding="utf-8")
    names = attributes(source, cls)
    for base in _bases(source, cls):
        for sibling in (DATA / path).parent.glob("*.py"):
            text = sibling.read_text(encoding="utf-8")
            if f"class {base}" in text:
                names |= counted(str(sibling.relative_to(DATA)), base)
    return names


def test_the_count_takes_in_base_classes_of_the_package():
    assert {"_scratch", "plan", "own_first"} <= counted("paths/quant.py", "QuantRingPath")


@pytest.mark.parametrize("path,cls", CLASSES)
def test_each_class_has_at_most_20_attributes(path, cls):
    names = counted(path, cls)
    assert len(names) <= MAX_ATTRIBUTES, sorted(names)


def test_the_collective_holds_no_kind_specific_state():
    names = attributes((DATA / "collective.py").read_text(encoding="utf-8"), "Collective")
    assert not names & {"plan", "_small", "_slots", "_steps", "_scratch", "_expected",
                        "_own_first", "_inbox", "_outbox"}, sorted(names)
