"""Shared state under churn with real processes: a DDP loop with a SIGKILL and a join, and a
distributor SIGKILLed mid-transfer."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import defaultdict

from tests.process.procs import HERE, spawn

WORKER = str(HERE / "state_worker.py")


async def _pump(proc, queue):
    """Forward ``proc``'s events to ``queue`` until it finished, failed or exited."""
    while True:
        try:
            ev = json.loads(await proc.line(timeout=90))
        except AssertionError:  # the process exited (the victim)
            ev = {"event": "exited"}
        await queue.put((proc.name, ev))
        if ev["event"] in ("finished", "error", "exited"):
            return


async def test_ddp_loop_holds_identical_hashes_under_kill_and_join(procs, master_proc):
    _, addr = master_proc
    revisions = 50
    queue: asyncio.Queue = asyncio.Queue()
    pumps = []
    peers = []
    for i in range(3):
        p = await spawn(f"ddp{i}", WORKER, addr, "ddp", str(revisions))
        procs.append(p)
        await p.expect("joined")
        peers.append(p)
        pumps.append(asyncio.ensure_future(_pump(p, queue)))
    logs: dict[str, list[dict]] = defaultdict(list)
    running = {p.name for p in peers}
    killed = joined = False
    while running:
        name, ev = await asyncio.wait_for(queue.get(), 90)
        logs[name].append(ev)
        if ev["event"] in ("finished", "error", "exited"):
            assert ev["event"] == "finished" or (name == "ddp1" and killed), (name, ev, logs)
            running.discard(name)
            continue
        if ev["event"] != "synced" or name != "ddp0":
            continue
        if not killed and ev["revision"] >= 15:
            killed = True
            peers[1].signal(signal.SIGKILL)
        elif killed and not joined and ev["revision"] >= 25:
            joined = True
            joiner = await spawn("joiner", WORKER, addr, "ddp", str(revisions))
            procs.append(joiner)
            running.add("joiner")
            pumps.append(asyncio.ensure_future(_pump(joiner, queue)))
    await asyncio.gather(*pumps)
    assert killed and joined
    by_rev: dict[int, set[str]] = defaultdict(set)
    for name, evs in logs.items():
        synced = [e for e in evs if e["event"] == "synced"]
        for e in synced:
            by_rev[e["revision"]].add(e["hash"])
        # A peer that joins a running loop receives the whole state once, then nothing:
        # every later revision is reached by identical, deterministic updates.
        first = 0 if synced[0]["revision"] == 0 else synced[0]["nbytes"]
        assert synced[0]["rx"] == first, (name, synced[0])
        assert all(e["rx"] == 0 for e in synced[1:]), name
        if name == "joiner":
            assert synced[0]["revision"] > 25 and any(e["ws"] == 3 for e in synced)
    assert set(range(revisions + 1)) <= set(by_rev)
    assert all(len(h) == 1 for h in by_rev.values()), {
        r: h for r, h in by_rev.items() if len(h) > 1}


async def test_distributor_killed_mid_transfer(procs, master_proc):
    _, addr = master_proc
    srcs = []
    for i in range(2):
        p = await spawn(f"src{i}", WORKER, addr, "big", "64",
                        env={"PEER_INDEX": str(i), "WORLD": "3"})
        procs.append(p)
        await p.expect("joined")
        srcs.append(p)
    joiner = await spawn("joiner", WORKER, addr, "big", "64",
                         env={"PEER_INDEX": "joiner", "WORLD": "3"})
    procs.append(joiner)
    await joiner.expect("joined")
    for p in (*srcs, joiner):
        await p.expect("ready")
    # the joiner shares its ranges between both sources: kill one as soon as it serves
    victim, survivor = srcs
    await victim.expect("serving", timeout=30)
    victim.signal(signal.SIGKILL)
    got = await joiner.expect("synced", timeout=60)
    ref = await survivor.expect("synced", timeout=60)
    assert got["hash"] == ref["hash"]
    assert got["rx"] == 64 * 2**20 and got["revision"] == 5
    await joiner.expect("finished")
