"""``Inbox``: one sender's point-to-point connection, read into the ``Mailbox``.

Zero-copy where it can be: a message whose receive was posted first is read by the kernel
straight into the receive's buffer (``asyncio.BufferedProtocol``); one that came first is
read into the stash, or, if the stash is full, the connection stops reading until a
receive takes it. A header that is not ours (bad magic, an absurd length) closes the
connection: the receives it was filling and those posted for its peer fail
(``mailbox.broke``). A payload that no longer has a receive (size mismatch, cancelled) is
read and dropped. Runs on the event loop; nothing blocks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from ..._errors import PeerLostError
from ..._wire.p2p import HEADER, parse_header
from .mailbox import Mailbox, Message, Recv, _size_error

log = logging.getLogger("pccl_aio.p2p")

DISCARD: Final = 1 << 16  # the scratch a dropped payload is read through


class Inbox(asyncio.BufferedProtocol):
    """The receiving end of one connection from ``peer``; ``conns`` holds it while open."""

    def __init__(self, mailbox: Mailbox, conns: set[Inbox], peer: int) -> None:
        self.peer = peer
        self._mailbox, self._conns = mailbox, conns
        self._head = bytearray(HEADER.size)
        self._got = 0  # bytes of the header, then of the payload, read so far
        self._length = -1  # the payload's length; -1 while reading a header
        self._message: Message | None = None  # the message being read (or waited on)
        self._recv: Recv | None = None  # the receive its payload goes to
        self._view: memoryview | None = None  # where the payload goes (None: dropped)
        self._scratch: bytearray | None = None
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self.rx_bytes = 0

    # ---- the transport's side ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._conns.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._length < 0:  # reading a header
            return memoryview(self._head)[self._got:]
        if self._recv is not None and self._recv.future.done():
            self._view = None  # (its receive was cancelled: the rest is dropped)
        if self._view is not None:
            return self._view[self._got:]
        if self._scratch is None:
            self._scratch = bytearray(DISCARD)
        return memoryview(self._scratch)[:min(DISCARD, self._length - self._got)]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        self.rx_bytes += nbytes
        if self._length < 0:
            if self._got == HEADER.size:
                self._header()
        elif self._got == self._length:
            self._payload_read()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._conns.discard(self)
        self.transport = None
        if self._recv is not None and self._length > 0:
            self._recv.fail(PeerLostError(
                f"the connection from peer {self.peer} was lost in the middle of a message"))
        others = any(c.peer == self.peer for c in self._conns)  # (a newer one goes on)
        self._mailbox.broke(self, repr(exc) if exc is not None else "closed", others)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ---- messages ----------------------------------------------------------------------------
    def _header(self) -> None:
        parsed = parse_header(self._head)
        if parsed is None:
            log.warning("point-to-point connection from peer %d: a frame that is not ours "
                        "(closed)", self.peer)
            self.close()
            return
        key, length = parsed
        self._got, self._length = 0, length
        got = self._mailbox.arrived(self, key, length)
        if isinstance(got, Recv):
            self._into(got, length)
        else:
            self._message = got
            if got.data is not None:
                self._view = memoryview(got.data)
            else:
                self._pause()
                return
        if length == 0:
            self._payload_read()

    def _into(self, recv: Recv, length: int) -> None:
        """Read the payload into ``recv``'s buffer (dropped, ``recv`` failed, if the sizes
        differ)."""
        self._recv = recv
        if recv.buf.nbytes != length:
            recv.fail(_size_error(self.peer, length, recv))
            self._view = None
        else:
            self._view = recv.buf

    def _payload_read(self) -> None:
        recv, msg = self._recv, self._message
        self._got, self._length = 0, -1
        self._recv = self._message = self._view = None
        if msg is not None:
            self._mailbox.read(msg)
        elif recv is not None and not recv.future.done():
            recv.future.set_result((self.peer, recv.buf.nbytes))

    def deliver(self, message: Message) -> None:
        """Read the paused-on ``message`` now: into the receive that took it, or the stash."""
        if message is not self._message or not self._paused:
            return
        if message.recv is not None:  # (the mailbox completes it, through ``read``)
            self._into(message.recv, message.length)
        else:
            self._mailbox.stash(message)
            assert message.data is not None
            self._view = memoryview(message.data)
        self._resume()
        if message.length == 0:
            self._payload_read()

    def redirect(self, message: Message) -> None:
        """The receive that took ``message`` while it is read aside gets what came so far,
        and the rest is read into its buffer (unless the sizes differ: then it is read
        aside whole and the receive fails at its end)."""
        recv, view = message.recv, self._view
        if message is not self._message or recv is None or view is None \
                or recv.buf.nbytes != message.length:
            return
        recv.buf[:self._got] = view[:self._got]
        self._recv, self._view = recv, recv.buf
        self._mailbox.unstash(message)

    def _pause(self) -> None:
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def _resume(self) -> None:
        self._paused = False
        if self.transport is not None:
            self.transport.resume_reading()
