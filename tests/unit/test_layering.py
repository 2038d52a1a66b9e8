"""The sans-IO core never touches the event loop, sockets or clocks.

Checked on the source (AST), directly and through the sibling modules it imports, so the
modules stay usable from a plain unit test, a thread, or another event loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pccl_aio"
SANS_IO = ["_errors", "_types", "_messages", "_framing", "_master_state", "_ring",
           "_kernels_py", "_ops", "_buffers"]
IN_PROGRESS = {"_ops", "_kernels_py"}  # being written by another helper right now
FORBIDDEN = {"asyncio", "socket", "time", "selectors"}


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(absolute top-level modules, sibling pccl_aio modules) imported anywhere in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    absolute: set[str] = set()
    siblings: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                absolute.add(alias.name.split(".")[0])
                if alias.name.startswith("pccl_aio."):
                    siblings.add(alias.name.split(".")[1])
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 0:
                absolute.add(mod.split(".")[0])
                if mod == "pccl_aio":
                    siblings.update(a.name for a in node.names)
                elif mod.startswith("pccl_aio."):
                    siblings.add(mod.split(".")[1])
            elif node.level == 1:
                if mod:
                    siblings.add(mod.split(".")[0])
                else:  # from . import x, y
                    siblings.update(a.name for a in node.names)
            else:
                raise AssertionError(f"{path.name}: relative import beyond the package")
    return absolute, siblings


def closure(name: str) -> dict[str, set[str]]:
    """module -> its absolute imports, for ``name`` and every .py sibling it pulls in."""
    seen: dict[str, set[str]] = {}
    todo = [name]
    while todo:
        mod = todo.pop()
        path = PKG / f"{mod}.py"
        if mod in seen or mod == "__init__" or not path.exists():
            continue  # compiled extensions (_kernels) have no Python source to check
        absolute, siblings = imports(path)
        seen[mod] = absolute
        todo.extend(siblings)
    return seen


@pytest.mark.parametrize("name", SANS_IO)
def test_sans_io_module_imports_no_io(name: str) -> None:
    path = PKG / f"{name}.py"
    if not path.exists():
        if name in IN_PROGRESS:
            pytest.skip(f"{path.name} is not written yet")
        pytest.fail(f"sans-IO module {path} is missing")
    bad = {mod: sorted(absolute & FORBIDDEN) for mod, absolute in closure(name).items()
           if absolute & FORBIDDEN}
    assert bad == {}, f"{name} reaches I/O modules: {bad}"


def test_checker_sees_every_import_form(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import os.path, asyncio.events\n"
        "from time import monotonic\n"
        "from . import _a, _b\n"
        "from ._c import x\n"
        "from pccl_aio import _d\n"
        "import pccl_aio._e\n"
        "def f():\n    import socket\n",
        encoding="utf-8")
    absolute, siblings = imports(src)
    assert {"os", "asyncio", "time", "socket"} <= absolute
    assert siblings == {"_a", "_b", "_c", "_d", "_e"}


def test_io_modules_are_detected_through_siblings() -> None:
    """The transitive walk is not vacuous: the master's command line reaches sockets."""
    found = closure("master")  # the CLI module; it imports the asyncio server module
    assert {"_master_state", "_messages", "_framing", "_netutil"} <= set(found)
    assert "socket" in found["_netutil"]
    assert any("asyncio" in absolute for absolute in found.values())
