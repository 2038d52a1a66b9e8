"""Point-to-point messages between two peers of a peer group: ``PointToPoint`` (the
receiving ``Mailbox`` and its connections, the sending ``Outbox``) and the
``TransferHandle`` a ``send_async``/``recv_async`` returns.

Unlike the collectives, a send or receive involves two peers only and does not go through
the master: the sender writes to its connection to the receiver (``outbox.py``), the
receiver matches it to a posted receive (``mailbox.py``). Peers are named by peer id (stable
across membership changes; ``comm.ranks[r]`` is rank r's). A peer that leaves the group (or
whose connection is lost) fails the sends to it and the receives posted for it with
``PeerLostError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Final

from ..._errors import InvalidUsageError, MasterConnectionError, PcclError, PeerLostError
from ..._net.handshake import Handoff, KeyFor
from ..._net.tasks import TaskSet
from ..._types import TransferInfo, as_index
from ..._wire import auth
from ..._wire import messages as m
from ..._wire.p2p import TAG_MAX, TAG_MIN, user_key
from .. import deadline
from ..core.buffers import as_buffer
from ..core.config import PeerConfig
from ..data.keys import KeyRing
from .inbox import Inbox
from .mailbox import Mailbox
from .outbox import Outbox

__all__ = ["PointToPoint", "TransferHandle"]

LEAVE_GRACE: Final = 2.0  # seconds an open connection of a departed peer is still read
MAX_PER_PEER: Final = 4  # open connections from one peer (a sender needs one; a new one
# comes after a lost one, which may not have been noticed yet here)
log = logging.getLogger("pccl_aio.p2p")


class TransferHandle(Awaitable[TransferInfo]):
    """A ``send_async`` or ``recv_async`` in flight: ``await handle`` (or ``wait()``) gives
    its ``TransferInfo`` or raises ``PeerLostError`` (the other peer left, or the connection
    was lost), ``InvalidUsageError`` (a message of another size than the receive's buffer).
    ``cancel()`` withdraws a receive (its buffer then holds unspecified bytes) and stops
    waiting for a send (bytes written stay written)."""

    def __init__(self, future: asyncio.Future[Any], info: Callable[[Any], TransferInfo],
                 tag: int, withdraw: Callable[[], None]) -> None:
        self._future, self._info, self._withdraw = future, info, withdraw
        self.tag = tag

    def done(self) -> bool:
        """It ended (completed, failed or cancelled)."""
        return self._future.done()

    async def started(self) -> bool:
        """True (a transfer starts when it is made; for the collectives' handles' sake)."""
        return True

    def result(self) -> TransferInfo:
        """Its outcome once ``done()``; ``InvalidUsageError`` before. Never blocks."""
        if not self._future.done():
            raise InvalidUsageError("the transfer is still running (wait() for it)")
        return self._info(self._future.result())

    def add_done_callback(self, fn: Callable[[TransferHandle], None]) -> None:
        """Call ``fn(handle)`` on the event loop once it ended."""
        self._future.add_done_callback(lambda _: fn(self))

    def cancel(self) -> bool:
        """Withdraw it; False if it already ended."""
        if self._future.done():
            return False
        self._withdraw()
        return True

    async def wait(self, timeout: float | None = None) -> TransferInfo:
        """Block until it ended; after ``timeout`` seconds withdraw it and raise
        ``PcclTimeoutError``. Cancelling the wait withdraws it too."""
        limit = deadline.check(timeout)
        try:
            await deadline.within(asyncio.shield(self._future), limit, "the transfer")
        except BaseException:
            if not self._future.done():
                self._withdraw()
            raise
        return self.result()

    def __await__(self) -> Generator[Any, None, TransferInfo]:
        return self.wait().__await__()


class PointToPoint:
    """The point-to-point part of one communicator. ``me()``: this peer's id;
    ``address(peer)``: a ring member's listener (None if not a member)."""

    def __init__(self, config: PeerConfig, keys: KeyRing, me: Callable[[], int],
                 address: Callable[[int], m.PeerAddr | None]) -> None:
        self.mailbox = Mailbox()
        self.inboxes: set[Inbox] = set()
        self.key_for: KeyFor = keys.accepting(auth.ROLE_P2P)
        self._tasks = TaskSet("pccl_aio point-to-point")
        tls = config.ssl if config.ssl_server is not None else None
        self.outbox = Outbox(me, address, keys.key, tls, config.data_timeout, self._tasks)
        self._me, self._address = me, address
        self._members: set[int] = set()
        self._left: set[int] = set()  # peer ids that were members (a send to one: lost)
        #: collective tag -> all-to-alls of it this epoch (``exchange.py``), and the epoch
        self.rounds: dict[int, int] = {}
        self._cuts: list[asyncio.TimerHandle] = []
        self.epoch = 0

    def accept(self, conn: Handoff, peer: int) -> None:
        """A connection from ``peer`` passed its handshake: read its messages (closed at
        once if ``peer`` has ``MAX_PER_PEER`` open already: a sender needs one)."""
        if sum(c.peer == peer for c in self.inboxes) >= MAX_PER_PEER:
            log.warning("point-to-point: peer %d opened more than %d connections (closed)",
                        peer, MAX_PER_PEER)
            conn.transport.abort()
            return
        conn.hand_over(Inbox(self.mailbox, self.inboxes, peer))

    def _peer(self, peer: object, what: str, receiving: bool = False) -> int | None:
        if peer is None and receiving:
            return None
        pid = as_index(peer)
        if pid is not None and pid in self._left:
            if receiving:  # (what it sent before it left may still be read)
                return pid
            raise PeerLostError(f"peer {pid} left the peer group")
        if pid is None or pid == self._me() or self._address(pid) is None:
            raise InvalidUsageError(
                f"{what} must be the peer id of another member of this peer group "
                f"(comm.ranks), not {peer!r}")
        return pid

    def send_async(self, tensor: Any, peer: object, tag: object) -> TransferHandle:
        """Send ``tensor``'s bytes to ``peer``; ``InvalidUsageError`` before anything is
        sent for a bad argument, ``PeerLostError`` for a peer that left the group."""
        pid, t = self._peer(peer, "peer"), _tag(tag)
        assert pid is not None
        view = as_buffer(tensor, writable=False).view
        fut = self.outbox.send(pid, user_key(t), view)
        return TransferHandle(fut, lambda _: TransferInfo(pid, t, view.nbytes), t,
                              lambda: _cancel(fut))

    def send_now(self, tensor: Any, peer: object, tag: object,
                 loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[int] | None:
        """From a thread other than the loop's: ``Outbox.send_now`` of ``tensor``'s bytes
        (None: nothing written, ``send_async`` it on the loop). Raises as ``send_async``."""
        pid, t = self._peer(peer, "peer"), _tag(tag)
        assert pid is not None
        return self.outbox.send_now(pid, user_key(t), as_buffer(tensor, writable=False).view,
                                    loop)

    def recv_async(self, tensor: Any, peer: object, tag: object) -> TransferHandle:
        """Receive into ``tensor`` from ``peer`` (None: any member). From a peer that left:
        what it sent before it left, else ``PeerLostError``."""
        pid, t = self._peer(peer, "peer", receiving=True), _tag(tag)
        view = as_buffer(tensor, writable=True, what="receive buffer").view
        recv = self.mailbox.post(pid, user_key(t), view)
        if pid in self._left and not self._reading(pid):
            self.mailbox.fail_where(lambda r: r is recv,
                                    PeerLostError(f"peer {pid} left the peer group"))
        return TransferHandle(recv.future, lambda got: TransferInfo(got[0], t, got[1]), t,
                              lambda: self.mailbox.withdraw(recv))

    def _reading(self, peer: int) -> bool:
        """A connection from ``peer`` is open (what it sent may still come)."""
        return any(c.peer == peer for c in self.inboxes)

    def on_membership(self, msg: m.Membership) -> None:
        """Sends to peers that left fail at once; receives from them fail once their
        connections closed (a peer that left gracefully or was killed: at once, what it sent
        before is read first) or ``LEAVE_GRACE`` seconds after the news (a peer the master
        dropped whose connection stays open: a frozen process)."""
        alive = {p.peer_id for p in msg.ring}
        gone = self._members - alive
        self._left |= gone
        self._members = alive
        if msg.epoch != self.epoch:
            self.epoch = msg.epoch
            self.rounds.clear()
        for peer in gone:
            if self._reading(peer):
                loop = asyncio.get_running_loop()
                self._cuts = [c for c in self._cuts if c.when() > loop.time()]
                self._cuts.append(loop.call_later(LEAVE_GRACE, self._cut, peer))
            else:
                self._cut(peer)
        self.outbox.on_ring(alive)

    def _cut(self, peer: int) -> None:
        for c in [c for c in self.inboxes if c.peer == peer]:
            c.close()  # (its receives fail as the connection closes)
        self.mailbox.fail_where(lambda r: r.peer == peer,
                                PeerLostError(f"peer {peer} left the peer group"))

    def rx_bytes(self) -> int:
        return sum(c.rx_bytes for c in self.inboxes)

    async def close(self, exc: PcclError | None = None) -> None:
        """Fail what is in flight (``MasterConnectionError``: the communicator closed), drop
        every connection and wait for the connecting tasks to end."""
        exc = exc or MasterConnectionError("the communicator is closed")
        for cut in self._cuts:
            cut.cancel()
        self.mailbox.close(exc)
        self.outbox.close(exc)
        for c in list(self.inboxes):
            c.close()
        await self._tasks.close()


def _cancel(fut: asyncio.Future[Any]) -> None:
    fut.cancel()


def _tag(tag: object) -> int:
    t = as_index(tag)
    if t is None or not TAG_MIN <= t <= TAG_MAX:
        raise InvalidUsageError(f"tag must be an int of 64 bits, not {tag!r}")
    return t
