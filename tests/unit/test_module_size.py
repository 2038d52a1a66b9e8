"""No module of the package is over 400 lines: a longer one is split by concern (the way
``_wire/messages.py`` re-exports ``collective.py``'s and ``recovery.py``'s messages)."""

from __future__ import annotations

from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "pccl_aio"
MAX_LINES = 400


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_400_lines() -> None:
    modules = sorted(PKG.rglob("*.py"))
    assert len(modules) > 50  # the package was found
    over = {str(p.relative_to(PKG)): n for p in modules if (n := lines(p)) > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"


def test_no_kernel_source_is_over_400_lines() -> None:
    """The Cython kernels too: ``_kernels.pyx`` includes its ``.pxi`` parts."""
    sources = sorted([*PKG.glob("*.pyx"), *PKG.glob("*.pxi")])
    assert len(sources) >= 3
    over = {p.name: n for p in sources if (n := lines(p)) > MAX_LINES}
    assert not over, f"kernel sources over {MAX_LINES} lines: {over}"
