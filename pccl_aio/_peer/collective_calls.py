"""The collectives of a ``Communicator`` and the ranks they use (a base class of it).

Rank ``r`` is a peer's position in its peer group's ring for the current epoch; the ring is
the order data flows in, chosen by the master (join order until ``optimize_topology``).
Ranks change whenever the membership does: a collective runs in the world it was launched
in, and a membership change before its start makes it raise on every peer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._types import CollectiveKind, Quantization, ReduceInfo, ReduceOp
from . import deadline
from .data.handle import AllReduceHandle
from .data.reduce import ReduceCalls
from .session.control import ControlPlane

__all__ = ["CollectiveCalls"]


class CollectiveCalls:
    """Barrier, broadcast, all-gather, reduce-scatter, all-reduce (one, several with retry)
    and the ranks; ``Communicator`` sets the parts.

    There is no retry helper for mixed collectives: a broadcast's root and an all-gather's
    or reduce-scatter's buffer sizes are the caller's, chosen for the world it launched in,
    so after ``PeerLostError`` only the caller can choose them again (see the docs'
    "Collectives"); all-reduces alone retry with ``all_reduce_multiple_with_retry``."""

    _control: ControlPlane
    _reduce: ReduceCalls
    _check_usable: Callable[[], None]  # raises why the communicator cannot be used

    @property
    def rank(self) -> int:
        """This peer's position in its peer group's ring for the current epoch
        (0 .. ``peer_group_world_size`` - 1); -1 before it is admitted. It changes when the
        membership changes."""
        ranks = self.ranks
        return ranks.index(self._control.peer_id) if self._control.peer_id in ranks else -1

    @property
    def ranks(self) -> list[int]:
        """The peer ids of this peer's group in rank order (ring order) for the current
        epoch; empty before admission."""
        ms = self._control.membership
        return [p.peer_id for p in ms.ring] if ms is not None else []

    # ---- barrier ----------------------------------------------------------------------------
    def barrier_async(self, *, tag: int = 0, ring: Sequence[int] | None = None
                      ) -> AllReduceHandle:
        """Launch a barrier now and return an awaitable handle (``wait()``, ``cancel()``,
        ``started()``, as an all-reduce's). Raises ``InvalidUsageError`` (bad tag, tag in
        flight) before anything is sent. ``ring``: as ``all_reduce_async``'s."""
        return self._reduce.launch_ranked(CollectiveKind.BARRIER, bytearray(0), None, None, tag,
                                          None, 0, False, ring=ring)

    async def barrier(self, *, tag: int = 0, timeout: float | None = None) -> None:
        """Block until every peer of the group called ``barrier`` (with this ``tag``).

        A collective that moves no data, with every guarantee of an all-reduce: it returns on
        every peer or raises on every peer. Raises ``PeerLostError`` if the group changed
        before all arrived (retry on the survivors), ``InvalidUsageError`` if another peer
        runs another collective with this tag (``DeadlockError`` if the peers wait on each
        other in other calls). In a group of one it returns at once. Cancelling, or
        ``timeout`` expiring (``PcclTimeoutError``), ends it for the group.
        """
        limit = deadline.check(timeout)
        handle = self._reduce.launch_ranked(CollectiveKind.BARRIER, bytearray(0), None, None,
                                            tag, None, 0, True)
        await handle.wait(limit)

    # ---- broadcast, all-gather, reduce-scatter ----------------------------------------------
    def broadcast_async(self, tensor: Any, *, root: int, tag: int = 0,
                        restore_on_abort: bool = False, ring: Sequence[int] | None = None
                        ) -> AllReduceHandle:
        """Launch a broadcast now and return its handle (as ``all_reduce_async``'s; ``root``
        a rank of ``ring`` when given)."""
        return self._reduce.launch_ranked(CollectiveKind.BROADCAST, tensor, None, None, tag,
                                          None, root, False, restore_on_abort, ring)

    async def broadcast(self, tensor: Any, *, root: int, tag: int = 0,
                        restore_on_abort: bool = False,
                        timeout: float | None = None) -> ReduceInfo:
        """Copy rank ``root``'s ``tensor`` into ``tensor`` on every peer of the group.

        ``root`` is a rank of the ring as it is at the call (``comm.ranks``); the bytes go
        once along the ring from the root, pipelined. Blocks until every peer has them. Raises
        ``PeerLostError`` if a peer left before it ended (the root included) or if the group
        changed since the call (the ranks did: look again and retry), ``InvalidUsageError`` if
        the peers disagree on root, count or dtype (``DeadlockError`` if they wait on each
        other). In a group of one it returns at once. Cancelling, or ``timeout`` expiring
        (``PcclTimeoutError``), ends it for the group.

        After a failure the root's tensor is as it was (it is only read); another peer's,
        the output, holds unspecified bytes (as with ``torch.distributed``) unless
        ``restore_on_abort=True``, which copies each part aside just before it is first
        overwritten (one more copy of the tensor) and puts it back.
        """
        limit = deadline.check(timeout)
        handle = self._reduce.launch_ranked(CollectiveKind.BROADCAST, tensor, None, None, tag,
                                            None, root, True, restore_on_abort)
        return await handle.wait(limit)

    def all_gather_async(self, src: Any, dst: Any, *, tag: int = 0,
                         ring: Sequence[int] | None = None) -> AllReduceHandle:
        """Launch an all-gather now and return its handle (as ``all_reduce_async``'s)."""
        return self._reduce.launch_ranked(CollectiveKind.ALL_GATHER, src, dst, None, tag, None,
                                          0, False, ring=ring)

    async def all_gather(self, src: Any, dst: Any, *, tag: int = 0,
                         timeout: float | None = None) -> ReduceInfo:
        """Gather every peer's ``src`` into ``dst``, in rank order: rank r's at elements
        ``[r * n, (r + 1) * n)``, ``n`` = ``src``'s count, ``dst`` holding world x ``n``.

        A ring all-gather (P - 1 steps, segments pipelined). ``src`` may be this rank's slot
        of ``dst`` (in place). Blocks until every peer has every block; ``src`` is only read,
        ``dst`` holds unspecified bytes after a failure. Raises as ``broadcast`` does (a
        group that changed since the call: ``dst``'s size is wrong now, resize and retry).
        """
        limit = deadline.check(timeout)
        handle = self._reduce.launch_ranked(CollectiveKind.ALL_GATHER, src, dst, None, tag,
                                            None, 0, True)
        return await handle.wait(limit)

    def reduce_scatter_async(self, src: Any, dst: Any, *, op: ReduceOp = ReduceOp.SUM,
                             tag: int = 0, quantization: Quantization | None = None,
                             ring: Sequence[int] | None = None) -> AllReduceHandle:
        """Launch a reduce-scatter now and return its handle (as ``all_reduce_async``'s)."""
        return self._reduce.launch_ranked(CollectiveKind.REDUCE_SCATTER, src, dst, op, tag,
                                          quantization, 0, False, ring=ring)

    async def reduce_scatter(self, src: Any, dst: Any, *, op: ReduceOp = ReduceOp.SUM,
                             tag: int = 0, quantization: Quantization | None = None,
                             timeout: float | None = None) -> ReduceInfo:
        """Reduce ``src`` (world x ``n`` elements, ``n`` = ``dst``'s count) over the group
        and give rank r chunk r of the result, ``[r * n, (r + 1) * n)``, in ``dst``.

        The first half of the ring all-reduce, quantized on the wire as there (uint4 needs an
        even ``n``); each chunk is reduced in the same ring order on every run. Blocks until
        this peer's chunk is final and every peer has its own; ``src`` is only read, ``dst``
        holds unspecified bytes after a failure. Raises as ``broadcast`` does.
        """
        limit = deadline.check(timeout)
        handle = self._reduce.launch_ranked(CollectiveKind.REDUCE_SCATTER, src, dst, op, tag,
                                            quantization, 0, True)
        return await handle.wait(limit)

    # ---- all-reduce -------------------------------------------------------------------------
    def all_reduce_async(self, src: Any, dst: Any = None, *, op: ReduceOp = ReduceOp.SUM,
                         tag: int = 0, quantization: Quantization | None = None,
                         restore_on_abort: bool = True,
                         ring: Sequence[int] | None = None) -> AllReduceHandle:
        """Launch an all-reduce now and return an awaitable handle.

        The vote goes out before this returns, so several launches keep their order; every
        peer of the group must launch the same tags in the same order. Raises
        ``InvalidUsageError`` (bad argument, tag already in flight), ``TooFewPeersError``
        (group smaller than two) before anything is sent. ``restore_on_abort``: see
        ``all_reduce``. ``ring``: the peer ids, in rank order, of the only ring it may run in
        (``comm.ranks`` as the caller took it): if the group's ring is another when the
        master starts it (a peer lost or admitted since), it fails with ``PeerLostError`` on
        every peer, so that a caller who sized its work by a membership never gets a result
        of another.
        """
        return self._reduce.launch(src, dst, op, tag, quantization, restore_on_abort, False,
                                   ring)

    async def all_reduce(self, src: Any, dst: Any = None, *, op: ReduceOp = ReduceOp.SUM,
                         tag: int = 0, quantization: Quantization | None = None,
                         restore_on_abort: bool = True,
                         timeout: float | None = None) -> ReduceInfo:
        """Ring all-reduce of ``src`` into ``dst`` (in place when ``dst`` is None or ``src``).

        Blocks until the group's peers all ran it. The result bytes are identical on every
        peer. Raises ``PeerLostError`` if a peer left meanwhile (an in-place input is then
        restored; retry with the same tag), ``TooFewPeersError``, ``InvalidUsageError``
        (``DeadlockError`` if the peers wait on each other). Cancelling aborts the collective
        for the group; so does ``timeout`` expiring, which then raises ``PcclTimeoutError``
        once the input is restored.

        In place, each part of the input is copied aside just before it is first overwritten,
        which is what lets an aborted attempt restore it bit-exactly: one buffer of memory and
        one more write of it. ``restore_on_abort=False`` skips that copy for callers who can
        recompute their input (a DiLoCo pseudo-gradient, say): an aborted attempt (lost peer,
        cancellation, master loss) then leaves the buffer holding unspecified bytes. Out of
        place, ``src`` is only read and the flag changes nothing.
        """
        limit = deadline.check(timeout)
        handle = self._reduce.launch(src, dst, op, tag, quantization, restore_on_abort, True)
        return await handle.wait(limit)

    async def all_reduce_multiple_with_retry(
            self, tensors: Sequence[Any], *, op: ReduceOp = ReduceOp.SUM, max_in_flight: int = 8,
            first_tag: int = 0, max_attempts: int = 32, quantization: Quantization | None = None,
            restore_on_abort: bool = True, timeout: float | None = None) -> list[ReduceInfo]:
        """All-reduce every tensor in place (tags ``first_tag + i``), ``max_in_flight`` at once.

        A collective aborted by a lost peer is relaunched at once while the group keeps two
        peers; decisions follow the master's verdicts in order, so all peers stay in step.
        With ``restore_on_abort=False`` nothing is saved, so nothing is relaunched: the first
        abort raises ``PeerLostError`` (after the collectives in flight ended) and the
        aborted tensors hold unspecified bytes. Raises ``TooFewPeersError`` when fewer than
        two peers remain, ``InvalidUsageError`` for bad arguments (before anything is sent).
        Cancelling aborts what is in flight; so does ``timeout`` expiring, which raises
        ``PcclTimeoutError`` once the collectives in flight ended (their inputs restored).
        """
        self._check_usable()
        return await self._reduce.multiple(tensors, op, max_in_flight, first_tag, max_attempts,
                                           quantization, restore_on_abort,
                                           deadline.check(timeout))

