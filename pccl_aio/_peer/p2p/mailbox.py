"""The receiving side of point-to-point: ``Mailbox`` matches the messages that arrive to the
receives posted for them; ``inbox.Inbox`` reads one sender's connection into it.

A receive names a sender (a peer id, or None for any) and a tag; a message matches the
oldest receive posted for its sender and tag, and a receive takes the oldest message of
its sender and tag that nobody took yet, so messages between two peers with one tag are
received in the order they were sent. A message that arrives before its receive is copied
aside, up to ``stash_bytes`` in all (a receive posted while it is still arriving takes
what came, and the rest is read straight into its buffer); beyond that its connection
stops reading until a receive for it is posted (TCP's window then holds the sender back),
so a sender cannot make a receiver buffer more than that. A message whose size differs from
its receive's buffer fails that receive (``InvalidUsageError``) and is dropped.

Everything runs on the communicator's event loop; nothing here blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final, Protocol

from ..._errors import InvalidUsageError, PcclError, PeerLostError
from ..._wire.p2p import Key

STASH_BYTES: Final = 256 << 20  # the most a receiver copies aside for receives not yet posted
SPARE_MIN: Final = 1 << 20  # stash buffers of these sizes are kept for the next (one)
SPARE_MAX: Final = 64 << 20

#: (the sender's peer id, the message's bytes) of a receive that completed
Got = tuple[int, int]


class Reader(Protocol):
    """The connection a message comes on, as the mailbox drives it (``inbox.Inbox``)."""

    peer: int

    def deliver(self, message: Message) -> None:
        """Read ``message``'s payload (the one this connection paused on) now."""

    def redirect(self, message: Message) -> None:
        """Read the rest of ``message`` (being read aside) into the receive that took it."""


class Recv:
    """A posted receive: ``future`` gets ``(sender, bytes)`` or the error."""

    __slots__ = ("buf", "future", "peer", "tag")

    def __init__(self, peer: int | None, tag: Key, buf: memoryview) -> None:
        self.peer, self.tag, self.buf = peer, tag, buf
        self.future: asyncio.Future[Got] = asyncio.get_running_loop().create_future()
        self.future.add_done_callback(retrieved)

    def matches(self, peer: int, tag: Key) -> bool:
        return self.tag == tag and (self.peer is None or self.peer == peer)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class Message:
    """A message from ``reader.peer`` that came before its receive: ``data`` holds it once
    read (``complete``); ``data`` is None while its connection waits for room or a receive."""

    __slots__ = ("complete", "data", "length", "reader", "recv", "tag")

    def __init__(self, reader: Reader, tag: Key, length: int) -> None:
        self.reader, self.tag, self.length = reader, tag, length
        self.data: bytearray | None = None
        self.complete = False
        self.recv: Recv | None = None  # the receive that took it before it was read


class Mailbox:
    """The posted receives and early messages of one communicator."""

    def __init__(self, stash_bytes: int = STASH_BYTES) -> None:
        self.stash_bytes = stash_bytes
        self.stashed = 0  # bytes held in ``Message.data``
        self._posted: list[Recv] = []  # in the order they were posted
        self._messages: list[Message] = []  # in the order they arrived
        self._closed: PcclError | None = None
        #: the last stash buffer given back, taken again by a message of its size (a stream
        #: of equal messages then faults no new pages in)
        self._spare: bytearray | None = None

    # ---- the receiver's side -----------------------------------------------------------------
    def post(self, peer: int | None, tag: Key, buf: memoryview) -> Recv:
        """Post a receive of ``buf.nbytes`` bytes from ``peer`` (None: any) with ``tag``;
        the oldest matching message is taken at once if one came before."""
        recv = Recv(peer, tag, buf)
        if self._closed is not None:
            recv.fail(self._closed)
            return recv
        for msg in self._messages:
            if msg.recv is None and recv.matches(msg.reader.peer, msg.tag):
                self._take(msg, recv)
                return recv
        self._posted.append(recv)
        return recv

    def withdraw(self, recv: Recv) -> None:
        """Forget a receive nobody completed (cancelled, timed out): a message that had been
        matched to it and is being read aside is left for the next receive; one being read
        into its buffer is dropped."""
        if not recv.future.done():
            recv.future.cancel()  # (a connection reading into it drops the rest)
        if recv in self._posted:
            self._posted.remove(recv)
        for msg in self._messages:
            if msg.recv is recv and msg.data is not None:  # (being read aside: kept)
                msg.recv = None

    def _take(self, msg: Message, recv: Recv) -> None:
        """``recv`` takes ``msg``: now if it was read, else when it is."""
        if msg.complete:
            data = msg.data if msg.data is not None else bytearray()
            self._messages.remove(msg)
            self._fill(recv, msg.reader.peer, data)
            self._release(msg)
        else:
            msg.recv = recv
            if msg.data is None:  # its connection waits: read it straight into the receive
                msg.reader.deliver(msg)
            else:  # being read aside: what came is copied, the rest read into the receive
                msg.reader.redirect(msg)

    @staticmethod
    def _fill(recv: Recv, peer: int, data: bytearray) -> None:
        if recv.future.done():
            return
        if len(data) != recv.buf.nbytes:
            recv.fail(_size_error(peer, len(data), recv))
            return
        recv.buf[:] = data
        recv.future.set_result((peer, len(data)))

    def unstash(self, msg: Message) -> None:
        """``msg``'s stash room is given back (its receive took over, ``Reader.redirect``)."""
        self._release(msg)

    def _release(self, msg: Message) -> None:
        """``msg`` leaves the stash: its room may let a waiting connection go on."""
        if msg.data is not None:
            self.stashed -= len(msg.data)
            if SPARE_MIN <= len(msg.data) <= SPARE_MAX:
                self._spare = msg.data
            msg.data = None
            for waiting in self._messages:
                if waiting.data is None and not waiting.complete and waiting.recv is None \
                        and self.fits(waiting.length):
                    waiting.reader.deliver(waiting)
                    break

    def fits(self, length: int) -> bool:
        return self.stashed + length <= self.stash_bytes

    # ---- the connections' side ---------------------------------------------------------------
    def arrived(self, reader: Reader, tag: Key, length: int) -> Recv | Message:
        """A header from ``reader.peer``: the receive to read the payload into (its size
        checked by the caller), or the ``Message`` kept for it (``data`` set when there is
        room to read it aside; otherwise the connection must wait for ``deliver``)."""
        for recv in self._posted:
            if recv.matches(reader.peer, tag):
                self._posted.remove(recv)
                return recv
        msg = Message(reader, tag, length)
        if self.fits(length):
            self.stash(msg)
        self._messages.append(msg)
        return msg

    def stash(self, msg: Message) -> None:
        """Give ``msg`` its room in the stash (the caller checked ``fits``)."""
        spare, self._spare = self._spare, None
        msg.data = spare if spare is not None and len(spare) == msg.length \
            else bytearray(msg.length)
        self.stashed += msg.length

    def read(self, msg: Message) -> None:
        """``msg``'s payload is all in ``data`` (or in its receive's buffer, ``deliver``)."""
        msg.complete = True
        if msg.recv is not None:
            recv = msg.recv
            self._messages.remove(msg)
            if msg.data is not None:
                self._fill(recv, msg.reader.peer, msg.data)
                self._release(msg)
            elif not recv.future.done():
                recv.future.set_result((msg.reader.peer, msg.length))

    def broke(self, reader: Reader, why: str, others: bool = False) -> None:
        """``reader``'s connection is gone: its messages not read whole are dropped (the
        receives that took them fail), and so are the receives posted for its peer unless
        ``others`` (another connection from that peer is open: what they wait for may come
        on it)."""
        error = PeerLostError(f"the point-to-point connection from peer {reader.peer} "
                              f"was lost ({why})")
        for msg in [m for m in self._messages if m.reader is reader and not m.complete]:
            self._messages.remove(msg)
            self._release(msg)
            if msg.recv is not None:
                msg.recv.fail(error)
        if not others:
            self.fail_where(lambda r: r.peer == reader.peer, error)

    def fail_where(self, which: Callable[[Recv], bool], exc: BaseException) -> None:
        """Fail (and forget) the posted receives ``which`` selects."""
        for recv in [r for r in self._posted if which(r)]:
            self._posted.remove(recv)
            recv.fail(exc)

    def purge(self, stale: Callable[[Key], bool]) -> None:
        """Drop the messages read whole whose key is ``stale`` and that no receive took (an
        all-to-all that failed leaves its late messages behind)."""
        for msg in [m for m in self._messages if stale(m.tag) and m.recv is None
                    and m.complete]:
            self._messages.remove(msg)
            self._release(msg)

    def close(self, exc: PcclError) -> None:
        """Fail every receive with ``exc`` (and every later one); drop what was kept."""
        self._closed = exc
        self.fail_where(lambda r: True, exc)
        for msg in self._messages:
            if msg.recv is not None:
                msg.recv.fail(exc)
        self._messages.clear()
        self.stashed, self._spare = 0, None


def retrieved(fut: asyncio.Future[Any]) -> None:
    """Mark ``fut``'s error as seen: a transfer nobody waits for (its caller gave up, or
    the communicator closed) fails quietly."""
    if not fut.cancelled():
        fut.exception()


def _size_error(peer: int, length: int, recv: Recv) -> InvalidUsageError:
    return InvalidUsageError(
        f"peer {peer} sent {length} bytes with tag {recv.tag[1]}; the receive posted for it "
        f"holds {recv.buf.nbytes} (send and receive tensors of the same size and dtype)")
