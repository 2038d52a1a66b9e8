"""Tests go through doors, not windows: no file under ``tests/`` reads or plants a private
member of a peer's ``Communicator``, ``ControlPlane``, ``DataPlane`` or ``SharedStateSync``, nor
one of the master's ``MasterState`` components and tables (checked on the AST).

A test uses the public API, the sans-IO cores (``MasterState.access`` on the master's side),
or the documented test hook ``pccl_aio._peer.testing`` (``control_plane(comm)``,
``data_plane(comm)``, ``crash(comm)``, ``record_sends(comm)``...), the one module that reaches
into a communicator on a test's behalf.

The private names checked are those the classes define (every ``self._x`` a method assigns
and every ``_method``), read from their source, together with the ones a test used to reach
for (``NAMED``, ``MASTER``); ``x._name`` is flagged unless ``x`` is ``self`` or ``cls`` (a
test's own members), and so is ``getattr``/``setattr``/``delattr``/``monkeypatch.setattr``
with such a name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PKG = ROOT / "pccl_aio"
CLASSES = {  # the peer's classes whose privates stay private, and where each is defined
    "Communicator": PKG / "_peer" / "communicator.py",
    "ControlPlane": PKG / "_peer" / "session" / "control.py",
    "DataPlane": PKG / "_peer" / "data" / "dataplane.py",
    "SharedStateSync": PKG / "_peer" / "state" / "sync.py",
}
# What tests reached for before the hook existed: checked even if a class stops defining it.
NAMED = frozenset({
    "_control", "_data", "_sync", "_measure", "_obs", "_metrics", "_reduce", "_topology",
    "_keys", "_loop", "_writer", "_up", "_session", "_tasks", "_links", "_bandwidth", "_ring",
    "_report",
})
# MasterState's components and tables (its ``access`` reads them); named, not read from the
# class, because some of its names (``_votes``, ``_settle``) recur in other classes a test
# owns or patches (``Story``, the model checker's fault injection).
MASTER = frozenset({"_peers", "_colls", "_sync", "_topo", "_fo", "_admission"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def members(source: str, cls: str) -> set[str]:
    """The private members of class ``cls`` in ``source``: its ``_methods`` (and
    properties) and every ``self._x`` its methods assign."""
    [node] = [n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.ClassDef) and n.name == cls]
    names: set[str] = set()
    for fn in node.body:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if _private(fn.name):
                names.add(fn.name)
            for t in ast.walk(fn):
                if (isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)
                        and isinstance(t.value, ast.Name) and t.value.id == "self"
                        and _private(t.attr)):
                    names.add(t.attr)
    return names


def guarded() -> frozenset[str]:
    found: set[str] = set()
    for cls, path in CLASSES.items():
        found |= members(path.read_text(encoding="utf-8"), cls)
    return frozenset(found | NAMED | MASTER)


def reaches(source: str, names: frozenset[str]) -> list[str]:
    """``line: expression`` of each access to one of ``names`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and _is_attr_call(node.func) and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _is_attr_call(func: ast.expr) -> bool:
    """``getattr``, ``setattr``, ``delattr`` or ``<anything>.setattr``/``.delattr``."""
    if isinstance(func, ast.Name):
        return func.id in ("getattr", "setattr", "delattr")
    return isinstance(func, ast.Attribute) and func.attr in ("setattr", "delattr")


def test_the_guarded_names_are_found_in_the_classes() -> None:
    names = guarded()
    assert {"_control", "_data", "_sync", "_measure", "_keys"} <= members(
        CLASSES["Communicator"].read_text(encoding="utf-8"), "Communicator")
    assert {"_links", "_bandwidth"} <= members(
        CLASSES["DataPlane"].read_text(encoding="utf-8"), "DataPlane")
    master = PKG / "_master" / "core" / "state.py"
    assert members(master.read_text(encoding="utf-8"), "MasterState") >= MASTER
    assert names >= NAMED | MASTER and len(names) > len(NAMED | MASTER)


@pytest.mark.parametrize("planted", [
    "x = comm._control.colls\n",
    "comm._data.abort()\n",
    "assert master.state._peers[1].voted_topology\n",
    "monkeypatch.setattr(comm, '_data', None)\n",
    "getattr(comms[0], '_sync')\n",
    "def f(c):\n    return c.other._links\n",
])
def test_a_planted_private_access_is_found(planted: str) -> None:
    assert len(reaches(planted, guarded())) == 1


def test_own_members_and_the_hook_are_fine() -> None:
    source = ("from pccl_aio._peer import testing\n"
              "class Fuzzer:\n    def f(self):\n        self._gen = 1\n        return self._gen\n"
              "def g(comm):\n    return testing.data_plane(comm).links, comm.peer_id\n")
    assert reaches(source, guarded()) == []


def test_no_test_reads_or_plants_a_private_member_of_a_peer_or_master() -> None:
    names = guarded()
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 50  # the tests were found
    found = {}
    for path in files:
        hits = reaches(path.read_text(encoding="utf-8"), names)
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}, ("use the public API, MasterState.access or pccl_aio._peer.testing: "
                         f"{found}")
