"""A source SIGKILLed in the middle of a range: the joiner resumes the range from the others.

Three peers hold a 64 MiB shared state at revision 5; a joiner at revision 0 syncs and fetches
it from all three. The victim sends the first half of the first range it is asked for and
holds its later requests (a process killed in the middle of a write looks the same from the
joiner's side). Once the joiner reported progress and the victim held a request, the test
SIGKILLs it. The joiner must finish from the other two with the right content, keep the half
it already had (the library's log says how much), and receive every byte once: ``rx_bytes``
counts every byte read, so a range fetched again from its start would exceed 64 MiB.

Run as a script, this file is one peer: ``python test_fetch_kill.py MASTER ROLE`` (ROLE:
source, victim or joiner); one JSON event per line on stdout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import pccl_aio as pccl

MIB = 1 << 20
SIZE = 64 * MIB
pytestmark = pytest.mark.timeout(60)


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


class _Kept(logging.Handler):
    """The bytes of ranges the fetcher kept when their connection failed (its INFO log)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.kept: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "fetch the rest" in record.getMessage() and isinstance(record.args, tuple):
            self.kept.append(int(record.args[1]))


class _Half:
    """An entry view that has only the first half of any range asked of it."""

    def __init__(self, view: memoryview) -> None:
        self.view, self.nbytes = view, view.nbytes

    def __getitem__(self, s: slice) -> memoryview:
        part = self.view[s]
        return part[: part.nbytes // 2]


async def peer(addr: str, role: str) -> None:
    from pccl_aio._peer import testing

    joiner = role == "joiner"
    n = SIZE // 4 // 4
    entries = {f"e{i}": np.zeros(n, np.float32) for i in range(4)}
    if not joiner:
        for i, a in enumerate(entries.values()):
            a[:] = np.arange(n, dtype=np.float32) * (i + 1)
    state = pccl.SharedState(entries, revision=0 if joiner else 5)
    kept = _Kept()
    logging.getLogger("pccl_aio.state").addHandler(kept)
    logging.getLogger("pccl_aio.state").setLevel(logging.INFO)
    async with pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                                 data_timeout=10.0) as comm:
        await comm.connect(attempts=20)
        emit(event="joined", peer_id=comm.peer_id)
        while comm.world_size < 4:
            await comm.update_topology()
        if role == "victim":  # (the test hook: no public API serves a range in halves)
            server = testing.shared_state_sync(comm).server
            real = server.lookup
            assert real is not None
            asked = 0

            async def half_then_hold(p: int, key: str, rev: int) -> Any:
                nonlocal asked
                asked += 1
                view = await real(p, key, rev)
                if asked == 1 and view is not None:
                    emit(event="serving", key=key)
                    return _Half(view)
                if asked == 2:  # answers go in order: this connection sends nothing more
                    emit(event="held")
                await asyncio.Event().wait()

            server.lookup = half_then_hold
        told = False

        def progress(done: int, total: int) -> None:
            nonlocal told
            if not told:
                told = True
                emit(event="progress", done=done, total=total)

        emit(event="ready")
        info = await comm.sync_shared_state(state, progress=progress if joiner else None)
        h = xxhash.xxh3_64()
        for k in state.keys:
            h.update(state.view(k))
        emit(event="synced", hash=h.hexdigest(), rx=info.rx_bytes, tx=info.tx_bytes,
             revision=state.revision, kept=kept.kept)


async def test_a_source_killed_mid_range_is_resumed_by_the_others(procs, master_proc):
    from tests.process.procs import spawn

    _, addr = master_proc
    me = str(Path(__file__).resolve())
    roles = ["source", "victim", "source", "joiner"]
    peers = []
    for i, role in enumerate(roles):
        p = await spawn(f"{role}{i}", me, addr, role)
        procs.append(p)
        await p.expect("joined")
        peers.append(p)
    for p in peers:
        await p.expect("ready")
    victim, joiner = peers[1], peers[3]
    await victim.expect("serving", timeout=30)
    await victim.expect("held", timeout=30)
    started = await joiner.expect("progress", timeout=30)
    assert 0 < started["done"] < SIZE == started["total"], started
    victim.signal(signal.SIGKILL)
    got = await joiner.expect("synced", timeout=30)
    refs = [await p.expect("synced", timeout=30) for p in (peers[0], peers[2])]
    assert got["revision"] == 5 and {r["hash"] for r in refs} == {got["hash"]}, (got, refs)
    # every byte read once: a range fetched again from its start would add its first half
    assert got["rx"] == SIZE, got
    assert got["kept"] and got["kept"][0] > 0, got  # the half that arrived was kept
    # the survivors served the rest: all but the half the victim delivered before it died
    assert sum(r["tx"] for r in refs) == SIZE - sum(got["kept"]), (got, refs)


if __name__ == "__main__":
    pccl.run(peer(sys.argv[1], sys.argv[2]))
