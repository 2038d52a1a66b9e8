"""The point-to-point calls of a ``Communicator`` (a base class of it): ``send``/``recv``
and their ``*_async`` forms (``p2p/calls.py`` does the work)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._types import TransferInfo
from .p2p.calls import PointToPoint, TransferHandle

__all__ = ["TransferCalls"]


class TransferCalls:
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

    def send_async(self, tensor: Any, peer: int, *, tag: int = 0) -> TransferHandle:
        """Send ``tensor`` (any contiguous CPU tensor, array or buffer; its bytes) to peer
        ``peer`` with ``tag`` (a 64-bit int) and return a ``TransferHandle`` at once. Do not
        change ``tensor`` until it completed. Raises ``InvalidUsageError`` (not a member,
        this peer itself, a bad tag or tensor) before anything is sent."""
        self._check_usable()
        return self._p2p.send_async(tensor, peer, tag)

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
