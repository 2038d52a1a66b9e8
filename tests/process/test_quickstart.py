"""examples/quickstart.py is the PyTorch tutorial's block word for word, and its training loop
stays short; ``tests/process/test_readme.py`` runs that block through a SIGKILL and a joiner
and checks that a lone peer sleeps."""

from __future__ import annotations

import re
from pathlib import Path

from tests.process.readme_blocks import blocks, page

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "examples" / "quickstart.py"


def region() -> str:
    """The quick-start block of ``examples/quickstart.py``."""
    text = QUICK.read_text()
    return text.split("# --- quick start ---\n", 1)[1].split("# --- end ---\n", 1)[0]


def test_the_readme_quick_start_is_the_tested_example():
    code = region()
    tutorial = page("tutorial/pytorch.md")
    assert [b for b in blocks(tutorial.read_text()) if b.code == code], (
        "docs/tutorial/pytorch.md must hold examples/quickstart.py's block word for word")
    loop = code[code.index("with Communicator"):].splitlines()
    # with, connect, the loop with its signs of life, the digest: one screen
    assert len([line for line in loop if line.strip()]) <= 32, loop
    intro = tutorial.read_text().split("# Train a PyTorch model", 1)[1].split("```", 1)[0]
    assert "examples/quickstart.py" in re.sub(r"<!--.*?-->", "", intro, flags=re.S), intro
