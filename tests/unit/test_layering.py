"""The layer of every module shows in its path, and the sans-IO layers never touch I/O.

The rule, by folder (no list of files):

- sans-IO: ``_wire/`` (wire formats), ``_compute/`` (the kernels' front ``ops.py`` and the
  numpy reference), every ``core/`` folder (``_master/core``, ``_peer/core``,
  ``_peer/<concern>/core``) and the top-level ``_*.py`` modules (errors, types, version;
  the compiled kernels ``_kernels.pyx`` sit beside them). They import no ``asyncio``,
  ``socket``, ``selectors`` or ``time``, directly or through any pccl_aio module they import.
- asyncio shell: ``_net/``, ``_master/``, ``_peer/`` (outside ``core/``), ``_launch/``,
  ``_torch/`` and the public entry modules ``master.py``, ``demo.py``, ``launch.py``,
  ``secret.py``, ``blocking.py``, ``torch.py``, ``torchx.py``, ``ray.py``, ``__init__.py``.

Checked on the source (AST), so the sans-IO modules stay usable from a plain unit test, a
thread, or another event loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pccl_aio"
FORBIDDEN = {"asyncio", "socket", "time", "selectors"}
SANS_IO_FOLDERS = {"_wire", "_compute", "core"}
SHELL_FOLDERS = {"_net", "_master", "_peer", "_launch", "_torch"}
PUBLIC_ENTRY = {"__init__.py", "master.py", "demo.py", "blocking.py", "launch.py",
                "secret.py", "torch.py", "torchx.py", "ray.py"}


def layer(path: Path) -> str:
    """'sans-io' or 'shell', from the path alone; AssertionError for a file with no layer."""
    rel = path.relative_to(PKG)
    folders = rel.parts[:-1]
    if any(f in SANS_IO_FOLDERS for f in folders):
        return "sans-io"
    if folders:
        assert folders[0] in SHELL_FOLDERS, f"{rel}: folder {folders[0]!r} has no layer"
        return "shell"
    if rel.name in PUBLIC_ENTRY:
        return "shell"
    assert rel.name.startswith("_"), f"{rel}: a public module outside the known entry points"
    return "sans-io"


def module_path(dotted: str) -> Path | None:
    """Source file of ``pccl_aio.x.y`` (a module or a package), or None (compiled, absent)."""
    base = PKG.joinpath(*dotted.split(".")[1:])
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.exists():
            return cand
    return None


def dotted_of(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["pccl_aio", *parts])


def imports(path: Path, at: Path | None = None) -> tuple[set[str], set[str]]:
    """(absolute top-level modules, pccl_aio modules as dotted names) imported in ``path``,
    whose relative imports are read as if it were at ``at`` inside the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = at or path
    here = dotted_of(where).split(".")
    package = here if where.name == "__init__.py" else here[:-1]
    absolute: set[str] = set()
    internal: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                absolute.add(alias.name.split(".")[0])
                if alias.name.startswith("pccl_aio"):
                    internal.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 0:
                absolute.add(mod.split(".")[0])
                if not mod.startswith("pccl_aio"):
                    continue
                base = mod
            else:
                assert node.level <= len(package), f"{path}: relative import beyond the package"
                base = ".".join(package[: len(package) - node.level + 1] + ([mod] if mod else []))
            internal.add(base)
            internal.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return absolute, internal


def closure(path: Path) -> dict[Path, set[str]]:
    """file -> its absolute imports, for ``path`` and every pccl_aio file it pulls in."""
    seen: dict[Path, set[str]] = {}
    todo = [path]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        absolute, internal = imports(p)
        seen[p] = absolute
        for dotted in internal:
            q = module_path(dotted)
            if q is not None and q != PKG / "__init__.py":  # the root pulls in everything
                todo.append(q)
    return seen


SOURCES = sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_every_module_has_a_layer(path: Path) -> None:
    assert layer(path) in ("sans-io", "shell")


@pytest.mark.parametrize("path", [p for p in SOURCES if layer(p) == "sans-io"],
                         ids=lambda p: str(p.relative_to(PKG)))
def test_sans_io_module_imports_no_io(path: Path) -> None:
    bad = {str(p.relative_to(PKG)): sorted(absolute & FORBIDDEN)
           for p, absolute in closure(path).items() if absolute & FORBIDDEN}
    assert bad == {}, f"{path.relative_to(PKG)} reaches I/O modules: {bad}"


def test_the_layers_are_populated() -> None:
    """The rule is not vacuous: each layer has files, and core folders exist on both sides."""
    sans = {p.relative_to(PKG).parts[0] for p in SOURCES if layer(p) == "sans-io"}
    assert {"_wire", "_compute", "_master", "_peer"} <= sans
    assert sum(layer(p) == "shell" for p in SOURCES) >= 8


def test_checker_sees_every_import_form(tmp_path: Path) -> None:
    at = PKG / "_peer" / "core" / "m.py"  # where its relative imports are resolved
    src = tmp_path / "m.py"
    src.write_text(
        "import os.path, asyncio.events\n"
        "from time import monotonic\n"
        "from . import ring, slots\n"
        "from .buffers import x\n"
        "from ..._wire import messages\n"
        "from pccl_aio import _errors\n"
        "import pccl_aio._types\n"
        "def f():\n    import socket\n",
        encoding="utf-8")
    absolute, internal = imports(src, at)
    assert {"os", "asyncio", "time", "socket"} <= absolute
    assert {"pccl_aio._peer.core.ring", "pccl_aio._peer.core.slots",
            "pccl_aio._peer.core.buffers", "pccl_aio._wire.messages",
            "pccl_aio._errors", "pccl_aio._types"} <= internal
    assert layer(at) == "sans-io"
    assert layer(PKG / "_peer" / "control.py") == "shell"
    with pytest.raises(AssertionError, match="has no layer"):
        layer(PKG / "_misc" / "x.py")


def test_io_modules_are_detected_through_imports() -> None:
    """The transitive walk is not vacuous: the master's command line reaches sockets."""
    found = {str(p.relative_to(PKG)): a for p, a in closure(PKG / "master.py").items()}
    assert {"_master/server.py", "_master/core/state.py", "_wire/messages.py",
            "_wire/framing.py", "_net/stream.py"} <= set(found)
    assert "socket" in found["_net/stream.py"]
    assert not found["_master/core/state.py"] & FORBIDDEN
