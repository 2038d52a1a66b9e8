"""The data receiver's SO_RCVLOWAT never asks for more bytes than the current frame still owes.

A larger low-water mark than what will ever arrive would leave the last bytes of a frame
unread until some later traffic (or forever): this drives ``_Receiver`` with a fake transport
and checks the invariant after every read, for payloads, discarded frames and headers.
"""

from __future__ import annotations

import socket

from pccl_aio._peer.data import receiver as dp
from pccl_aio._peer.data.core import ring
from pccl_aio._wire import data as wire


class FakeTransport:
    """A transport around one end of a real socket pair, so that the receiver's
    SO_RCVLOWAT calls reach a real socket and can be read back."""

    def __init__(self) -> None:
        self.sock, self._peer = socket.socketpair()
        self.paused = False
        self.seen: list[int] = []

    @property
    def lowat(self) -> int:
        return self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)

    def get_extra_info(self, name: str) -> object:
        return self.sock if name == "socket" else None

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self.sock.close()
        self._peer.close()


class Sink:
    data_ok = False  # its data never finishes before the test ends it
    def __init__(self, length: int) -> None:
        self.active = True
        self.predecessor = 1  # the test's sender: frames from anyone else are refused
        self.buf = bytearray(length)
        self.done: list[tuple[int, int]] = []
        self.errors: list[str] = []

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
        return memoryview(self.buf)[:length]

    def on_segment(self, phase: int, offset: int, length: int, p0: float, p1: float) -> None:
        self.done.append((offset, length))

    def on_error(self, reason: str, suspect: int = 0) -> None:  # (the test's close fails it)
        self.errors.append(reason)


def _feed(r: dp._Receiver, data: bytes, chunk: int, t: FakeTransport, owed: list[int]) -> None:
    """Deliver ``data`` in reads of at most ``chunk`` bytes, the way uvloop calls a
    BufferedProtocol, checking the low-water mark against what is still owed."""
    pos = 0
    while pos < len(data):
        buf = r.get_buffer(-1)
        n = min(len(buf), chunk, len(data) - pos)
        buf[:n] = data[pos : pos + n]
        r.buffer_updated(n)
        pos += n
        owed[0] -= n
        lowat = t.lowat
        t.seen.append(lowat)
        assert lowat <= max(1, owed[0]) or owed[0] == 0, (lowat, owed[0])


def _frame(seq: int, off: int, payload: bytes) -> bytes:
    return wire.pack_header(wire.MAGIC, ring.RS, 0, seq, off, len(payload), 0.0, 0.0) + payload


def test_lowat_follows_each_frame_and_never_exceeds_what_is_owed() -> None:
    reg = dp.Registry()
    r = dp._Receiver(reg, set())
    t = FakeTransport()
    r.connection_made(t)  # type: ignore[arg-type]
    size = 3 * (1 << 20) + 123  # more than the 1 MiB cap, not a multiple of the read size
    sink = Sink(size)
    reg.add(5, sink.at(5))
    hello = wire.pack_hello(1, 0)
    frames = hello + _frame(5, 0, bytes(size)) + _frame(5, size, b"x" * 10)
    owed = [len(frames)]
    _feed(r, frames, 200_000, t, owed)
    assert sink.done == [(0, size), (size, 10)]
    assert t.lowat == 1  # back to 1 between frames
    assert max(t.seen) == dp.LOWAT_CAP  # it was actually used, on the real socket
    assert sink.errors == []
    r.connection_lost(None)
    assert r._sock is None  # the receiver's own socket object is closed with the connection
    t.close()


def test_lowat_shrinks_for_a_frame_discarded_mid_payload() -> None:
    reg = dp.Registry()
    r = dp._Receiver(reg, set())
    t = FakeTransport()
    r.connection_made(t)  # type: ignore[arg-type]
    size = 2 * (1 << 20)
    sink = Sink(size)
    reg.add(7, sink.at(7))
    data = wire.pack_hello(1, 0) + _frame(7, 0, bytes(size))
    owed = [len(data)]
    half = len(data) - size // 2
    _feed(r, data[:half], 300_000, t, owed)
    sink.active = False  # the collective was aborted: the rest of the frame is discarded
    _feed(r, data[half:], 100_000, t, owed)
    assert sink.done == [] and sink.errors == []
    assert t.lowat == 1
    r.connection_lost(None)
    t.close()
