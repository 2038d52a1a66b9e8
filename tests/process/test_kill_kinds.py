"""Issue 32's real-process acceptance: a peer SIGKILLed mid-broadcast (the root),
mid-all-gather, mid-reduce-scatter and in a barrier (before it arrived) makes every survivor
raise ``PeerLostError`` within 2 s, as for an all-reduce, with its inputs as they were; the
survivors then run every kind correctly in the new world; a joiner admitted meanwhile takes
part in every kind. One run of five peers (``kinds_peer.py``) covers the four kinds."""

from __future__ import annotations

import signal
import time

import pytest

from tests.process.procs import HERE, Proc, spawn

pytestmark = pytest.mark.timeout(180)

PEER = str(HERE / "kinds_peer.py")


async def _verified(alive: list[Proc], world: int) -> None:
    done = [await p.expect("verified", timeout=60) for p in alive]
    assert all(d["ok"] and d["ws"] == world for d in done), done
    assert len({d["hash"] for d in done}) == 1  # every peer's all-gather bytes the same


async def _round(alive: list[Proc], kind: str, victim_rank: int) -> None:
    rounds = [await p.expect("round", timeout=60) for p in alive]
    world = len(alive)
    assert {r["kind"] for r in rounds} == {kind} and all(r["ws"] == world for r in rounds)
    victim = next(p for p, r in zip(alive, rounds) if r["rank"] == victim_rank % world)
    await victim.expect("frozen", timeout=30)
    victim.signal(signal.SIGKILL)
    killed_at = time.time()
    alive.remove(victim)
    lost = [await p.expect("lost", timeout=10) for p in alive]
    for ev in lost:
        assert ev["kind"] == kind and ev["restored"] is True, ev
        assert ev["t"] - killed_at < 2.0, ev
        assert ev["ws"] == world - 1, ev
    await _verified(alive, world - 1)


async def test_sigkill_mid_each_kind_and_a_joiner_in_every_kind(procs, master_proc):
    _, addr = master_proc
    alive: list[Proc] = []
    for i in range(5):
        p = await spawn(f"peer{i}", PEER, addr, "5")
        procs.append(p)
        await p.expect("joined")
        alive.append(p)
    for p in alive:
        await p.expect("world", timeout=60)
    await _round(alive, "broadcast", -1)  # the root dies
    await _round(alive, "all_gather", 1)
    await _round(alive, "reduce_scatter", 0)
    joiner = await spawn("joiner", PEER, addr, "3", "joiner")
    procs.append(joiner)
    await joiner.expect("joined", timeout=30)
    alive.append(joiner)
    await _verified(alive, 3)  # the joiner in every kind
    await _round(alive, "barrier", 1)
    for p in alive:
        await p.expect("done", timeout=30)
