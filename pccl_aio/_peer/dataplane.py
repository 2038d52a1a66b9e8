"""The data plane: pooled TCP links to the ring successor, zero-copy receive from predecessors.

Wire format. A connection opens with ``HELLO`` (magic, version, sender peer id, connection
index). Then frames: a fixed ``HEADER`` (magic, tag, seq, phase, byte offset, byte length, two
float64 quantization parameters) followed by ``length`` payload bytes. ``seq`` is the master's
global collective number, so frames of an aborted attempt (older seq) are dropped, and frames
of a collective this peer has not yet been told about (newer seq) pause that connection until
the master's ``CollectiveStart`` arrives.

Receive is zero-copy: ``_Receiver`` is an ``asyncio.BufferedProtocol`` whose ``get_buffer``
hands the kernel the destination slice (or the collective's scratch) directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from typing import Final, Protocol, cast

from .._net.stream import own_socket, set_nodelay

log = logging.getLogger("pccl_aio.dataplane")

MAGIC: Final = 0x50434131  # "PCA1"
HELLO: Final = struct.Struct("<IHHQH6x")  # magic, version, reserved, peer id, conn index
HEADER: Final = struct.Struct("<IBxxxQQQQdd")  # magic, phase, tag, seq, offset, length, p0, p1
DATA_VERSION: Final = 1
LOWAT_CAP: Final = 1 << 20  # the largest SO_RCVLOWAT asked for (one pipeline segment)
_SOL_SOCKET: Final = socket.SOL_SOCKET
_SO_RCVLOWAT: Final = getattr(socket, "SO_RCVLOWAT", 18)  # Linux's value where it is missing


class Sink(Protocol):
    """A running collective as the receiver sees it."""

    active: bool

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        """Where the payload of a frame goes, or None if the frame is illegal."""

    def on_segment(self, phase: int, offset: int, length: int, p0: float, p1: float) -> None:
        """A whole payload arrived."""

    def on_error(self, reason: str) -> None:
        """The frame stream broke the protocol."""


class Registry:
    """seq -> running collective, shared by all receive connections of one communicator."""

    def __init__(self) -> None:
        self.sinks: dict[int, Sink] = {}
        self.max_seq = 0
        self._parked: list[_Receiver] = []

    def add(self, seq: int, sink: Sink) -> None:
        """Register a collective; wakes connections parked on its frames."""
        self.sinks[seq] = sink
        self.skip(seq)

    def skip(self, seq: int) -> None:
        """``seq`` is known now: re-route parked connections (its frames are stale unless ``add``ed)."""
        self.max_seq = max(self.max_seq, seq)
        parked, self._parked = self._parked, []
        for r in parked:
            r.unpark()

    def remove(self, seq: int) -> None:
        """Stop accepting frames of ``seq``; later frames of it are discarded."""
        self.sinks.pop(seq, None)

    def park(self, r: _Receiver) -> None:
        self._parked.append(r)

    def forget(self, r: _Receiver) -> None:
        with contextlib.suppress(ValueError):
            self._parked.remove(r)


_S_HELLO, _S_HEADER, _S_PAYLOAD, _S_DISCARD = range(4)


class _Receiver(asyncio.BufferedProtocol):
    """One incoming data connection; writes payloads straight into collectives' buffers."""

    def __init__(self, registry: Registry, conns: set[_Receiver]) -> None:
        self._reg = registry
        self._conns = conns
        self._state = _S_HELLO
        self._hdr = bytearray(max(HEADER.size, HELLO.size))
        self._hdr_view = memoryview(self._hdr)
        self._got = 0
        self._want = HELLO.size
        self._sink: Sink | None = None
        self._target: memoryview | None = None
        self._frame: tuple[int, int, int, float, float] = (0, 0, 0, 0.0, 0.0)
        self._discard = bytearray(1 << 16)
        self._transport: asyncio.Transport | None = None
        self._want_len = 0
        self._sock: socket.socket | None = None  # for SO_RCVLOWAT; None if refused
        self._lowat = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        set_nodelay(transport)
        self._sock = own_socket(transport)  # for SO_RCVLOWAT, set twice per frame
        self._conns.add(self)

    def _set_lowat(self, n: int) -> None:
        """Wake for this connection only once ``n`` bytes are readable (``SO_RCVLOWAT``).

        A payload is then read in one or two large reads instead of one callback per arriving
        64 KiB, which saves interpreter time and wake-ups. Invariant: ``n`` never exceeds the
        bytes still due in the current frame, so the wake-up always comes (EOF and errors
        wake regardless)."""
        if n != self._lowat and self._sock is not None:
            self._lowat = n
            try:
                self._sock.setsockopt(_SOL_SOCKET, _SO_RCVLOWAT, n)
            except (OSError, AttributeError):
                self._sock.close()
                self._sock, self._lowat = None, 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._conns.discard(self)
        self._reg.forget(self)
        self._transport = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == _S_PAYLOAD:
            sink = self._sink
            if sink is not None and sink.active and self._target is not None:
                return self._target[self._got : self._want]
            self._state = _S_DISCARD  # the collective was aborted mid-frame: drop the rest
        if self._state == _S_DISCARD:
            return memoryview(self._discard)[: min(len(self._discard), self._want - self._got)]
        return self._hdr_view[self._got : self._want]

    def buffer_updated(self, nbytes: int) -> None:
        got = self._got = self._got + nbytes
        if got < self._want:
            if self._want - got < self._lowat:  # keep the invariant (payload or discard)
                self._set_lowat(self._want - got)
            return
        state = self._state
        if state == _S_PAYLOAD:  # the hot path first: one call into the sink per frame
            sink = self._sink
            self._sink = self._target = None
            self._expect_header()
            if sink is not None and sink.active:
                _seq, phase, off, p0, p1 = self._frame
                sink.on_segment(phase, off, self._want_len, p0, p1)
            return
        if state == _S_HELLO:
            magic, version, _, _peer, _idx = HELLO.unpack_from(self._hdr)
            if magic != MAGIC or version != DATA_VERSION:
                return self._violation("bad data-plane hello")
            self._expect_header()
        elif state == _S_HEADER:
            magic, phase, _tag, seq, off, length, p0, p1 = HEADER.unpack_from(self._hdr)
            if magic != MAGIC:
                return self._violation("bad frame magic")
            self._frame = (seq, phase, off, p0, p1)
            self._route(seq, phase, off, length)
        else:
            self._expect_header()

    def _expect_header(self) -> None:
        self._state, self._got, self._want = _S_HEADER, 0, HEADER.size
        self._set_lowat(1)

    def _route(self, seq: int, phase: int, off: int, length: int) -> bool:
        """Pick where the payload goes; True if the connection was parked instead."""
        self._want_len = length
        self._got, self._want = 0, length
        sink = self._reg.sinks.get(seq)
        if sink is None:
            if seq > self._reg.max_seq and self._transport is not None:
                # A collective we have not heard of yet: wait for the master's CollectiveStart.
                self._state = _S_HEADER
                self._got, self._want = HEADER.size, HEADER.size
                self._transport.pause_reading()
                self._reg.park(self)
                return True
            self._state = _S_DISCARD  # stale frame of an aborted attempt
        else:
            target = sink.target(phase, off, length)
            if target is None:
                sink.on_error(f"unexpected frame phase={phase} offset={off} length={length}")
                self._state = _S_DISCARD
            else:
                self._sink, self._target, self._state = sink, target, _S_PAYLOAD
                self._set_lowat(max(1, min(length, LOWAT_CAP)))
        if length == 0:
            self.buffer_updated(0)
        return False

    def unpark(self) -> None:
        """Re-route the held header now that the registry changed, then resume reading."""
        if self._transport is None:
            return
        seq, phase, off, _p0, _p1 = self._frame
        if not self._route(seq, phase, off, self._want_len) and self._transport is not None:
            with contextlib.suppress(Exception):
                self._transport.resume_reading()

    def eof_received(self) -> bool:
        return False

    def _violation(self, reason: str) -> None:
        log.warning("closing data connection: %s", reason)
        if self._transport is not None:
            self._transport.abort()


class Listener:
    """The p2p listening socket of one communicator."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.conns: set[_Receiver] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int = 0) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Receiver(self.registry, self.conns), host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self.conns):
            c.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)


class _Sender(asyncio.Protocol):
    """One outgoing data connection; tells its link when it has room again."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.error: Exception | None = None
        self.paused = False
        self.queued = 0  # bytes ever handed to the transport (its FIFO position)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        set_nodelay(transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)

    def connection_lost(self, exc: Exception | None) -> None:
        self.error = exc or ConnectionResetError("data connection closed")
        self.transport = None
        self.link.wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.link.wake()

    def data_received(self, data: bytes) -> None:
        pass  # the receiving side never writes

    @property
    def buffered(self) -> int:
        t = self.transport
        return t.get_write_buffer_size() if t is not None else 1 << 62

    def written(self, position: int) -> bool:
        """The bytes queued up to ``position`` were all passed to the kernel (their buffers
        are no longer referenced). False once the connection is gone."""
        return self.transport is not None and self.queued - self.buffered >= position


# Per-connection user-space queue limits: a frame is assigned to a connection only when one
# is under 256 KiB, so few bytes sit queued (and go cold) behind the kernel's own send buffer,
# which holds what is in flight. Paired P = 3 64 MiB loopback runs: 1 MiB took 0.94-0.97 of
# 4 MiB's time, 256 KiB 0.95-0.97 of 1 MiB's; the WAN bench (K = 8) read 0.81-0.85 of the
# link with either (bench/RESULTS.md, session 5).
WRITE_HIGH, WRITE_LOW = 256 << 10, 64 << 10


class Link:
    """``k`` TCP connections to one peer's listener.

    Each frame goes to the connection with the fewest bytes waiting, so a stream that slows
    down (loss, a small window) gets less and the others carry the rest: the aggregate is the
    sum of the streams' rates, not ``k`` times the slowest one's.
    """

    def __init__(self, peer_id: int, host: str, port: int, k: int, me: int) -> None:
        self.peer_id, self.host, self.port, self.k, self.me = peer_id, host, port, k, me
        self.senders: list[_Sender] = []
        self._ready: asyncio.Task[None] | None = None
        self._room: asyncio.Future[None] | None = None

    async def open(self) -> None:
        """Connect all ``k`` connections (once; concurrent callers share the attempt)."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._connect())
        await asyncio.shield(self._ready)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()

        async def one(i: int) -> _Sender:
            _, proto = await loop.create_connection(lambda: _Sender(self), self.host, self.port)
            assert proto.transport is not None
            proto.transport.write(HELLO.pack(MAGIC, DATA_VERSION, 0, self.me, i))
            proto.queued = HELLO.size
            return proto

        self.senders = list(await asyncio.gather(*(one(i) for i in range(self.k))))

    @property
    def broken(self) -> bool:
        return any(s.error is not None for s in self.senders)

    def wake(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    async def wait_room(self) -> None:
        """Wait until some connection takes a frame (``has_room``) or one of them is gone
        (``send_now`` then raises ConnectionResetError and the collective fails). Cancelling
        just stops waiting."""
        while not (self.has_room() or self.broken):
            if self._room is None:
                self._room = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._room)

    def has_room(self) -> bool:
        """Some connection takes a frame now without exceeding its write buffer limit."""
        for s in self.senders:  # a loop, not any(genexpr): this runs once per frame
            if not s.paused and s.error is None and s.transport is not None:
                return True
        return False

    def send_now(self, header: bytes, payload: memoryview) -> tuple[_Sender, int]:
        """Queue one frame on the least loaded connection at once (no waiting: the caller
        checked ``has_room`` or waited in ``wait_room``); returns that connection and the
        frame's end position (``_Sender.written`` tells when ``payload`` may be reused).
        Raises ConnectionResetError if a connection of the link is gone (the collective then
        fails and is retried on a fresh link). Frames left queued by an aborted attempt are
        dropped by the receiver as stale."""
        senders = self.senders
        best = senders[0]
        if len(senders) > 1:
            for s in senders:
                if s.error is not None or s.transport is None:
                    raise ConnectionResetError(f"data connection lost: {s.error}")
                if (best.paused, best.buffered) > (s.paused, s.buffered):
                    best = s
        t = best.transport
        if best.error is not None or t is None:
            raise ConnectionResetError(f"data connection lost: {best.error}")
        n = len(payload)
        if n:  # one writev for both: a syscall per frame, not two
            t.writelines((header, payload))
        else:
            t.write(header)
        end = best.queued = best.queued + len(header) + n
        return best, end

    def close(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()
        for s in self.senders:
            if s.transport is not None:
                s.transport.abort()
