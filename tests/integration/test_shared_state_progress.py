"""Progress of a shared-state fetch (``sync_shared_state(progress=...)``): monotonic calls
ending at ``(total, total)`` above ``PROGRESS_MIN_BYTES``, none below it, a callback that
raises, a range that fails half-way (resumed), bad arguments, and the log line of a sync. Shared
helpers: ``state_harness``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import Any

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._log import fields_of
from pccl_aio._peer.state import progress as progress_mod
from pccl_aio._peer.state import transfer
from pccl_aio._wire import messages as m
from tests.integration.state_harness import (
    PIECE,
    MasterLog,
    MiB,
    Tally,
    first_of,
    random_bits,
    reap,
    state_server,
    u8,
    vanish,
)

pytestmark = pytest.mark.timeout(60)


class Calls:
    """A progress callback that records ``(done, total, when, thread)`` of every call."""

    def __init__(self, raises: bool = False) -> None:
        self.calls: list[tuple[int, int, float, threading.Thread]] = []
        self.raises = raises
        self.tally = Tally()

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total, time.monotonic(), threading.current_thread()))
        self.tally.add(done)
        if self.raises:
            raise RuntimeError("a broken progress bar")

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return [(d, t) for d, t, _, _ in self.calls]


def check_progress(calls: Calls, total: int) -> None:
    """Rising ``done`` below ``total``, calls at least PROGRESS_INTERVAL apart, one last
    ``(total, total)``."""
    pairs = calls.pairs
    assert pairs and pairs[-1] == (total, total), pairs
    assert all(t == total for _, t in pairs), pairs
    dones = [d for d, _ in pairs]
    assert all(0 < a < b for a, b in itertools.pairwise(dones)), dones
    assert dones.count(total) == 1
    times = [w for _, _, w, _ in calls.calls[:-1]]
    slack = 0.01  # the meter and the callback read the clock a few calls apart
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= progress_mod.PROGRESS_INTERVAL - slack for g in gaps), gaps


async def test_a_16_MiB_fetch_reports_rising_progress_ending_at_the_bytes_fetched(peers, caplog):
    a, b = await peers(2)
    good = random_bits(16 * MiB, np.uint8, 1)
    xb = np.zeros_like(good)
    sa = pccl.SharedState({"w": good, "tiny": u8(7)}, revision=3)
    sb = pccl.SharedState({"w": xb, "tiny": u8(0)}, revision=0)
    pa, pb = Calls(), Calls()
    with caplog.at_level(logging.DEBUG, logger="pccl_aio.state"):
        ia, ib = await asyncio.gather(a.sync_shared_state(sa, progress=pa),
                                      b.sync_shared_state(sb, progress=pb))
    total = 16 * MiB + 1024
    assert ib.rx_bytes == total and ia.tx_bytes == total and xb.tobytes() == good.tobytes()
    check_progress(pb, ib.rx_bytes)
    assert all(t is threading.current_thread() for *_, t in pb.calls)  # the loop's thread
    assert pa.calls == []  # a's state was up to date: it fetched nothing
    done = [r for r in caplog.records if r.getMessage().startswith("synced shared state")]
    by_peer = {fields_of(r)["peer"]: r for r in done}
    assert set(by_peer) == {a.peer_id, b.peer_id}, done
    got = by_peer[b.peer_id]
    assert got.levelno == logging.INFO
    assert fields_of(got) == {"run": fields_of(got)["run"], "peer": b.peer_id, "group": 0,
                              "revision": 3, "bytes": total, "sources": [a.peer_id],
                              "sent": 0}
    assert f"fetched {total} B from peers {a.peer_id} in" in got.getMessage()
    assert by_peer[a.peer_id].levelno == logging.DEBUG
    assert fields_of(by_peer[a.peer_id])["bytes"] == 0


@pytest.mark.parametrize("nbytes", [MiB, progress_mod.PROGRESS_MIN_BYTES])
async def test_a_fetch_of_at_most_the_threshold_reports_nothing(peers, nbytes):
    a, b = await peers(2)
    good, xb = random_bits(nbytes, np.uint8, 2), np.zeros(nbytes, np.uint8)
    pb = Calls()
    _, ib = await asyncio.gather(
        a.sync_shared_state(pccl.SharedState({"w": good}, revision=1)),
        b.sync_shared_state(pccl.SharedState({"w": xb}), progress=pb))
    assert ib.rx_bytes == nbytes and xb.tobytes() == good.tobytes()
    assert pb.calls == []


async def test_a_callback_that_raises_is_dropped_and_every_peer_ends_identical(peers, caplog):
    a, b, c = await peers(3)
    good = random_bits(2 * PIECE + 5, np.uint8, 3)
    xs = [good.copy(), np.zeros_like(good), np.zeros_like(good)]
    states = [pccl.SharedState({"w": x}, r) for x, r in zip(xs, [2, 0, 0])]
    bad, fine = Calls(raises=True), Calls()
    with caplog.at_level(logging.WARNING, logger="pccl_aio.state"):
        infos = await asyncio.gather(*(comm.sync_shared_state(s, progress=p) for comm, s, p in
                                       zip([a, b, c], states, [None, bad, fine])))
    assert all(x.tobytes() == good.tobytes() for x in xs)
    assert [s.revision for s in states] == [2, 2, 2]
    assert [i.rx_bytes for i in infos] == [0, good.nbytes, good.nbytes]
    assert len(bad.calls) == 1  # never called again after it raised
    check_progress(fine, good.nbytes)
    warned = [r for r in caplog.records if "progress callback" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING, warned
    assert fields_of(warned[0])["peer"] == b.peer_id
    # the communicators stay usable: another sync moves nothing
    again = await asyncio.gather(*(comm.sync_shared_state(s) for comm, s in zip([a, b, c],
                                                                                 states)))
    assert [i.rx_bytes for i in again] == [0, 0, 0]


async def test_a_range_that_fails_half_way_is_resumed_not_counted_twice(peers, monkeypatch,
                                                                        caplog):
    """A source sends half of a range and dies: the half that arrived is kept and only the
    rest comes from the other source. Every byte crosses the wire once (the bytes read into
    the targets, and ``rx_bytes``, equal the total: not the total plus a range), ``done``
    never falls and ends at the total."""
    comms = await peers(3)
    good = random_bits(4 * PIECE, np.uint8, 4)
    xs = [good.copy(), good.copy(), np.zeros_like(good)]
    states = [pccl.SharedState({"k": x}, r) for x, r in zip(xs, [1, 1, 0])]
    source_of: dict[int, int] = {}  # id(protocol) -> peer id it fetches from
    partial, taken_back = Tally(), Tally()
    read = [0]  # body bytes read into targets, from every source
    real_connect, real_updated = transfer.connect, transfer._FetchProtocol.buffer_updated
    real_add = progress_mod.Meter.add
    never = asyncio.Event()

    async def connect(*args: Any) -> Any:
        source_of[id(args[-1])] = args[-2]
        return await real_connect(*args)

    def buffer_updated(self: transfer._FetchProtocol, nbytes: int) -> None:
        req = self.pending[0] if self.pending else None
        before = req.body if req is not None else 0
        real_updated(self, nbytes)
        if req is None:
            return
        read[0] += req.body - before
        if source_of.get(id(self)) == comms[0].peer_id and req.body >= 64 << 10:
            partial.add(req.body)

    def add(self: progress_mod.Meter, nbytes: int) -> None:
        if nbytes < 0:
            taken_back.add(nbytes)
        real_add(self, nbytes)

    class Half:
        """An entry that announces whole ranges but has only half of each."""

        nbytes = good.nbytes

        def __getitem__(self, s: slice) -> bytes:
            b = good[s]
            return b[: b.nbytes // 2].tobytes()

    served: list[str] = []

    async def serve_half(peer: int, key: str, rev: int) -> Any:
        served.append(key)
        if len(served) > 1:  # one half range; the connections' later requests wait
            await never.wait()
            return None
        return Half()

    monkeypatch.setattr(transfer, "connect", connect)
    monkeypatch.setattr(transfer._FetchProtocol, "buffer_updated", buffer_updated)
    monkeypatch.setattr(progress_mod.Meter, "add", add)
    state_server(comms[0]).lookup = serve_half
    calls = Calls()
    tasks = [asyncio.ensure_future(c.sync_shared_state(s, progress=p))
             for c, s, p in zip(comms, states, [None, None, calls])]
    await first_of(partial.reached(1), tasks[2])
    assert partial.items, tasks[2]
    with caplog.at_level(logging.INFO, logger="pccl_aio.state"):
        vanish(comms[0], tasks[0])
        infos = await asyncio.gather(tasks[1], tasks[2])
    assert xs[2].tobytes() == good.tobytes() and infos[1].rx_bytes == good.nbytes
    assert read[0] == good.nbytes, (read[0], good.nbytes)  # the half came once
    assert not taken_back.items, taken_back.items
    resumed = [r for r in caplog.records if "fetch the rest" in r.getMessage()]
    assert resumed and resumed[0].args[1] >= 64 << 10, resumed  # type: ignore[index]
    check_progress(calls, good.nbytes)
    never.set()
    await reap(tasks[0])


async def test_a_progress_that_is_not_callable_is_refused_before_anything_is_sent(master,
                                                                                   peers):
    log = MasterLog(master)
    a, b = await peers(2)
    sa, sb = pccl.SharedState({"k": u8(1)}, revision=1), pccl.SharedState({"k": u8(0)})
    for bad in ("bar", 3, object()):
        with pytest.raises(pccl.InvalidUsageError, match="progress"):
            await a.sync_shared_state(sa, progress=bad)  # type: ignore[arg-type]
    infos = await asyncio.gather(a.sync_shared_state(sa), b.sync_shared_state(sb))
    assert [i.rx_bytes for i in infos] == [0, 1024]
    assert len(log.received(a, m.VoteSync)) == 1  # only the vote of the sync that ran
