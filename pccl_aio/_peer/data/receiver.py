"""The data plane's receiving side: the zero-copy receive connections and the ``Registry``
that routes their frames (the listening socket that hands them over is ``listener.py``).

Frames (``_wire/data.py``) are routed by ``seq``, the master's global collective number:
frames of an aborted attempt (older seq) are dropped, frames of a collective this peer
has not yet been told about (newer seq) pause that connection until the master's
``CollectiveStart`` arrives, and frames of a ticket's seq (an early start of a collective not
launched here yet) are copied aside (``core/stash.py``) and handed over at its launch.
Otherwise receive is zero-copy: ``_Receiver`` is an
``asyncio.BufferedProtocol`` whose ``get_buffer`` hands the kernel the destination slice (or
the collective's receive slot) directly. The sending side is ``link.py``.

Only what the plan says is trusted (``core/guard.py`` holds the limits). A frame of a running
collective must come from a connection of the peer its plan names (the ring's predecessor,
or a round's sender: ``Sink.sender``), and each (phase, offset) it expects
arrives once: anything else fails the collective for the group (``Sink.on_error``) and closes
the connection. A connection may hold one frame of an unannounced seq, not absurdly far ahead
and for at most ``Registry.park_timeout`` seconds. Connections are capped per sending peer and
in total at their HELLO. Each rule broken closes the connection (``_violation``), logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Final, Protocol, cast

from ..._net.stream import own_socket, set_nodelay
from ..._wire.data import HEADER, HELLO, MAGIC, parse_hello, unpack_header
from .core.guard import PARK_TIMEOUT, ConnCaps, seq_too_far
from .core.stash import STASH_BYTES, Early, Stash

log = logging.getLogger("pccl_aio.dataplane")

LOWAT_CAP: Final = 1 << 20  # the largest SO_RCVLOWAT asked for (one pipeline segment)
_SOL_SOCKET: Final = socket.SOL_SOCKET
_SO_RCVLOWAT: Final = getattr(socket, "SO_RCVLOWAT", 18)  # Linux's value where it is missing


class Sink(Protocol):
    """A running collective as the receiver sees it."""

    seq: int  # the attempt it runs (an early start that starts over changes it)

    @property
    def active(self) -> bool:
        """It runs, and its frames are still wanted."""

    def sender(self, phase: int) -> int:
        """The peer id whose frames of ``phase`` it takes (the ring's predecessor, or a
        round's sender)."""

    def waits_on(self, peer: int) -> bool:
        """Data of it is still to come from ``peer``."""

    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        """Where the payload of a frame goes, or None if the frame is illegal."""

    def on_segment(self, phase: int, offset: int, length: int, p0: float, p1: float) -> None:
        """A whole payload arrived."""

    def on_error(self, reason: str, suspect: int = 0) -> None:
        """The frame stream broke the protocol (or the connection from peer ``suspect``
        closed): fail the collective for the group."""

    @property
    def data_ok(self) -> bool:
        """Its data finished: a connection closing no longer matters to it."""


class Registry:
    """seq -> running collective, shared by all receive connections of one communicator;
    also their caps (``caps``), the parked connections (each with its deadline) and the
    tickets' frames that came before their collective was launched here (``core/stash.py``)."""

    def __init__(self, park_timeout: float = PARK_TIMEOUT, caps: ConnCaps | None = None,
                 stash_bytes: int = STASH_BYTES) -> None:
        self.sinks: dict[int, Sink] = {}
        self.max_seq = 0
        self.park_timeout = park_timeout
        self.caps = caps if caps is not None else ConnCaps()
        self.stash = Stash(stash_bytes)
        self._parked: dict[_Receiver, None] = {}  # in parking order

    def add(self, seq: int, sink: Sink) -> None:
        """Register a collective; hands it the frames stashed for it, wakes connections
        parked on its frames."""
        self.sinks[seq] = sink
        for frame in self.stash.take(seq):
            _replay(sink, seq, *frame)
        self.skip(seq)

    def reserve(self, seq: int) -> None:
        """A ticket: frames of ``seq`` may come before its collective is launched here; they
        are stashed (``core/stash.py``) instead of parking their connection."""
        self.stash.reserve(seq)
        self.skip(seq)

    def stashed(self, seq: int, frame: Early) -> None:
        """A stashed frame arrived whole: to its collective if launched meanwhile, else kept."""
        sink = self.sinks.get(seq)
        if sink is None:
            self.stash.keep(seq, frame)
        else:
            self.stash.release(len(frame[3]))
            _replay(sink, seq, *frame)

    def skip(self, seq: int) -> None:
        """``seq`` is known now: re-route parked connections (its frames are stale unless
        ``add``ed)."""
        self.max_seq = max(self.max_seq, seq)
        parked, self._parked = self._parked, {}
        for r in parked:
            r.unpark()

    def remove(self, seq: int) -> None:
        """Stop accepting frames of ``seq``; later frames of it are discarded."""
        self.sinks.pop(seq, None)

    def lost(self, peer_id: int, reason: str) -> None:
        """A data connection from ``peer_id`` closed: fail every running collective that
        receives from it now, instead of waiting for its data deadline."""
        for sink in list(self.sinks.values()):
            if sink.active and sink.waits_on(peer_id) and not sink.data_ok:
                sink.on_error(reason, peer_id)

    def park(self, r: _Receiver) -> None:
        self._parked[r] = None

    def forget(self, r: _Receiver) -> None:
        self._parked.pop(r, None)

    @property
    def parked(self) -> int:
        """How many connections hold a frame of an unannounced seq."""
        return len(self._parked)


def _replay(sink: Sink, seq: int, peer: int, phase: int, off: int, data: memoryview,
            p0: float, p1: float) -> None:
    """Deliver a stashed frame to its collective, under the rules of a live one."""
    if not sink.active or sink.seq != seq:
        return
    if sink.sender(phase) != peer:
        sink.on_error(f"frame of seq {seq} from peer {peer}, not from its sender "
                      f"{sink.sender(phase)}")
        return
    target = sink.target(phase, off, len(data))
    if target is None:
        sink.on_error(f"unexpected frame of seq {seq} phase={phase} offset={off} "
                      f"length={len(data)}", peer)
        return
    target[:] = data
    sink.on_segment(phase, off, len(data), p0, p1)


_S_HELLO, _S_HEADER, _S_PAYLOAD, _S_DISCARD, _S_STASH = range(5)


class _Receiver(asyncio.BufferedProtocol):
    """One incoming data connection; writes payloads straight into collectives' buffers.

    ``peer >= 0`` is the sender's id as an authenticated handshake established it: the
    HELLO must then name the same id. Nothing here blocks; the callbacks run in the loop."""

    def __init__(self, registry: Registry, conns: set[_Receiver], peer: int = -1) -> None:
        self._reg = registry
        self._auth = peer
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
        self._admitted = False  # counted in the registry's caps
        self._violated = False
        self._park_timer: asyncio.TimerHandle | None = None
        self._early: memoryview | None = None  # a stashed frame's payload being received

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Also called after ``transport.set_protocol(self)`` on an open (TLS) transport."""
        self._transport = cast(asyncio.Transport, transport)
        set_nodelay(transport)
        # SO_RCVLOWAT, set twice per frame, on a socket object of our own. Never under TLS:
        # the plaintext may already sit decrypted above the socket, so a raw low-water mark
        # could hold back a wake-up that nothing else would bring.
        if transport.get_extra_info("ssl_object") is None:
            self._sock = own_socket(transport)
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
        self._unpark_timer()
        self._drop_early()
        if self._admitted:
            self._admitted = False
            self._reg.caps.release(self._peer)
            if not self._violated:  # a violator's frames already failed what they touched
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
            if (sink is not None and sink.active and self._target is not None
                    and sink.seq == self._frame[0]):
                return self._target[self._got : self._want]
            self._state = _S_DISCARD  # the attempt was aborted mid-frame: drop the rest
        elif self._state == _S_STASH and self._early is not None:
            return self._early[self._got : self._want]
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
            seq, phase, off, p0, p1 = self._frame
            if sink is not None and sink.active and sink.seq == seq:
                sink.on_segment(phase, off, self._want_len, p0, p1)
            return
        if state == _S_STASH:
            early, self._early = self._early, None
            self._expect_header()
            seq, phase, off, p0, p1 = self._frame
            if early is not None:
                self._reg.stashed(seq, (self._peer, phase, off, early, p0, p1))
            return
        if state == _S_HELLO:
            hello = parse_hello(self._hdr)
            if hello is None:
                return self._violation("bad data-plane hello")
            if 0 <= self._auth != hello[0]:
                return self._violation(f"hello names peer {hello[0]}, authenticated {self._auth}")
            refused = self._reg.caps.admit(hello[0])
            if refused is not None:
                return self._violation(refused)
            self._peer, self._admitted = hello[0], True
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
        """Pick where the payload goes; True if the connection was parked or closed instead."""
        self._want_len = length
        self._got, self._want = 0, length
        reg = self._reg
        sink = reg.sinks.get(seq)
        if sink is None:
            if reg.stash.wants(seq):  # a ticket's collective not launched here yet
                early = reg.stash.room(seq, length)
                if early is not None:
                    self._early, self._state = early, _S_STASH
                    self._set_lowat(max(1, min(length, LOWAT_CAP)))
                else:
                    self._state = _S_DISCARD  # no room: the ticket is spoiled (stash.py)
            elif seq > reg.max_seq and self._transport is not None:
                # A collective we have not heard of yet: wait for the master's CollectiveStart.
                if seq_too_far(seq, reg.max_seq):
                    self._violation(f"frame for seq {seq}, far beyond seq {reg.max_seq}")
                    return True
                self._state = _S_HEADER
                self._got, self._want = HEADER.size, HEADER.size
                self._transport.pause_reading()
                reg.park(self)
                if self._park_timer is None:  # parked since: the deadline is not renewed
                    self._park_timer = asyncio.get_running_loop().call_later(
                        reg.park_timeout, self._park_expired)
                return True
            else:
                self._state = _S_DISCARD  # stale frame of an aborted attempt
        elif sink.sender(phase) != self._peer:  # not the connection the plan says
            return self._refuse(sink, f"frame of seq {seq} from peer {self._peer}, "
                                f"not from its sender {sink.sender(phase)}", False)
        else:
            target = sink.target(phase, off, length)  # None for a repeated (phase, offset)
            if target is None:
                return self._refuse(sink, f"unexpected frame of seq {seq} phase={phase} "
                                    f"offset={off} length={length}", True)
            self._sink, self._target, self._state = sink, target, _S_PAYLOAD
            self._set_lowat(max(1, min(length, LOWAT_CAP)))
        if length == 0:
            self.buffer_updated(0)
        return False

    def _refuse(self, sink: Sink, reason: str, all_of_sender: bool) -> bool:
        """A frame broke the plan of a running collective: fail it for the group (this
        peer reports the failure, the master aborts it everywhere) and close the connection.
        ``all_of_sender``: a frame the plan does not expect (a repeated one) also closes every
        other connection naming the same sender: which of them carried a forged frame, the
        first or this one, cannot be told without an authenticated handshake."""
        if sink.active:
            sink.on_error(reason)
        self._violation(reason)
        if all_of_sender:
            for r in [c for c in self._conns if c._peer == self._peer and c is not self]:
                r._violation(f"another connection from peer {self._peer}: {reason}")
        return True

    def unpark(self) -> None:
        """Re-route the held header now that the registry changed, then resume reading."""
        if self._transport is None:
            return
        seq, phase, off, _p0, _p1 = self._frame
        if not self._route(seq, phase, off, self._want_len):
            self._unpark_timer()
            if self._transport is not None:
                with contextlib.suppress(Exception):
                    self._transport.resume_reading()

    def _unpark_timer(self) -> None:
        if self._park_timer is not None:
            self._park_timer.cancel()
            self._park_timer = None

    def _park_expired(self) -> None:
        self._park_timer = None
        seq = self._frame[0]
        self._violation(f"held a frame of unannounced seq {seq} for more than "
                        f"{self._reg.park_timeout:g} s")

    def eof_received(self) -> bool:
        return False

    def _drop_early(self) -> None:
        if self._early is not None:
            self._reg.stash.release(len(self._early))
            self._early = None

    def _violation(self, reason: str) -> None:
        """Close the connection at once (its buffered bytes are never read); logged once."""
        self._drop_early()
        if not self._violated:
            self._violated = True
            log.warning("closing data connection from peer %d: %s", self._peer, reason)
        # Whatever still reaches us (a TLS layer may hold decrypted bytes) is dropped unread.
        self._state, self._got, self._want = _S_DISCARD, 0, 1 << 62
        self._sink = self._target = None
        self._reg.forget(self)
        self._unpark_timer()
        if self._transport is not None:
            self._transport.abort()
