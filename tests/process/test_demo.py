"""The README's first command works: the demo passes its own checks and says so."""

from __future__ import annotations

import asyncio
import os
import sys

from tests.process.procs import HERE


async def test_demo_passes():
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.demo", "--steps", "24", "--count", "65536",
        "--timeout", "90", stdout=asyncio.subprocess.PIPE, env=env)
    out, _ = await asyncio.wait_for(proc.communicate(), 110)
    text = out.decode()
    assert proc.returncode == 0, text[-2000:]
    verdict = text.strip().splitlines()[-1]
    assert verdict.startswith("VERDICT: PASS"), verdict
    assert "4->3->4," in verdict and "identical on every peer" in verdict
    assert "SIGKILL" in text and "newcomer joined" in text
