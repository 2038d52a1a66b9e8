"""All-to-all over point-to-point messages, with an agreed outcome.

Rank r's ``src[j]`` goes to rank j's ``dst[r]`` (ranks: positions in the ring). Each pair
of peers exchanges one message each way (channel ``ALL_TO_ALL``, the collective's tag);
then every peer contributes to an all-reduce (MIN) of one byte pinned to the same ring:
1 if all its messages went and came, else 0. So the outcome is the same on every peer: all
complete, or all raise (the all-reduce's own error where a peer was lost, else
``PeerLostError`` naming the failure) and the messages a failed attempt left behind are
dropped. A message's key carries the round (the membership epoch and how many all-to-alls
of the tag came before in it), so a late message of a failed one is never taken for a later
one's. ``TaskHandle`` is the handle of such a composite collective.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

from ..._errors import InvalidUsageError, PeerLostError
from ..._types import ReduceInfo, ReduceOp
from ..._wire.p2p import ALL_TO_ALL, Key
from .. import deadline
from ..core.buffers import as_buffer
from ..data.handle import AllReduceHandle
from .calls import PointToPoint
from .mailbox import retrieved

__all__ = ["TaskHandle", "all_to_all"]

#: ``agree(flag, op, tag, ring)``: launch the all-reduce the outcome is agreed by
Agree = Callable[[bytearray, ReduceOp, int, tuple[int, ...]], AllReduceHandle]


class TaskHandle(Awaitable[ReduceInfo]):
    """A composite collective in flight (an all-to-all); as an all-reduce's handle:
    ``await``/``wait()`` for its ``ReduceInfo``; ``cancel()`` fails it for every peer."""

    def __init__(self, task: asyncio.Task[ReduceInfo], tag: int) -> None:
        self._task, self.tag = task, tag
        task.add_done_callback(retrieved)

    def done(self) -> bool:
        return self._task.done()

    async def started(self) -> bool:
        return True

    def result(self) -> ReduceInfo:
        """Its outcome once ``done()``; ``InvalidUsageError`` before. Never blocks."""
        if not self._task.done():
            raise InvalidUsageError(f"the all-to-all tag {self.tag} is still running")
        return self._task.result()

    def add_done_callback(self, fn: Callable[[TaskHandle], None]) -> None:
        self._task.add_done_callback(lambda _: fn(self))

    def cancel(self) -> bool:
        """Give up on it: this peer's vote fails it for every peer. False if it ended."""
        return self._task.cancel()

    async def wait(self, timeout: float | None = None) -> ReduceInfo:
        """Block until it ended; ``PcclTimeoutError`` after ``timeout`` s (it is then
        cancelled, for every peer). Cancelling the wait cancels it."""
        limit = deadline.check(timeout)
        try:
            return await deadline.within(asyncio.shield(self._task), limit,
                                         f"the all-to-all tag {self.tag}")
        except BaseException:
            self._task.cancel()
            raise

    def __await__(self) -> Generator[Any, None, ReduceInfo]:
        return self.wait().__await__()


def all_to_all(p2p: PointToPoint, agree: Agree, me: int, ring: Sequence[int],
               src: Sequence[Any], dst: Sequence[Any], tag: int) -> TaskHandle:
    """Start an all-to-all of ``src`` into ``dst`` (one buffer per rank of ``ring``) on the
    running loop. ``InvalidUsageError`` before anything is sent for a bad argument."""
    ring = tuple(ring)
    n = len(ring)
    if me not in ring:
        raise PeerLostError("this peer is not in the ring the all-to-all is pinned to")
    if len(src) != n or len(dst) != n:
        raise InvalidUsageError(f"an all-to-all takes one buffer per rank ({n}), not "
                                f"{len(src)} to send and {len(dst)} to receive")
    sends = [as_buffer(x, writable=False).view for x in src]
    recvs = [as_buffer(x, writable=True, what="receive buffer").view for x in dst]
    r = ring.index(me)
    if sends[r].nbytes != recvs[r].nbytes:
        raise InvalidUsageError(f"this rank's own block is {sends[r].nbytes} bytes to send "
                                f"and {recvs[r].nbytes} to receive")
    count = p2p.rounds.get(tag, 0)
    p2p.rounds[tag] = count + 1
    key = (ALL_TO_ALL, tag, ((p2p.epoch & 0xFFFF) << 16) | (count & 0xFFFF))
    p2p.mailbox.purge(lambda k: k[:2] == key[:2] and k[2] != key[2])  # (older rounds')
    task = asyncio.get_running_loop().create_task(
        _run(p2p, agree, ring, r, sends, recvs, key), name=f"pccl_aio all-to-all {tag}")
    return TaskHandle(task, tag)


async def _run(p2p: PointToPoint, agree: Agree, ring: tuple[int, ...], r: int,
               sends: list[memoryview], recvs: list[memoryview], key: Key) -> ReduceInfo:
    tag = key[1]
    recvs[r][:] = sends[r]
    others = [(j, peer) for j, peer in enumerate(ring) if j != r]
    posted = [p2p.mailbox.post(peer, key, recvs[j]) for j, peer in others]
    sent = [p2p.outbox.send(peer, key, sends[j]) for j, peer in others]
    ends: list[asyncio.Future[Any]] = [*(rv.future for rv in posted), *sent]
    error: BaseException | None = None
    try:
        if others:
            await asyncio.wait(ends, return_when=asyncio.FIRST_EXCEPTION)
        error = _first_error(ends)
    except asyncio.CancelledError:  # (given up: vote 0, so that every peer fails alike)
        error = asyncio.CancelledError()
    if error is not None:
        # Whoever still waits on this peer must learn it failed: drop the connections the
        # unfinished messages go on (their receivers' receives from here then fail).
        for (_, peer), rv, fut in zip(others, posted, sent):
            p2p.mailbox.withdraw(rv)
            if not (fut.done() and rv.future.done()):
                p2p.outbox.reset(peer, PeerLostError(f"the all-to-all tag {tag} failed"))
    flag = bytearray(b"\x00" if error is not None else b"\x01")
    vote = agree(flag, ReduceOp.MIN, tag, ring)
    if isinstance(error, asyncio.CancelledError):
        raise error
    try:
        await vote
    finally:
        if error is not None or flag[0] == 0:  # (its messages that came after all)
            p2p.mailbox.purge(lambda k: k == key)
    if error is not None:
        raise error
    if flag[0] == 0:
        raise PeerLostError(f"the all-to-all tag {tag} failed on another rank")
    tx = sum(v.nbytes for j, v in enumerate(sends) if j != r)
    return ReduceInfo(len(ring), tx, sum(v.nbytes for j, v in enumerate(recvs) if j != r))


def _first_error(futures: list[asyncio.Future[Any]]) -> BaseException | None:
    for f in futures:
        if f.done() and not f.cancelled() and f.exception() is not None:
            return f.exception()
    return None
