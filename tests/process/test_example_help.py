"""An example's ``--help`` describes it in whole sentences: its docstring's first paragraph
(the first line alone was cut mid-sentence in five of them: "... whose all-reduce"). The
torch examples share ``charlm.parser``: two of them run here, and numpy_diloco.py's own."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import sys

import pytest

from tests.process.procs import HERE

EXAMPLES = HERE.parent.parent / "examples"
SCRIPTS = ("async_diloco.py", "ddp_torch_distributed.py", "numpy_diloco.py")


async def _help(script: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / script), "--help", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, cwd=EXAMPLES,
        env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)})
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    return out.decode()


@pytest.mark.timeout(90)
async def test_examples_help_says_the_first_paragraph_whole():
    outs = await asyncio.gather(*(_help(s) for s in SCRIPTS))
    for script, out in zip(SCRIPTS, outs):
        doc = ast.get_docstring(ast.parse((EXAMPLES / script).read_text())) or ""
        want = " ".join(doc.split("\n\n", 1)[0].split())
        shown = " ".join(out.split("\n\n")[1].split())  # (after the usage lines)
        assert shown == want, (script, shown)
        assert re.search(r"[.)]$", shown), (script, shown)
