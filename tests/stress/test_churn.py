"""The churn orchestrator in its short, bounded mode (the long mode is its CLI), and its CLI
without pytest."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.stress.churn import churn

SCRIPT = str(Path(__file__).resolve().parent / "churn.py")

# Runs the script as ``python tests/stress/churn.py --help`` would, with pytest unimportable.
WITHOUT_PYTEST = (
    "import runpy, sys\n"
    "sys.modules['pytest'] = None  # import pytest now raises ImportError\n"
    "sys.argv = [sys.argv[1], '--help']\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


@pytest.mark.timeout(120)
async def test_churn_keeps_state_identical_and_progressing():
    summary = await churn(seconds=20.0, seed=7, stall=15.0, master_every=None)
    assert summary["kills"] >= 2 and summary["spawns"] >= 4, summary
    assert summary["revisions"] >= 20, summary  # kept training through the churn


@pytest.mark.timeout(90)
async def test_churn_with_master_restarts_and_stops():
    # Seed 7 draws, for master events every ~4 s over 25 s: kill, stop, kill, kill (the
    # master's own random sequence: peer churn and timing do not change it).
    summary = await churn(seconds=25.0, seed=7, stall=15.0, master_every=4.0)
    assert summary["master_restarts"] >= 2 and summary["master_stops"] >= 1, summary
    assert summary["kills"] >= 2 and summary["spawns"] >= 4, summary
    assert summary["revisions"] >= 20, summary  # kept training through the churn


@pytest.mark.timeout(120)
async def test_churn_with_insiders():
    """Issue 31: members running modified code (``insider.py``) and frozen honest peers, in
    turn, among the churn; every insider is refused or kicked, and the honest states stay
    identical."""
    summary = await churn(seconds=22.0, seed=3, stall=15.0, master_every=None,
                          insider_every=2.0)  # (with master events: the note's long run)
    outcomes = dict(i.split(": ", 1) for i in summary["insiders"])  # type: ignore[union-attr]
    assert {"term", "overflow", "claim", "freeze", "count"} <= set(outcomes), summary
    assert outcomes["overflow"] == "Kicked" and outcomes["term"] == "Rejected", summary
    assert outcomes["count"] == "KickedError", summary
    assert summary["revisions"] >= 20 and summary["master_retries"] < 1000, summary


@pytest.mark.timeout(30)
async def test_churn_help_runs_without_pytest():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WITHOUT_PYTEST, SCRIPT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    text = out.decode()
    assert text.startswith("usage: churn.py") and "--seconds" in text, text
