"""Link measurement for ``optimize_topology()``: the sender's source and the receiver's sink,
over data-listener connections of handshake role ``ROLE_MEASURE`` (pair keys as data links).

Per connection, after the handshake::

    sender -> receiver  HEADER   milliseconds to measure, pings (capped by the receiver)
    pings times:        8 bytes there, echoed back (the sender times each round trip)
    sender -> receiver  bytes, until the summary arrives
    receiver -> sender  SUMMARY  bytes received and nanoseconds over the second half of the
                                 window that opens at the first data byte

The receiver counts and drops what it reads, so a hostile sender costs it no memory; it
bounds a connection's life (``SINK_LIFETIME``), its bytes (``MAX_BYTES``) and the number of
measurement connections at once (``MAX_SINKS``). The sender bounds connecting, the whole
measurement and what it buffers from the receiver. Rates come from the receiver's clock, so the
sender's socket buffers and the path's queues do not inflate them. The window lasts the
header's time but at least ``WINDOW_RTTS`` round trips (the least gap the receiver saw
between a ping's echo and the next ping), and only its second half counts: TCP's slow start
and receive-window growth take some round trips, and on a long path (100 ms) a window of
0.5 s counted whole read every link at a fraction of its rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import struct
import time
from collections.abc import Callable
from typing import Final, cast

from ..._net.handshake import Handoff, KeyFor, connect
from ..._net.tasks import TaskSet
from ..._wire import auth
from ..._wire import messages as m
from ..core.config import PeerConfig
from .keys import KeyRing

__all__ = ["Measurer", "measure_link"]

HEADER: Final = struct.Struct("<IB3x")  # milliseconds, pings
PING: Final = 8
SUMMARY: Final = struct.Struct("<QQ")  # bytes, nanoseconds
PINGS: Final = 3
MAX_PINGS: Final = 8
WINDOW_RTTS: Final = 12
MAX_BYTES: Final = 1 << 34  # per connection: ends the window early (a 10 Tbit/s link's worth)
MAX_SINKS: Final = 2 * m.MAX_MEASURE_STREAMS
CONNECT_TIMEOUT: Final = 5.0
SINK_LIFETIME: Final = m.MAX_MEASURE_SECONDS + 2 * CONNECT_TIMEOUT  # accept to close, at most
CHUNK: Final = memoryview(bytes(256 << 10))
_SCRATCH = bytearray(256 << 10)  # every sink reads into it: the bytes are dropped


class _MeasureSink(asyncio.BufferedProtocol):
    """The receiver's side of one measurement connection."""

    def __init__(self, sinks: set[_MeasureSink]) -> None:
        self._sinks = sinks
        self._head = bytearray()
        self._pings = -1  # unknown until the header arrived
        self._seconds = 0.0
        self._start = 0.0
        self._rtt = 0.0  # the least gap from an echo to the next ping
        self._echoed = 0.0
        self._bytes = 0
        self._done = False
        self.transport: asyncio.Transport | None = None
        self._timers: list[asyncio.TimerHandle] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._sinks.add(self)
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(SINK_LIFETIME, self.close))

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(_SCRATCH)

    def buffer_updated(self, nbytes: int) -> None:
        view = memoryview(_SCRATCH)[:nbytes]
        while view and self._pings != 0 and not self._done:  # header, then pings
            need = (HEADER.size if self._pings < 0 else PING) - len(self._head)
            self._head += view[:need]
            view = view[need:]
            if len(self._head) < (HEADER.size if self._pings < 0 else PING):
                return
            now = time.monotonic()
            if self._pings < 0:
                ms, pings = HEADER.unpack(self._head)
                self._seconds = ms / 1000
                self._pings = min(pings, MAX_PINGS)
            else:
                if self._echoed:
                    gap = now - self._echoed
                    self._rtt = min(self._rtt, gap) if self._rtt else gap
                assert self.transport is not None
                self.transport.write(bytes(self._head))
                self._echoed = now
                self._pings -= 1
            self._head.clear()
        if not view or self._done:
            return
        if not self._start:  # the window opens; its second half is counted
            window = min(max(self._seconds, WINDOW_RTTS * self._rtt), m.MAX_MEASURE_SECONDS)
            loop = asyncio.get_running_loop()
            self._start = time.monotonic() + window / 2
            self._timers.append(loop.call_later(window, self._finish))
        if time.monotonic() >= self._start:
            self._bytes += len(view)
            if self._bytes >= MAX_BYTES:
                self._finish()

    def _finish(self) -> None:
        """Send the summary, stop reading; the sender closes (or the lifetime ends)."""
        if self._done or self.transport is None:
            return
        self._done = True
        elapsed = max(time.monotonic() - self._start, 0.0)
        self.transport.write(SUMMARY.pack(self._bytes, int(elapsed * 1e9)))
        self.transport.pause_reading()
        self._timers.append(asyncio.get_running_loop().call_later(2.0, self.close))

    def eof_received(self) -> bool:
        self._finish()
        return True

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._sinks.discard(self)
        self.transport = None
        for t in self._timers:
            t.cancel()


class _MeasureSource(asyncio.Protocol):
    """The sender's side of one measurement connection."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.paused = False
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=1 << 20)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > SUMMARY.size + MAX_PINGS * PING:  # not what a sink sends
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    async def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            if self.closed:
                raise ConnectionResetError("the measured peer closed the connection")
            await self._wait()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def run(self, seconds: float, pings: int) -> tuple[int, int, float]:
        """(bytes, nanoseconds) the receiver counted, and the least round trip in seconds."""
        assert self.transport is not None
        self.transport.write(HEADER.pack(int(seconds * 1000), pings))
        rtt = math.inf
        for i in range(pings):
            t0 = time.perf_counter()
            self.transport.write(struct.pack("<Q", i))
            await self.read(PING)
            rtt = min(rtt, time.perf_counter() - t0)
        written = 0
        while len(self.buf) < SUMMARY.size:
            if self.closed:
                raise ConnectionResetError("the measured peer closed the connection")
            if self.paused or written >= 16:
                written = 0
                await (self._wait() if self.paused else asyncio.sleep(0))  # let others run
                continue
            self.transport.write(CHUNK)
            written += 1
        nbytes, ns = SUMMARY.unpack(await self.read(SUMMARY.size))
        return nbytes, ns, rtt

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def measure_link(addr: m.PeerAddr, key: bytes, config: PeerConfig, me: int,
                       seconds: float, streams: int) -> tuple[float, float]:
    """(bits/s, one-way latency in seconds) from this peer to ``addr`` over ``streams``
    connections for ``seconds`` (longer on a long path: ``WINDOW_RTTS``); (0.0, 0.0) if none
    connects within ``CONNECT_TIMEOUT``. Blocks at most ``MAX_MEASURE_SECONDS`` plus
    2 * ``CONNECT_TIMEOUT``; cancelling closes all."""
    tls = config.ssl if config.ssl_server is not None else None
    sources: list[_MeasureSource] = []

    async def one() -> tuple[int, int, float]:
        p = _MeasureSource()
        sources.append(p)
        async with asyncio.timeout(CONNECT_TIMEOUT):
            await connect(addr.host, addr.port, tls, auth.ROLE_MEASURE, key, me, addr.peer_id, p)
        async with asyncio.timeout(m.MAX_MEASURE_SECONDS + CONNECT_TIMEOUT):
            return await p.run(seconds, PINGS)

    try:
        results = await asyncio.gather(*(one() for _ in range(streams)), return_exceptions=True)
    finally:
        for p in sources:
            p.close()
    bps, rtt = 0.0, math.inf
    for r in results:
        if isinstance(r, BaseException):
            if isinstance(r, asyncio.CancelledError):
                raise r
            continue
        nbytes, ns, t = r
        if ns > 0:
            bps += 8 * nbytes / (ns / 1e9)
        rtt = min(rtt, t)
    if bps <= 0 or not math.isfinite(rtt):
        return 0.0, 0.0
    return min(bps, 1e13), min(rtt / 2, 60.0)


class Measurer:
    """The measurements of one communicator: the links the master asks for (``on_plan``; each
    answered by ``MeasureReport`` through ``send``, and given to ``measured``: the data plane
    sizes its links with them) and the sinks of measurement connections its data listener
    accepted (``accept``)."""

    def __init__(self, config: PeerConfig, keys: KeyRing,
                 send: Callable[[m.MeasureReport], None],
                 measured: Callable[[int, float], None] | None = None) -> None:
        self._config, self._keys, self._send = config, keys, send
        self._measured = measured  # (peer id, bits/s) of each link measured here, if reachable
        self.key_for: KeyFor = keys.accepting(auth.ROLE_MEASURE)
        self._sinks: set[_MeasureSink] = set()
        self._tasks = TaskSet("pccl_aio link measurement")

    @property
    def receiving(self) -> int:
        """Measurement connections open on this side now (at most ``MAX_SINKS``)."""
        return len(self._sinks)

    def accept(self, conn: Handoff) -> None:
        """Take over an authenticated measurement connection (closed beyond ``MAX_SINKS``)."""
        if len(self._sinks) >= MAX_SINKS:
            conn.transport.abort()
            return
        conn.hand_over(_MeasureSink(self._sinks))

    def on_plan(self, plan: m.MeasurePlan) -> None:
        """Measure the link the master asked for, in the background; report the result."""
        self._tasks.spawn(self._measure(plan), name=f"pccl_aio measure {plan.to.peer_id}")

    async def _measure(self, plan: m.MeasurePlan) -> None:
        bps, latency = 0.0, 0.0
        with contextlib.suppress(OSError, TimeoutError):
            bps, latency = await measure_link(plan.to, self._keys.key(plan.to.peer_id),
                                              self._config, self._keys.me, plan.seconds,
                                              plan.streams)
        self._send(m.MeasureReport(plan.round, plan.to.peer_id, bps, latency))
        if bps > 0 and self._measured is not None:
            self._measured(plan.to.peer_id, bps)

    async def close(self) -> None:
        """End every measurement and close every sink."""
        await self._tasks.close()
        for s in list(self._sinks):
            s.close()
