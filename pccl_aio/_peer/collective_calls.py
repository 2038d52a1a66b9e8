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
    """Barrier, all-reduce (one, several with retry) and the ranks; ``Communicator`` sets
    the parts."""

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
    def barrier_async(self, *, tag: int = 0) -> AllReduceHandle:
        """Launch a barrier now and return an awaitable handle (``wait()``, ``cancel()``,
        ``started()``, as an all-reduce's). Raises ``InvalidUsageError`` (bad tag, tag in
        flight) or ``TooFewPeersError`` (group smaller than two) before anything is sent."""
        return self._reduce.launch(bytearray(0), None, ReduceOp.SUM, tag, None, False, False,
                                   CollectiveKind.BARRIER)

    async def barrier(self, *, tag: int = 0, timeout: float | None = None) -> None:
        """Block until every peer of the group called ``barrier`` (with this ``tag``).

        A collective that moves no data, with every guarantee of an all-reduce: it returns on
        every peer or raises on every peer. Raises ``PeerLostError`` if a peer of the group
        left before all arrived (retry on the survivors), ``InvalidUsageError`` if another
        peer runs another collective with this tag (``DeadlockError`` if the peers wait on
        each other in other calls), ``TooFewPeersError``. Cancelling, or ``timeout``
        expiring (``PcclTimeoutError``), ends it for the group.
        """
        limit = deadline.check(timeout)
        handle = self._reduce.launch(bytearray(0), None, ReduceOp.SUM, tag, None, False, True,
                                     CollectiveKind.BARRIER)
        await handle.wait(limit)

    # ---- all-reduce -------------------------------------------------------------------------
    def all_reduce_async(self, src: Any, dst: Any = None, *, op: ReduceOp = ReduceOp.SUM,
                         tag: int = 0, quantization: Quantization | None = None,
                         restore_on_abort: bool = True) -> AllReduceHandle:
        """Launch an all-reduce now and return an awaitable handle.

        The vote goes out before this returns, so several launches keep their order; every
        peer of the group must launch the same tags in the same order. Raises
        ``InvalidUsageError`` (bad argument, tag already in flight), ``TooFewPeersError``
        (group smaller than two) before anything is sent. ``restore_on_abort``: see
        ``all_reduce``.
        """
        return self._reduce.launch(src, dst, op, tag, quantization, restore_on_abort, False)

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

