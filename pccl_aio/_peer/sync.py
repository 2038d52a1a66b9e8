"""``Communicator.sync_shared_state``: the peer's half of shared-state synchronisation.

Sequence: hash every entry (xxh3-128) -> serve the state and vote (``VoteSync``) -> the master
answers with a ``SyncPlan`` -> fetch the dirty entries straight into the tensors, spreading
byte ranges over every up-to-date source, and re-hash them -> ``SyncDone`` -> wait until the
whole group is done (``SyncComplete``), serving others meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .._errors import InvalidUsageError, SharedStateError
from .._types import SyncInfo, SyncStrategy
from .._wire import messages as m
from .core.shared_state import SharedState, hash_bytes
from .transfer import fetch_ranges, split

if TYPE_CHECKING:
    from .communicator import Communicator

_THREAD_HASH_BYTES = 32 << 20  # hash in a worker thread above this, so the loop keeps beating


async def _hashes(state: SharedState) -> dict[str, bytes]:
    if state.nbytes > _THREAD_HASH_BYTES:
        return await asyncio.to_thread(state.hashes)
    return state.hashes()


async def sync_shared_state(comm: Communicator, state: SharedState,
                            strategy: SyncStrategy) -> SyncInfo:
    """See ``Communicator.sync_shared_state``."""
    comm._check_usable()
    if not isinstance(state, SharedState):
        raise InvalidUsageError(f"expected a SharedState, not {type(state).__name__}")
    strategy = SyncStrategy(strategy)
    if comm._colls:
        raise InvalidUsageError("sync_shared_state() while collectives are in flight")
    if comm._serving is not None:
        raise InvalidUsageError("another sync_shared_state() is running on this peer")
    comm._serving = state  # claimed before the first await: a second call is refused
    tx0 = comm._state_server.tx
    try:
        hashes = await _hashes(state)
        entries = [m.SyncEntry(k, dt, n, b"" if loose else hashes[k], loose)
                   for k, dt, n, loose in state.entries()]
        plan = await comm._vote("sync", m.VoteSync(state.revision, int(strategy), entries,
                                                   state.fresh))
        assert isinstance(plan, m.SyncPlan)
        done = comm._expect("sync_done")
        rx, error = 0, None
        if plan.keys:
            try:
                rx = await _fetch(comm, state, plan)
            except (ConnectionError, TimeoutError, OSError, SharedStateError) as exc:
                error = exc
        comm._send(m.SyncDone(error is None, repr(error) if error else ""))
        await done
        if error is not None:
            if isinstance(error, SharedStateError):
                raise error
            raise SharedStateError(f"shared-state fetch failed: {error}; retry the sync") from error
        state.revision = plan.revision
        state.fresh = False
        return SyncInfo(comm._state_server.tx - tx0, rx, plan.revision)
    finally:
        comm._serving = None


async def _fetch(comm: Communicator, state: SharedState, plan: m.SyncPlan) -> int:
    sources = [(s.host, s.state_port) for s in plan.sources if s.peer_id != comm.peer_id]
    if not sources:
        raise SharedStateError(f"no peer can serve revision {plan.revision}")
    # Rotate so that requesters spread over the sources, then share ranges between them.
    k = comm.peer_id % len(sources)
    sources = sources[k:] + sources[:k]
    pieces = []
    for key in plan.keys:
        pieces.extend(split(key, state.view(key)))
    rx = await fetch_ranges(sources, plan.revision, pieces, comm.data_timeout)
    for key, want in zip(plan.keys, plan.hashes):
        if want and hash_bytes(state.view(key)) != want:
            raise SharedStateError(
                f"entry {key!r} received from a peer does not match the elected hash")
    return rx

