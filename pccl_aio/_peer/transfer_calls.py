"""The point-to-point calls of a ``Communicator`` (a base class of it): ``send``/``recv``
and their ``*_async`` forms (``p2p/calls.py`` does the work)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import InvalidUsageError
from .._types import ReduceInfo, ReduceOp, TransferInfo
from .collective_calls import CollectiveCalls
from .p2p import exchange
from .p2p.calls import PointToPoint, TransferHandle
from .p2p.exchange import TaskHandle

__all__ = ["TransferCalls"]


class TransferCalls(CollectiveCalls):
    """Messages between two peers of a peer group, named by peer id (``comm.ranks[r]`` is
    rank r's; a peer id does not change when the ring does). No master takes part: these
    cost one connection's round trip, not a collective's.

    Messages from one peer with one tag are received in the order they were sent. A send
    completes once its bytes are handed to the connection; a receive once its buffer holds
    the whole message. Either fails with ``PeerLostError`` if the other peer leaves the peer
    group or the connection between them is lost, and with ``MasterConnectionError`` once
    this communicator is closed."""

    _p2p: PointToPoint
    _check_usable: Callable[[], None]
    _loop: asyncio.AbstractEventLoop | None  # the loop it connected on

    def send_async(self, tensor: Any, peer: int, *, tag: int = 0) -> TransferHandle:
        """Send ``tensor`` (any contiguous CPU tensor, array or buffer; its bytes) to peer
        ``peer`` with ``tag`` (a 64-bit int) and return a ``TransferHandle`` at once. Do not
        change ``tensor`` until it completed. Raises ``InvalidUsageError`` (not a member,
        this peer itself, a bad tag or tensor) before anything is sent."""
        self._check_usable()
        return self._p2p.send_async(tensor, peer, tag)

    def send_from_thread(self, tensor: Any, peer: int, *, tag: int = 0
                         ) -> concurrent.futures.Future[int] | None:
        """For the blocking facade's threads (not the loop's): a send of at most 64 KiB
        written by the calling thread, without a hop to the loop, where the connection to
        ``peer`` is open, plain TCP, and has nothing waiting before it; the future completes
        as ``send_async``'s handle would. None: nothing was written (``send_async`` it).
        Raises as ``send_async``."""
        loop = self._loop
        if loop is None:
            raise InvalidUsageError("connect the communicator first")
        self._control.check_usable()
        return self._p2p.send_now(tensor, peer, tag, loop)

    def recv_async(self, tensor: Any, peer: int | None, *, tag: int = 0) -> TransferHandle:
        """Post a receive of a message from peer ``peer`` (None: from any member) with
        ``tag`` into ``tensor`` and return a ``TransferHandle`` at once; its
        ``TransferInfo.peer`` says who sent it. The message must have ``tensor``'s size in
        bytes (``InvalidUsageError`` from the handle otherwise; the message is dropped).
        Raises ``InvalidUsageError`` before posting anything for a bad argument."""
        self._check_usable()
        return self._p2p.recv_async(tensor, peer, tag)

    async def send(self, tensor: Any, peer: int, *, tag: int = 0,
                   timeout: float | None = None) -> TransferInfo:
        """``send_async(...)`` and wait for it (``PcclTimeoutError`` after ``timeout`` s).
        Cancelling stops waiting; bytes written stay written."""
        return await self.send_async(tensor, peer, tag=tag).wait(timeout)

    async def recv(self, tensor: Any, peer: int | None, *, tag: int = 0,
                   timeout: float | None = None) -> TransferInfo:
        """``recv_async(...)`` and wait for it (``PcclTimeoutError`` after ``timeout`` s).
        Cancelling withdraws the receive (``tensor`` then holds unspecified bytes)."""
        return await self.recv_async(tensor, peer, tag=tag).wait(timeout)

    # ---- all-to-all -------------------------------------------------------------------------
    def all_to_all_async(self, src: Sequence[Any], dst: Sequence[Any], *, tag: int = 0,
                         ring: Sequence[int] | None = None) -> TaskHandle:
        """Launch an all-to-all and return its handle at once: ``src[j]`` (a tensor per rank
        of the ring) goes to rank j, which receives it in its ``dst[r]`` (r: this peer's
        rank). Blocks may differ in size (``all_to_all_single``'s unequal splits): ``dst[j]``
        here must have the size of ``src[r]`` on rank j. Every pair of peers exchanges one
        message each way, then the group agrees on the outcome with a one-byte all-reduce
        of ``tag``: every peer completes, or every peer raises (``PeerLostError``...).
        ``ring``: as ``all_reduce_async``'s (default: the ring now). Raises
        ``InvalidUsageError`` before anything is sent for a bad argument."""
        self._check_usable()
        pinned = tuple(ring) if ring is not None else tuple(self.ranks)
        return exchange.all_to_all(self._p2p, self._agree, self._control.peer_id, pinned,
                                   src, dst, tag)

    async def all_to_all(self, src: Sequence[Any], dst: Sequence[Any], *, tag: int = 0,
                         timeout: float | None = None) -> ReduceInfo:
        """``all_to_all_async(...)`` and wait for it (``PcclTimeoutError`` after ``timeout``
        s, failing it for every peer). Cancelling fails it for every peer too."""
        return await self.all_to_all_async(src, dst, tag=tag).wait(timeout)

    def _agree(self, flag: bytearray, op: ReduceOp, tag: int, ring: tuple[int, ...]
               ) -> Any:
        return self.all_reduce_async(flag, op=op, tag=tag, ring=ring)
