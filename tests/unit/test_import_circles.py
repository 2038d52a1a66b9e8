"""No import circle in ``pccl_aio/``: module A importing B (even under ``TYPE_CHECKING`` or
inside a function) while B, directly or through others, imports A.

A circle marks two modules that know each other's insides; the remedy is a ``Protocol``
beside the consumer (``_peer/data/env.py``, ``_master/core/failover.py``'s ``Master``) or a
callable passed to a constructor. Read from the source (AST), so a type-only import counts.
Importing a submodule runs its package's ``__init__`` too; that edge is not counted (the
root ``__init__`` imports the public API by design), but importing a *name* from a package's
``__init__`` is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pccl_aio"

Graph = dict[str, set[str]]


def _exists(dotted: str) -> bool:
    base = PKG.parent.joinpath(*dotted.split("."))
    return any(c.exists() for c in (base.with_suffix(".py"), base.with_suffix(".pyx"),
                                    base / "__init__.py"))


def dotted(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def edges(source: str, here: str, is_package: bool, exists=_exists) -> set[str]:
    """The pccl_aio modules that module ``here`` (source text ``source``) imports."""
    package = here.split(".") if is_package else here.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pccl_aio."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not base.startswith("pccl_aio"):
                continue
            subs = [f"{base}.{a.name}" for a in node.names]
            mods = [s for s in subs if exists(s)]
            out.update(mods)
            if len(mods) < len(subs):  # a name defined in ``base`` itself
                out.add(base)
    out.discard(here)
    return out


def package_graph() -> Graph:
    return {dotted(p): edges(p.read_text(encoding="utf-8"), dotted(p), p.name == "__init__.py")
            for p in sorted(PKG.rglob("*.py"))}


def circles(graph: Graph) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle() -> None:
    graph = package_graph()
    assert len(graph) > 100  # the walk saw the package
    assert circles(graph) == []


def test_a_planted_circle_is_found() -> None:
    """The detector is not vacuous: a circle through a ``TYPE_CHECKING`` import and a
    ``from pkg import module`` is found; a chain without a back edge is not."""
    a = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    b = "from . import c\n"
    c = "def f():\n    from .a import A\n"
    known = {"pccl_aio.x.a", "pccl_aio.x.b", "pccl_aio.x.c"}
    graph = {name: edges(src, name, False, known.__contains__)
             for name, src in zip(sorted(known), (a, b, c), strict=True)}
    assert graph["pccl_aio.x.b"] == {"pccl_aio.x.c"}
    assert circles(graph) == [sorted(known)]
    graph["pccl_aio.x.c"] = set()
    assert circles(graph) == []


@pytest.mark.parametrize("line, expected", [
    ("from .. import _log", {"pccl_aio._log"}),           # a submodule: not the root
    ("from .. import Communicator", {"pccl_aio"}),         # a name of the root __init__
    ("import pccl_aio._wire.messages", {"pccl_aio._wire.messages"}),
    ("from numpy import add", set()),
])
def test_edges_read_each_import_form(line: str, expected: set[str]) -> None:
    assert edges(line + "\n", "pccl_aio._peer.m", False) == expected
