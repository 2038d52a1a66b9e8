"""Issue 46: a fixed world keeps its ``DeviceMesh`` through a lost rank.
``examples/dtensor_replace.py`` runs on 3 ranks (``init_process_group("pccl_aio")``, DTensor
data parallelism on a 1-D mesh); rank 2 is SIGKILLed mid-run and a replacement process
started as rank 2 (``--join 1``). Both survivors raise, all three reconfigure, the run
finishes its steps, and every rank ends with the same weight: the one a run without a fault
computes (up to the order of the sums), so no step was lost or done twice."""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.process.procs import HERE, events, spawn

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(150)

EXAMPLE = str(HERE.parent.parent / "examples" / "dtensor_replace.py")
STEPS = 300


def reference(steps: int) -> tuple[list[float], list[float]]:
    """The example's losses and its weight after ``steps`` steps on one process."""
    w, losses = torch.zeros(4, 1, dtype=torch.float64), []
    for step in range(steps):
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(step)).double()
        y = x @ torch.arange(1.0, 5.0, dtype=torch.float64).view(4, 1)
        losses.append(float(((x @ w - y) ** 2).mean()))
        w -= 0.002 * 2 * x.T @ (x @ w - y) / x.shape[0]
    return losses, list(w.flatten().tolist())


async def test_a_sigkilled_rank_is_replaced_and_the_mesh_keeps_training(procs, tmp_path):
    init = str(tmp_path / "init")
    ranks = []
    for r in range(3):
        ranks.append(await spawn(f"rank{r}", EXAMPLE, init, "3", str(r), "--steps",
                                 str(STEPS), env={"OMP_NUM_THREADS": "1"}))
        procs.append(ranks[-1])
    survivors = [asyncio.ensure_future(events(p, {"done"}, timeout=60)) for p in ranks[:2]]
    seen = await events(ranks[2], {"step"}, timeout=60)
    while seen[-1]["step"] < 20:
        seen = await events(ranks[2], {"step"}, timeout=30)
    ranks[2].signal(signal.SIGKILL)
    assert await ranks[2].proc.wait() == -signal.SIGKILL
    joiner = await spawn("replacement", EXAMPLE, init, "3", "2", "--steps", str(STEPS),
                         "--join", "1", env={"OMP_NUM_THREADS": "1"})
    procs.append(joiner)
    lines = await asyncio.gather(*survivors, events(joiner, {"done"}, timeout=60))
    for seen in lines[:2]:
        lost = [e for e in seen if e["event"] == "lost"]
        assert len(lost) == 1, lost  # (each survivor raised once, then went on)
        steps = [e["step"] for e in seen if e["event"] == "step"]
        # every step once, in order, but the one redone after the reconfigure
        assert sorted(set(steps)) == list(range(STEPS)), steps[:5]
        assert len(steps) - len(set(steps)) <= 1, steps
        assert lost[0]["step"] >= 20
    joined = [e["step"] for e in lines[2] if e["event"] == "step"]
    assert joined and joined[0] == lines[0][[e["event"] for e in lines[0]].index("lost")]["step"]
    weights = [seen[-1]["weight"] for seen in lines]
    assert weights[0] == weights[1] == weights[2], weights  # (one weight: the same bytes)
    losses, weight = reference(STEPS)
    assert weights[0] == pytest.approx(weight, rel=1e-4)
    for seen in lines:  # (each step's loss, the redone one's too, is the fault-free run's)
        for e in seen:
            if e["event"] == "step":
                assert e["loss"] == pytest.approx(losses[e["step"]], rel=1e-4), e
    for p in [*ranks[:2], joiner]:
        assert await asyncio.wait_for(p.proc.wait(), 30) == 0
