"""The peer: ``Communicator``, the public API of a run's participant.

Seams: the master connection and its message dispatch live in ``_control.py``; one all-reduce
attempt lives in ``_collective.py``; links and the receiver in ``_dataplane.py``; the retry
scheduler in ``_multi.py``. This module holds the public calls and their argument checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator, Sequence
from types import TracebackType
from typing import Any

from .._errors import InvalidUsageError, TooFewPeersError
from .._types import (
    Quantization,
    ReduceInfo,
    ReduceOp,
    SyncInfo,
    SyncStrategy,
)
from .._wire import messages as m
from .collective import Collective
from .control import ControlPlane
from .core import args
from .core.shared_state import SharedState

__all__ = ["AllReduceHandle", "Communicator"]



class AllReduceHandle(Awaitable[ReduceInfo]):
    """An all-reduce in flight; ``await handle`` gives its ``ReduceInfo`` or raises.

    Cancelling the awaiting task aborts the collective for the whole group (the others get
    ``PeerLostError``); the communicator stays usable.
    """

    def __init__(self, coll: Collective) -> None:
        self._coll = coll

    @property
    def tag(self) -> int:
        return self._coll.tag

    def done(self) -> bool:
        return self._coll.future.done()

    async def started(self) -> bool:
        """Wait until the master started the collective (data is flowing).

        Returns False if it ended without starting (rejected, aborted while voting).
        Cancelling this wait does not affect the collective.
        """
        try:
            await asyncio.shield(self._coll.started)
        except asyncio.CancelledError:
            if self._coll.started.cancelled():
                return False
            raise
        return True

    def __await__(self) -> Generator[Any, None, ReduceInfo]:
        return self._wait().__await__()

    async def _wait(self) -> ReduceInfo:
        try:
            return await asyncio.shield(self._coll.future)
        except asyncio.CancelledError:
            if not self._coll.future.done():
                self._coll.comm._cancel(self._coll)
            raise


class Communicator(ControlPlane):
    """One peer of a run.

    Args:
        master: ``"host:port"`` of the master.
        peer_group: collectives and shared state are partitioned by group; membership votes
            (``update_topology``, ``are_peers_pending``) stay global.
        p2p_connections: TCP connections to each ring neighbour; one collective is striped
            over all of them.
        listen_host: interface of the data-plane listener (default: all interfaces).
        advertise_host: address other peers use to reach this one (default: as the master
            sees it).
        heartbeat_interval, heartbeat_timeout: liveness beacons to and from the master; a
            master silent for ``heartbeat_timeout`` is treated as gone (defaults 0.5 s, 5 s).
            The event loop must not be blocked for longer than that.
        data_timeout: an all-reduce that receives nothing for this long reports a failure
            and is aborted for the group (default 10 s).

    Use as ``async with Communicator(...) as comm: await comm.connect()``.
    """

    def __init__(self, master: str, *, peer_group: int = 0, p2p_connections: int = 1,
                 listen_host: str = "0.0.0.0", advertise_host: str = "",
                 heartbeat_interval: float = 0.5, heartbeat_timeout: float = 5.0,
                 data_timeout: float = 10.0) -> None:
        host, sep, port = master.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise InvalidUsageError(f"master address must be 'host:port', not {master!r}")
        if not 0 <= peer_group < 2**32:
            raise InvalidUsageError(f"peer_group must be a u32, not {peer_group}")
        if not 1 <= p2p_connections <= 256:
            raise InvalidUsageError(f"p2p_connections must be in 1..256, not {p2p_connections}")
        if min(heartbeat_interval, heartbeat_timeout, data_timeout) <= 0:
            raise InvalidUsageError("timeouts must be positive")
        super().__init__(host.strip("[]"), int(port), peer_group, p2p_connections, listen_host,
                         advertise_host, heartbeat_interval, heartbeat_timeout, data_timeout)

    async def __aenter__(self) -> Communicator:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ---- attributes ---------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Accepted peers of the whole run (all groups), as of the last membership update."""
        return self._membership.global_world_size if self._membership else 0

    @property
    def peer_group_world_size(self) -> int:
        """Accepted peers of this peer's group."""
        return len(self._membership.ring) if self._membership else 0

    @property
    def num_peer_groups(self) -> int:
        return self._membership.num_groups if self._membership else 0

    @property
    def largest_peer_group_world_size(self) -> int:
        return self._membership.largest_group_world_size if self._membership else 0

    # ---- votes --------------------------------------------------------------------------------
    async def update_topology(self) -> None:
        """Joint vote of all accepted peers (all groups): admit the peers waiting in ``connect``.

        Blocks until every accepted peer voted. Raises ``InvalidUsageError`` if collectives
        are in flight (nothing is sent), ``MasterConnectionError``/``KickedError`` if the
        session ended. Peers that die meanwhile are dropped from the vote.
        """
        self._check_usable()
        if self._colls:
            raise InvalidUsageError("update_topology() while collectives are in flight")
        await self._vote("topology", m.VoteUpdateTopology())

    async def are_peers_pending(self) -> bool:
        """Joint vote of all accepted peers: is any peer waiting to be admitted?

        Allowed while collectives are in flight. Blocks until every accepted peer asked.
        """
        self._check_usable()
        return bool(await self._vote("pending", m.VotePeersPending()))

    # ---- all-reduce ---------------------------------------------------------------------------
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
        self._check_usable()
        if not isinstance(restore_on_abort, bool):
            raise InvalidUsageError(
                f"restore_on_abort must be True or False, not {restore_on_abort!r}")
        s, d, in_place = args.buffers(src, dst)
        op = args.op(op)
        tag = args.tag(tag)
        quant = args.quantization(quantization, d.dtype)
        if tag in self._colls:
            raise InvalidUsageError(f"tag {tag} is already in flight on this peer")
        if self.peer_group_world_size < 2:
            raise TooFewPeersError(
                f"peer group {self.peer_group} has {self.peer_group_world_size} peer(s)")
        coll = Collective(self, tag, s, d, op, in_place, quant, restore=restore_on_abort)
        self._launch(coll)
        return AllReduceHandle(coll)

    async def all_reduce(self, src: Any, dst: Any = None, *, op: ReduceOp = ReduceOp.SUM,
                         tag: int = 0, quantization: Quantization | None = None,
                         restore_on_abort: bool = True) -> ReduceInfo:
        """Ring all-reduce of ``src`` into ``dst`` (in place when ``dst`` is None or ``src``).

        Blocks until the group's peers all ran it. The result bytes are identical on every
        peer. Raises ``PeerLostError`` if a peer left meanwhile (an in-place input is then
        restored; retry with the same tag), ``TooFewPeersError``, ``InvalidUsageError``.
        Cancelling aborts the collective for the group.

        In place, each part of the input is copied aside just before it is first overwritten,
        which is what lets an aborted attempt restore it bit-exactly: one buffer of memory and
        one more write of it. ``restore_on_abort=False`` skips that copy for callers who can
        recompute their input (a DiLoCo pseudo-gradient, say): an aborted attempt (lost peer,
        cancellation, master loss) then leaves the buffer holding unspecified bytes. Out of
        place, ``src`` is only read and the flag changes nothing.
        """
        return await self.all_reduce_async(src, dst, op=op, tag=tag, quantization=quantization,
                                           restore_on_abort=restore_on_abort)

    async def all_reduce_multiple_with_retry(
            self, tensors: Sequence[Any], *, op: ReduceOp = ReduceOp.SUM, max_in_flight: int = 8,
            first_tag: int = 0, max_attempts: int = 32) -> list[ReduceInfo]:
        """All-reduce every tensor in place (tags ``first_tag + i``), ``max_in_flight`` at once.

        A collective aborted by a lost peer is relaunched at once while the group keeps two
        peers; decisions follow the master's verdicts in order, so all peers stay in step.
        Raises ``TooFewPeersError`` when fewer than two peers remain (after every in-flight
        collective ended), ``InvalidUsageError`` for bad arguments.
        """
        from .retry import MultiReduce

        self._check_usable()
        if max_in_flight <= 0:
            raise InvalidUsageError(f"max_in_flight must be positive, not {max_in_flight}")
        if not tensors:
            raise InvalidUsageError("no tensors given")
        bufs = [args.buffers(t, None)[0] for t in tensors]
        tags = [args.tag(first_tag + i) for i in range(len(bufs))]
        busy = set(tags) & set(self._colls)
        if busy:
            raise InvalidUsageError(f"tags {sorted(busy)} are already in flight")
        if self.peer_group_world_size < 2:
            raise TooFewPeersError(
                f"peer group {self.peer_group} has {self.peer_group_world_size} peer(s)")
        return await MultiReduce(self, bufs, tags, args.op(op), max_in_flight,
                                 max_attempts).run()

    # ---- shared state -------------------------------------------------------------------------
    async def sync_shared_state(self, state: SharedState,
                                strategy: SyncStrategy = SyncStrategy.ENFORCE_POPULAR) -> SyncInfo:
        """Make ``state`` identical on every peer of the group (a vote of the whole group).

        Each entry is hashed (xxh3-128); the master elects the popular content and revision.
        Outdated or drifted peers fetch only their dirty entries, in place, from up-to-date
        peers (ranges spread over all of them, failing over when one dies) and re-hash them.
        Blocks until the whole group finished. Returns ``SyncInfo(tx_bytes, rx_bytes,
        revision)`` and sets ``state.revision``. Raises ``InvalidUsageError`` (collectives in
        flight), ``SharedStateError`` (no up-to-date source, fetch failed or a hash mismatch;
        retry), ``KickedError`` (this peer's keys/dtypes/sizes, revision or strategy broke the
        rules). Cancelling leaves the peer in the sync; close the communicator then.
        """
        from .sync import sync_shared_state

        return await sync_shared_state(self, state, strategy)

