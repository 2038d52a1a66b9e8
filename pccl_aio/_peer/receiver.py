"""The data plane's receiving side: the listener and its zero-copy receive connections.

Frames (``_wire/data.py``) are routed by ``seq``, the master's global collective number:
frames of an aborted attempt (older seq) are dropped, and frames of a collective this peer
has not yet been told about (newer seq) pause that connection until the master's
``CollectiveStart`` arrives. Receive is zero-copy: ``_Receiver`` is an
``asyncio.BufferedProtocol`` whose ``get_buffer`` hands the kernel the destination slice (or
the collective's receive slot) directly. The sending side is ``link.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Final, Protocol, cast

from .._net.stream import own_socket, set_nodelay
from .._wire.data import HEADER, HELLO, MAGIC, parse_hello, unpack_header

log = logging.getLogger("pccl_aio.dataplane")

LOWAT_CAP: Final = 1 << 20  # the largest SO_RCVLOWAT asked for (one pipeline segment)
_SOL_SOCKET: Final = socket.SOL_SOCKET
_SO_RCVLOWAT: Final = getattr(socket, "SO_RCVLOWAT", 18)  # Linux's value where it is missing


class Sink(Protocol):
    """A running collective as the receiver sees it."""

    active: bool
    predecessor: int  # the peer id whose frames it receives

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

    def lost(self, peer_id: int, reason: str) -> None:
        """A data connection from ``peer_id`` closed: fail every running collective that
        receives from it now, instead of waiting for its data deadline."""
        for sink in list(self.sinks.values()):
            if sink.active and sink.predecessor == peer_id:
                sink.on_error(reason)

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
        self._peer = -1  # the sending peer's id, from its HELLO

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
        if self._peer >= 0:
            why = f"connection reset ({exc!r})" if exc is not None else "connection closed"
            self._reg.lost(self._peer, f"data connection from peer {self._peer} lost: {why}")
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
            hello = parse_hello(self._hdr)
            if hello is None:
                return self._violation("bad data-plane hello")
            self._peer = hello[0]
            self._expect_header()
        elif state == _S_HEADER:
            magic, phase, _tag, seq, off, length, p0, p1 = unpack_header(self._hdr)
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
