"""``SharedStateSync``: the peer's half of shared-state synchronisation.

Sequence: hash every entry (xxh3-128) -> serve the state and vote (``VoteSync``) -> the master
answers with a ``SyncPlan`` -> fetch the dirty entries straight into the tensors, spreading
byte ranges over every up-to-date source, and re-hash them -> ``SyncDone`` -> wait until the
whole group is done (``SyncComplete``), serving others meanwhile.
"""

from __future__ import annotations

import asyncio

from .._errors import InvalidUsageError, PcclTimeoutError, SharedStateError
from .._types import SyncInfo, SyncStrategy
from .._wire import messages as m
from . import deadline
from .core.shared_state import SharedState, hash_bytes
from .env import SyncControl
from .transfer import StateServer, fetch_ranges, split

_THREAD_HASH_BYTES = 32 << 20  # hash in a worker thread above this, so the loop keeps beating


async def _hashes(state: SharedState) -> dict[str, bytes]:
    if state.nbytes > _THREAD_HASH_BYTES:
        return await asyncio.to_thread(state.hashes)
    return state.hashes()


class SharedStateSync:
    """Shared-state sync of one communicator: its state server and the state it serves."""

    def __init__(self, control: SyncControl, data_timeout: float) -> None:
        self.control = control
        self.data_timeout = data_timeout
        self.server = StateServer(self._lookup)
        self.serving: SharedState | None = None  # the state of the sync in progress

    def _lookup(self, key: str, revision: int) -> memoryview | None:
        state = self.serving
        if state is None or key not in state.keys:
            return None
        return state.view(key)

    async def run(self, state: SharedState, strategy: SyncStrategy,
                  timeout: float | None = None) -> SyncInfo:
        """See ``Communicator.sync_shared_state``."""
        control = self.control
        control.check_usable()
        if not isinstance(state, SharedState):
            raise InvalidUsageError(f"expected a SharedState, not {type(state).__name__}")
        try:
            strategy = SyncStrategy(strategy)
        except ValueError:
            raise InvalidUsageError(f"unknown sync strategy {strategy!r}") from None
        if control.colls:
            raise InvalidUsageError("sync_shared_state() while collectives are in flight")
        if self.serving is not None:
            raise InvalidUsageError("another sync_shared_state() is running on this peer")
        self.serving = state  # claimed before the first await: a second call is refused
        tx0 = self.server.tx
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout

        def left() -> float | None:
            return None if end is None else max(end - loop.time(), 1e-3)

        what = "sync_shared_state()"
        try:
            hashes = await deadline.within(_hashes(state), left(), what)
            entries = [m.SyncEntry(k, dt, n, b"" if loose else hashes[k], loose)
                       for k, dt, n, loose in state.entries()]
            vote = m.VoteSync(state.revision, int(strategy), entries, state.fresh)
            plan = await deadline.within(control.vote("sync", vote), left(), what)
            assert isinstance(plan, m.SyncPlan)
            done = control.expect("sync_done")
            rx, error = 0, None
            if plan.keys:
                try:
                    rx = await deadline.within(self._fetch(state, plan), left(), what)
                except Exception as exc:  # any failure of the fetch is the group's to know
                    error = exc
            control.send(m.SyncDone(error is None, repr(error)[:200] if error else ""))
            await deadline.within(done, left(), what)
            if isinstance(error, PcclTimeoutError):
                raise error
            if error is not None:
                if isinstance(error, SharedStateError):
                    raise error
                raise SharedStateError(
                    f"shared-state fetch failed: {error}; retry the sync") from error
            state.revision = plan.revision
            state.fresh = False
            return SyncInfo(self.server.tx - tx0, rx, plan.revision)
        finally:
            self.serving = None

    async def _fetch(self, state: SharedState, plan: m.SyncPlan) -> int:
        me = self.control.peer_id
        sources = [(s.host, s.state_port) for s in plan.sources if s.peer_id != me]
        if not sources:
            raise SharedStateError(f"no peer can serve revision {plan.revision}")
        # Rotate so that requesters spread over the sources, then share ranges between them.
        k = me % len(sources)
        sources = sources[k:] + sources[:k]
        pieces = []
        for key in plan.keys:
            pieces.extend(split(key, state.view(key)))
        rx = await fetch_ranges(sources, plan.revision, pieces, self.data_timeout)
        for key, want in zip(plan.keys, plan.hashes):
            if want and hash_bytes(state.view(key)) != want:
                raise SharedStateError(
                    f"entry {key!r} received from a peer does not match the elected hash")
        return rx
