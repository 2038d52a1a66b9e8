"""The receive side trusts only what the plan says (issue 17, point 4), over real sockets.

Each test serves ``_Receiver``s on 127.0.0.1 (an OS-chosen port) around a ``Registry`` and
plays the sending side by hand: frames from the wrong connection or repeated, frames far
ahead or parked too long, the connection caps, the authenticated peer id, and TLS (no
SO_RCVLOWAT). A collective with a fake environment shows a repeated frame that arrives after
the run reported success still turns into a failure report.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trustme

from pccl_aio._peer.core.buffers import as_buffer
from pccl_aio._peer.data import receiver as rx
from pccl_aio._peer.data.core import ring
from pccl_aio._peer.data.core.scratch import ScratchPool
from pccl_aio._wire import data as wire
from tests.helpers import closed

pytestmark = pytest.mark.timeout(30)
CLOSED = 5.0  # the bound on waiting for a connection to be closed by the receiver


class Sink:
    data_ok = False  # its data never finishes before the test ends it
    """A running collective expecting each (phase, offset) once, as ``Collective`` does."""

    def __init__(self, predecessor: int, expected: dict[tuple[int, int], int],
                 changed: asyncio.Event) -> None:
        self.active, self.predecessor = True, predecessor
        self.expected = dict(expected)
        self.buf = bytearray(max(expected.values()))
        self.done: list[tuple[int, int, bytes]] = []
        self.errors: list[str] = []
        self.changed = changed

    seq = 0

    def sender(self, phase: int) -> int:
        return self.predecessor  # (a ring collective's: one sender for every phase)

    def waits_on(self, peer: int) -> bool:
        return peer == self.predecessor

    def at(self, seq: int) -> Sink:
        """Run as ``seq`` (as ``Collective.on_start`` sets it); for ``Registry.add``."""
        self.seq = seq
        return self

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        if self.expected.pop((phase, offset), -1) != length:
            return None
        return memoryview(self.buf)[:length]

    def on_segment(self, phase: int, offset: int, length: int, p0: float, p1: float) -> None:
        self.done.append((phase, offset, bytes(self.buf[:length])))
        self.changed.set()

    def on_error(self, reason: str, suspect: int = 0) -> None:
        self.errors.append(reason)
        self.changed.set()


def frame(seq: int, phase: int, off: int, payload: bytes) -> bytes:
    return wire.pack_header(wire.MAGIC, phase, 0, seq, off, len(payload), 0.0, 0.0) + payload


class Watched(rx._Receiver):
    """A receiver that sets ``changed`` after each of its callbacks (the tests wait on it)."""

    changed: asyncio.Event

    def buffer_updated(self, nbytes: int) -> None:
        super().buffer_updated(nbytes)
        self.changed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.changed.set()


class Served:
    """Receivers of one registry behind a real listening socket."""

    def __init__(self, reg: rx.Registry, peer: Callable[[], int], changed: asyncio.Event) -> None:
        self.reg, self.conns, self.port = reg, set[rx._Receiver](), 0
        self._peer, self.changed = peer, changed
        self.server: asyncio.Server | None = None
        self.clients: list[asyncio.StreamWriter] = []  # (closed by ``served``)

    def _make(self) -> rx._Receiver:
        peer = self._peer()  # (passed only when set: the constructor before issue 17 lacks it)
        r = Watched(self.reg, self.conns, *([peer] if peer >= 0 else []))
        r.changed = self.changed
        return r

    async def start(self, **kw: Any) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self._make, "127.0.0.1", 0, **kw)
        self.port = self.server.sockets[0].getsockname()[1]

    async def connect(self, peer: int, data: bytes = b"", index: int = 0, **kw: Any
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        r, w = await asyncio.open_connection("127.0.0.1", self.port, **kw)
        self.clients.append(w)
        w.write(wire.pack_hello(peer, index) + data)
        await w.drain()
        return r, w


@contextlib.asynccontextmanager
async def served(reg: rx.Registry, changed: asyncio.Event, peer: Callable[[], int] = lambda: -1,
                 **kw: Any) -> AsyncIterator[Served]:
    s = Served(reg, peer, changed)
    await s.start(**kw)
    try:
        yield s
    finally:
        assert s.server is not None
        s.server.close()
        for c in list(s.conns):
            c.close()
        for w in s.clients:
            w.close()


async def until(cond: Callable[[], bool], changed: asyncio.Event) -> None:
    """Wait until ``cond()``, checked after each receiver or sink callback (``changed``);
    bounded by the test's timeout."""
    while not cond():
        changed.clear()
        await changed.wait()


async def test_a_frame_from_another_peers_connection_fails_the_collective_and_is_closed() -> None:
    reg, ev = rx.Registry(), asyncio.Event()
    sink = Sink(1, {(ring.RS, 0): 8, (ring.RS, 8): 8}, ev)
    reg.add(5, sink.at(5))
    async with served(reg, ev) as s:
        _good, _gw = await s.connect(1, frame(5, ring.RS, 0, b"g" * 8))
        await until(lambda: len(sink.done) == 1, ev)
        bad, _bw = await s.connect(2, frame(5, ring.RS, 8, b"x" * 8))
        assert await closed(bad, CLOSED)
        assert len(sink.errors) == 1 and "not from its sender 1" in sink.errors[0]
        assert sink.done == [(ring.RS, 0, b"g" * 8)]  # the forged payload was never written
        assert (ring.RS, 8) in sink.expected  # and it took no place of a genuine frame
        assert len(s.conns) == 1  # the predecessor's own connection stays


async def test_a_repeated_phase_offset_fails_the_collective_and_closes_that_senders_connections(
        ) -> None:
    reg, ev = rx.Registry(), asyncio.Event()
    sink = Sink(1, {(ring.RS, 0): 8, (ring.AG, 8): 8}, ev)
    reg.add(3, sink.at(3))
    async with served(reg, ev) as s:
        first, _fw = await s.connect(1, frame(3, ring.RS, 0, b"a" * 8), index=0)
        await until(lambda: len(sink.done) == 1, ev)
        second, _sw = await s.connect(1, frame(3, ring.RS, 0, b"b" * 8), index=1)
        # which one forged is unknown
        assert await closed(second, CLOSED) and await closed(first, CLOSED)
        assert len(sink.errors) == 1 and "unexpected frame" in sink.errors[0]
        assert sink.done == [(ring.RS, 0, b"a" * 8)]


async def test_a_frame_of_the_wrong_length_fails_the_collective() -> None:
    reg, ev = rx.Registry(), asyncio.Event()
    sink = Sink(1, {(ring.RS, 0): 8}, ev)
    reg.add(3, sink.at(3))
    async with served(reg, ev) as s:
        r, _w = await s.connect(1, frame(3, ring.RS, 0, b""))  # a bare header
        assert await closed(r, CLOSED)
        assert sink.done == [] and len(sink.errors) == 1


async def test_a_frame_far_ahead_of_the_announced_seqs_closes_the_connection() -> None:
    from pccl_aio._peer.data.core import guard  # (new in issue 17)

    reg, ev = rx.Registry(), asyncio.Event()
    reg.skip(10)
    async with served(reg, ev) as s:
        _near, _nw = await s.connect(1, frame(10 + guard.SEQ_AHEAD, ring.RS, 0, b"n"))
        await until(lambda: reg.parked == 1, ev)
        far, _fw = await s.connect(1, frame(11 + guard.SEQ_AHEAD, ring.RS, 0, b"f"))
        assert await closed(far, CLOSED)
        assert reg.parked == 1 and len(s.conns) == 1  # the near one waits, parked


async def test_a_connection_holds_one_parked_frame_and_is_closed_at_the_park_deadline() -> None:
    reg, ev = rx.Registry(park_timeout=0.3), asyncio.Event()
    reg.skip(1)
    loop = asyncio.get_running_loop()
    async with served(reg, ev) as s:
        flood = b"".join(frame(seq, ring.RS, 0, b"") for seq in range(2, 2002))
        t0 = loop.time()
        r, w = await s.connect(7, flood)
        await until(lambda: reg.parked == 1, ev)
        (conn,) = s.conns
        assert conn._frame[0] == 2  # one header taken; the rest waits in the kernel, unread
        assert await closed(r, CLOSED)
        elapsed = loop.time() - t0
        assert 0.25 <= elapsed < 2.0, elapsed
        assert reg.parked == 0 and not s.conns
        w.close()


async def test_an_announced_seq_unparks_and_cancels_the_deadline() -> None:
    reg, ev = rx.Registry(park_timeout=30.0), asyncio.Event()
    reg.skip(1)
    sink = Sink(4, {(ring.RS, 0): 3}, ev)
    async with served(reg, ev) as s:
        _r, _w = await s.connect(4, frame(2, ring.RS, 0, b"abc"))
        await until(lambda: reg.parked == 1, ev)
        (conn,) = s.conns
        assert conn._park_timer is not None
        reg.add(2, sink.at(2))
        await until(lambda: bool(sink.done), ev)
        assert sink.done == [(ring.RS, 0, b"abc")] and sink.errors == []
        assert conn._park_timer is None and reg.parked == 0


async def test_a_parked_connection_that_goes_is_dropped_with_its_frames() -> None:
    reg, ev = rx.Registry(), asyncio.Event()
    reg.skip(1)
    sink = Sink(4, {(ring.RS, 0): 3}, ev)
    async with served(reg, ev) as s:
        _r, w = await s.connect(4, frame(2, ring.RS, 0, b"abc") + frame(3, ring.RS, 0, b"d"))
        await until(lambda: reg.parked == 1, ev)
        w.close()  # gone: unseen while parked (reading is paused) ...
        reg.add(2, sink.at(2))  # ... until seq 2 starts: its frame lands, and it parks on seq 3
        await until(lambda: bool(sink.done) and reg.parked == 1, ev)
        reg.skip(3)  # seq 3 aborted before it began here: its frame is stale, then the EOF
        await until(lambda: not s.conns, ev)
        assert reg.parked == 0 and sink.done == [(ring.RS, 0, b"abc")]


async def test_connections_are_capped_per_sending_peer_and_in_total() -> None:
    from pccl_aio._peer.data.core import guard  # (new in issue 17)

    assert (guard.MAX_CONNS_PER_PEER, guard.MAX_CONNS) == (256, 4096)
    reg, ev = rx.Registry(caps=guard.ConnCaps(per_peer=3, total=5)), asyncio.Event()
    async with served(reg, ev) as s:
        ones = [await s.connect(1, index=i) for i in range(3)]
        await until(lambda: reg.caps.of(1) == 3, ev)
        fourth, _ = await s.connect(1, index=3)
        assert await closed(fourth, CLOSED)
        twos = [await s.connect(2, index=i) for i in range(2)]
        await until(lambda: reg.caps.count == 5, ev)
        third_peer, _ = await s.connect(3)
        assert await closed(third_peer)
        ones[0][1].close()  # one of peer 1's goes: a new one from peer 1 is admitted again
        await until(lambda: reg.caps.of(1) == 2, ev)
        again, _ = await s.connect(1, index=0)
        await until(lambda: reg.caps.of(1) == 3, ev)
        assert reg.caps.count == 5 and len(s.conns) == 5
        for _r, w in [*ones[1:], *twos, (again, _)]:
            w.close()
        await until(lambda: reg.caps.count == 0, ev)


async def test_the_hello_must_name_the_authenticated_peer() -> None:
    reg, ev = rx.Registry(), asyncio.Event()
    async with served(reg, ev, peer=lambda: 3) as s:
        liar, _lw = await s.connect(4)
        assert await closed(liar, CLOSED)
        _honest, _hw = await s.connect(3)
        await until(lambda: reg.caps.of(3) == 1, ev)
        assert reg.caps.of(4) == 0


def _self_signed(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


@pytest.mark.parametrize("handed_over", [False, True])
async def test_no_rcvlowat_under_tls(tmp_path: Path, handed_over: bool) -> None:
    """Over TLS the receiver never sets SO_RCVLOWAT; frames of several MiB land whole, both
    when it is the protocol from the start and when an open TLS transport is handed to it
    (``set_protocol`` then ``connection_made``, as a handshake in front of it does)."""
    server_ctx, client_ctx = _self_signed(tmp_path)
    reg, conns, ev = rx.Registry(), set[rx._Receiver](), asyncio.Event()
    size = 3 * (1 << 20) + 5
    sink = Sink(1, {(ring.RS, 0): size}, ev)
    reg.add(2, sink.at(2))
    made: list[rx._Receiver] = []

    class Placeholder(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            r = rx._Receiver(reg, conns)
            made.append(r)
            transport.set_protocol(r)
            r.connection_made(transport)

    def factory() -> asyncio.BaseProtocol:
        if handed_over:
            return Placeholder()
        r = rx._Receiver(reg, conns)
        made.append(r)
        return r

    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        payload = np.random.default_rng(0).integers(0, 255, size, np.uint8).tobytes()
        _r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
        w.write(wire.pack_hello(1, 0) + frame(2, ring.RS, 0, payload))
        await w.drain()
        await until(lambda: bool(sink.done or sink.errors), ev)
        assert sink.errors == [] and sink.done == [(ring.RS, 0, payload)]
        assert made and all(r._sock is None for r in made)
        w.close()
    finally:
        server.close()
        for c in list(conns):
            c.close()


# ---- the collective's side: a repeated frame after its run reported success -------------------
class FakeLink:
    def has_room(self) -> bool:
        return True

    async def wait_room(self) -> None:
        return None

    def send_now(self, header: bytes, payload: memoryview) -> tuple[Any, int]:
        return self, 0

    def written(self, position: int) -> bool:
        return True


class FakeEnv:
    def __init__(self) -> None:
        from pccl_aio._net.tasks import TaskSet

        self.scratch, self.registry = ScratchPool(), rx.Registry()
        self.tasks, self.p2p_connections, self.data_timeout = TaskSet("test"), 1, 10.0
        self.reports: list[tuple[int, bool]] = []
        self.reported = asyncio.Event()

    async def link(self, peer_id: int) -> FakeLink:
        return FakeLink()

    def report(self, tag: int, seq: int, ok: bool, reason: str) -> None:
        self.reports.append((seq, ok))
        self.reported.set()


async def test_a_repeated_frame_after_the_success_report_reports_a_failure() -> None:
    """Before the fix the repeated frame only set an error that nothing read: the success
    report stood and the master completed the collective on the first (forged) bytes."""
    from pccl_aio._peer.data.collective import Collective
    from pccl_aio._peer.data.core.gather import GATHER_MAX
    from pccl_aio._types import ReduceOp

    env = FakeEnv()
    n = GATHER_MAX // 4 + 2  # above the small all-reduce's size: the ring's frames
    x = np.ones(n, np.float32)
    buf = as_buffer(x, writable=True)
    coll = Collective(env, 1, buf, buf, ReduceOp.SUM, in_place=True)  # type: ignore[arg-type]
    coll.save_input()  # (after the vote, as the communicator does)
    coll.on_start(9, [0, 1], 1)  # rank 1 of 2: receives from peer 0
    expected = ring.RingPlan(1, 2, n, 4, 1 << 18).expected()
    async with served(env.registry, env.reported) as s:
        data = b"".join(frame(9, ph, off, np.full(n // 4, 2, np.float32).tobytes())
                        for (ph, off), n in sorted(expected.items()))
        first, _fw = await s.connect(0, data)
        await until(lambda: bool(env.reports), env.reported)
        assert env.reports == [(9, True)]
        ph, off = min(expected)
        again, _aw = await s.connect(0, frame(9, ph, off, bytes(expected[(ph, off)])), index=1)
        assert await closed(again, CLOSED) and await closed(first, CLOSED)
        await until(lambda: len(env.reports) == 2, env.reported)
        assert env.reports == [(9, True), (9, False)]
    coll.on_abort("the master aborted it")
    with pytest.raises(Exception, match="aborted"):
        await coll.future
    assert (x == 1).all()  # the in-place input was put back
    await env.tasks.close()
