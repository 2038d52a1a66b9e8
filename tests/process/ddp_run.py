"""A DDP-like run of ``state_worker.py ddp`` peer processes, driven event by event: the
scenario acts at peer p0's syncs, and ``check`` proves no step was lost or repeated and every
revision's hashes agree (issue 20's failover tests, issue 21's observability tests)."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from tests.process.procs import HERE, Proc, spawn

WORKER = str(HERE / "state_worker.py")
REVISIONS = 150
STEP = {"STEP_SECONDS": "0.02"}  # a step's compute: the master events land mid-run (``check``)

Event = dict[str, Any]


class Run:
    """Peers of one run, their events, and the checks every scenario ends with."""

    def __init__(self, procs: list[Proc], addrs: str, revisions: int = REVISIONS,
                 env: dict[str, str] | None = None) -> None:
        self.procs, self.addrs = procs, addrs
        self.revisions, self.env = revisions, STEP if env is None else env
        self.queue: asyncio.Queue[tuple[str, Event]] = asyncio.Queue()
        self.logs: dict[str, list[Event]] = defaultdict(list)
        self.peers: dict[str, Proc] = {}
        self.ids: dict[str, int] = {}  # name -> peer id (when added with wait_joined)
        self.killed: set[str] = set()
        self.pumps: list[asyncio.Task[None]] = []
        self.event_t = 0.0  # time.time() of the master event under test

    def mark(self) -> None:
        """The master event under test happens now."""
        self.event_t = time.time()

    async def add(self, name: str, wait_joined: bool = True) -> Proc:
        p = await spawn(name, WORKER, self.addrs, "ddp", str(self.revisions), env=self.env)
        self.procs.append(p)
        self.peers[name] = p
        if wait_joined:
            ev = json.loads(await p.line(60))
            assert ev["event"] == "joined", (name, ev)
            self.ids[name] = ev["peer_id"]
        self.pumps.append(asyncio.ensure_future(self._pump(p)))
        return p

    async def _pump(self, p: Proc) -> None:
        while True:
            try:
                ev = json.loads(await p.line(timeout=120))
            except AssertionError:
                ev = {"event": "exited"}
            await self.queue.put((p.name, ev))
            if ev["event"] in ("finished", "error", "exited"):
                return

    def kill(self, name: str) -> None:
        self.killed.add(name)
        self.peers[name].signal(signal.SIGKILL)

    async def drive(self, on_sync: Callable[[Event], Awaitable[None]]) -> None:
        """Until every peer not killed finished; ``on_sync(event)`` at each of peer 0's
        syncs (the scenario's events)."""
        running = set(self.peers)
        while running - self.killed:
            name, ev = await asyncio.wait_for(self.queue.get(), 120)
            self.logs[name].append(ev)
            if ev["event"] in ("finished", "error", "exited"):
                assert ev["event"] == "finished" or name in self.killed, (name, ev, self.story())
                running.discard(name)
                continue
            if ev["event"] == "synced" and name == "p0":
                await on_sync(ev)
            running |= set(self.peers)  # a joiner started meanwhile

    def story(self) -> str:
        """Every peer's events other than its syncs: what to read when a scenario fails."""
        return "\n".join(f"{n}: {e}" for n, evs in self.logs.items() for e in evs
                         if e["event"] != "synced")

    def check(self, finishers: int = 3, rejoined: tuple[str, ...] = ()) -> None:
        """Every revision's hashes agree; each peer's revisions are consecutive (those named
        in ``rejoined`` may skip ahead once: they joined again as new members)."""
        hashes: dict[int, set[str]] = defaultdict(set)
        done = [n for n, evs in self.logs.items() if evs and evs[-1]["event"] == "finished"]
        assert len(done) >= finishers, self.logs
        for name, evs in self.logs.items():
            revs = [e["revision"] for e in evs if e["event"] == "synced"]
            for e in evs:
                if e["event"] == "synced":
                    hashes[e["revision"]].add(e["hash"])
                    assert e["step"] == e["revision"], (name, e)
            skips = [(a, b) for a, b in itertools.pairwise(revs) if b != a + 1]
            assert not skips or (name in rejoined and len(skips) == 1
                                 and skips[0][1] > skips[0][0]), (name, revs)
        bad = {r: h for r, h in hashes.items() if len(h) != 1}
        assert not bad, bad
        assert max(hashes) >= self.revisions
        for name in done:  # the master event landed mid-run: training went on after it
            later = [e for e in self.logs[name] if e["event"] == "synced" and e["t"] > self.event_t]
            assert self.event_t and len(later) >= 5, (name, self.event_t, self.logs[name][-3:])

    async def close(self) -> None:
        for t in self.pumps:
            t.cancel()
