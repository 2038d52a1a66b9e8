"""The churn orchestrator in its short, bounded mode (the long mode is its CLI)."""

from __future__ import annotations

import pytest

from tests.stress.churn import churn


@pytest.mark.timeout(120)
async def test_churn_keeps_state_identical_and_progressing():
    summary = await churn(seconds=20.0, seed=7, stall=15.0)
    assert summary["kills"] >= 2 and summary["spawns"] >= 4, summary
    assert summary["revisions"] >= 20, summary  # kept training through the churn
