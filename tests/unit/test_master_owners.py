"""Each of the master's components owns its state and reaches ``MasterState`` only through a
narrow Protocol: its code touches no private member of another object (checked on the AST).

``access.py`` is the one adapter that reads ``MasterState``'s privates, on the components'
behalf; ``state.py`` itself holds the components."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "pccl_aio" / "_master" / "core"
COMPONENTS = ["failover.py", "recovery.py", "joint.py", "collectives.py", "barrier.py",
              "topology.py"]


def foreign_privates(source: str) -> list[str]:
    """``x._name`` where ``x`` is not ``self``/``cls`` (``self._a._b`` included), and
    ``getattr``/``setattr``/``delattr`` with a private name: where and what."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("name", COMPONENTS)
def test_component_touches_no_private_member_of_another_object(name: str) -> None:
    assert foreign_privates((CORE / name).read_text()) == []


@pytest.mark.parametrize("planted", [
    "def f(st):\n    st._recovery = None\n",
    "class A:\n    def f(self):\n        return self._master._peers\n",
    "def f(st):\n    return getattr(st, '_owed')\n",
    "def f(st):\n    return st.admit()._gate\n",
])
def test_a_planted_private_access_is_found(planted: str) -> None:
    assert len(foreign_privates(planted)) == 1


def test_own_members_and_dunders_are_fine() -> None:
    source = ("class A:\n    def f(self, other):\n        self._x = other.__class__\n"
              "        return self._x, self.public._y is None or type(self).__name__\n")
    assert foreign_privates(source) == ["4: self.public._y"]
