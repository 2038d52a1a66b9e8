"""``MasterState.handle()`` never raises: the seeded fuzz of ``tests/stress/fuzz_master.py`` in
its bounded mode (750,000 events over three seeds), plus checks that the fuzz reaches the
interesting states and can fail. Longer runs: ``python tests/stress/fuzz_master.py --events N``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pccl_aio._master.core import barrier
from tests.stress.fuzz_master import FuzzFailure, fuzz

SCRIPT = Path(__file__).resolve().parents[1] / "stress" / "fuzz_master.py"
ROOT = SCRIPT.parents[2]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("seed", range(3))
def test_handle_never_raises_and_keeps_its_invariants(seed: int) -> None:
    stats = fuzz(250_000, seed)
    assert stats.events >= 250_000  # handle() calls (a step may make several)
    sent = stats.sent
    # the fuzz is not vacuous: it reaches every phase, often
    for what in ("Welcome", "Rejected", "Kicked", "Membership", "TopologyUpdated",
                 "PeersPendingAnswer", "CollectiveStart", "CollectiveComplete", "CollectiveAbort",
                 "CollectiveRejected", "VoteRejected", "deadlock verdicts", "SyncPlan",
                 "SyncComplete", "SyncFailed"):
        assert sent[what] >= 100, (what, sent)


class _Anything:
    def __contains__(self, item: object) -> bool:
        return True


@pytest.mark.timeout(60)
def test_the_fuzz_finds_a_master_that_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16's crash comes back when the barrier lets an unknown strategy through to the
    election; the fuzz finds it in a few thousand events."""
    monkeypatch.setattr(barrier, "_STRATEGIES", _Anything())
    with pytest.raises(FuzzFailure, match="is not a valid SyncStrategy") as info:
        fuzz(200_000, 1)
    assert "seed 1, event " in str(info.value) and "last events:" in str(info.value)


def _without_pytest(tmp_path: Path) -> dict[str, str]:
    """An environment where ``import pytest`` (or hypothesis) fails."""
    for name in ("pytest", "hypothesis", "_pytest"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('no {name} here')\n")
    path = os.pathsep.join((str(tmp_path), str(ROOT)))
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.timeout(60)
def test_command_line_runs_with_only_the_package(tmp_path: Path) -> None:
    env = _without_pytest(tmp_path)
    done = subprocess.run([sys.executable, str(SCRIPT), "--events", "3000", "--seed", "5"],
                          capture_output=True, text=True, env=env, timeout=50, check=False)
    assert done.returncode == 0, done.stderr
    assert re.match(r"30\d\d events in ", done.stdout) and "seed 5" in done.stdout
    assert "events/s" in done.stdout
    helped = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                            text=True, env=env, timeout=50, check=False)
    assert helped.returncode == 0 and "--events" in helped.stdout
    assert "1000000" in helped.stdout  # its default
