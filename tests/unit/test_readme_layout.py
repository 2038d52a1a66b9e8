"""The layout paragraph (docs/explanation/development.md) agrees with the tree: every module
and folder it names exists, and every folder of ``pccl_aio/_peer/`` is named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "pccl_aio"


def layout() -> str:
    text = (ROOT / "docs" / "explanation" / "development.md").read_text(encoding="utf-8")
    start = text.index("Layout: the path tells the layer")
    return text[start:text.index("Every example runs as real processes", start)]


def named() -> set[str]:
    return set(re.findall(r"`([\w./<>]+)`", layout()))


def test_every_named_module_and_folder_exists() -> None:
    files = {p.name for p in PKG.rglob("*") if p.is_file()}
    folders = {p.name + "/" for p in PKG.rglob("*") if p.is_dir()}
    missing = []
    for name in named():
        if name.startswith(("tests/", "pccl_aio/")):
            ok = (ROOT / name).exists()
        elif name.endswith((".py", ".pyx")):
            ok = name.split("/")[-1] in files
        elif name.endswith("/") and "<" not in name:
            ok = name.split("/")[-2] + "/" in folders
        else:
            ok = True
        if not ok:
            missing.append(name)
    assert len(named()) > 30  # the paragraph was found
    assert missing == []


def test_every_peer_concern_is_named() -> None:
    concerns = {p.name + "/" for p in (PKG / "_peer").iterdir()
                if p.is_dir() and p.name != "__pycache__" and p.name != "core"}
    assert concerns >= {"session/", "data/", "state/", "observe/"}
    assert concerns <= named()
