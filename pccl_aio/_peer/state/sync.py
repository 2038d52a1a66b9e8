"""``SharedStateSync``: the peer's half of shared-state synchronisation.

Sequence: hash every entry (xxh3-128) -> serve the state and vote (``VoteSync``) -> the master
answers with a ``SyncPlan`` -> fetch the dirty entries straight into the tensors, spreading
byte ranges over every up-to-date source, and re-hash them -> ``SyncDone`` -> wait until the
whole group is done (``SyncComplete``), serving others meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from ..._errors import InvalidUsageError, PcclTimeoutError, SharedStateError
from ..._net.handshake import Gate
from ..._types import SyncInfo, SyncStrategy
from ..._wire import auth
from ..._wire import messages as m
from ..._wire.fields import VoteKind
from .. import deadline
from ..core.config import PeerConfig
from ..data.keys import KeyRing
from .core.shared_state import SharedState, hash_bytes
from .progress import Meter, ProgressFn, check
from .transfer import Source, StateServer, fetch_ranges, split

_THREAD_HASH_BYTES = 32 << 20  # hash in a worker thread above this, so the loop keeps beating
log = logging.getLogger("pccl_aio.state")


async def _hashes(state: SharedState) -> dict[str, bytes]:
    if state.nbytes > _THREAD_HASH_BYTES:
        return await asyncio.to_thread(state.hashes)
    return state.hashes()


class SyncControl(Protocol):
    """What shared-state sync needs from the master session (``control.ControlPlane``)."""

    @property
    def peer_id(self) -> int: ...

    @property
    def colls(self) -> Mapping[int, Any]: ...

    def check_usable(self) -> None: ...

    def ids(self, **fields: Any) -> dict[str, dict[str, Any]]: ...

    def send(self, msg: m.PeerToMaster) -> None: ...

    def report_sync(self, ok: bool, reason: str) -> None: ...

    async def vote(self, kind: VoteKind, msg: m.PeerToMaster) -> Any: ...

    def verdict(self) -> asyncio.Future[Any]:
        """A future for the group's verdict on the sync whose plan came."""

class SharedStateSync:
    """Shared-state sync of one communicator: its state server and the state it serves."""

    def __init__(self, control: SyncControl, config: PeerConfig, keys: KeyRing,
                 gate: Gate) -> None:
        self.control = control
        self.config = config
        self.data_timeout = config.data_timeout
        self.keys = keys
        self.server = StateServer(self._lookup, keys.accepting(auth.ROLE_STATE), gate)
        self.serving: SharedState | None = None  # the state of the sync in progress
        self.plan: m.SyncPlan | None = None  # its plan, once the master sent it
        self._planned = asyncio.Event()

    async def _lookup(self, peer: int, key: str, revision: int) -> memoryview | None:
        """What to serve ``peer``: an entry of the sync in progress, only to a fetcher its
        plan names and only at the plan's revision. A request may come before this peer
        read the plan (the master sends it to all at once): waits for it, at most
        ``data_timeout``."""
        if self.serving is None:
            return None
        if self.plan is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.data_timeout):
                    await self._planned.wait()
        plan, state = self.plan, self.serving
        if (plan is None or state is None or plan.revision != revision
                or peer not in plan.fetchers or key not in state.keys):
            return None
        return state.view(key)

    async def run(self, state: SharedState, strategy: SyncStrategy,
                  timeout: float | None = None, progress: ProgressFn | None = None) -> SyncInfo:
        """See ``Communicator.sync_shared_state``."""
        control = self.control
        control.check_usable()
        if not isinstance(state, SharedState):
            raise InvalidUsageError(f"expected a SharedState, not {type(state).__name__}")
        progress = check(progress)
        try:
            strategy = SyncStrategy(strategy)
        except ValueError:
            raise InvalidUsageError(f"unknown sync strategy {strategy!r}") from None
        if not isinstance(state.revision, int) or not 0 <= state.revision < 2**63:
            raise InvalidUsageError("SharedState.revision must be an int in [0, 2**63), not "
                                    f"{state.revision!r}")
        if control.colls:
            raise InvalidUsageError("sync_shared_state() while collectives are in flight")
        if self.serving is not None:
            raise InvalidUsageError("another sync_shared_state() is running on this peer")
        state.refresh()  # a from_module state follows load_state_dict
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
            for note in plan.kicked:  # the others' mistakes: this peer's sync goes on
                log.warning("shared-state sync of revision %d: %s", plan.revision, note,
                            extra=self.control.ids(revision=plan.revision))
            self.plan = plan
            self._planned.set()
            done = control.verdict()
            rx, error, served = 0, None, collections.Counter[int]()
            t0 = loop.time()
            if plan.keys:
                try:
                    rx = await deadline.within(self._fetch(state, plan, progress, served),
                                               left(), what)
                except Exception as exc:  # any failure of the fetch is the group's to know
                    error = exc
            took = loop.time() - t0
            control.report_sync(error is None, repr(error)[:200] if error else "")
            await deadline.within(done, left(), what)
            if isinstance(error, PcclTimeoutError):
                raise error
            if error is not None:
                if isinstance(error, SharedStateError):
                    raise error
                raise SharedStateError(
                    f"shared-state fetch failed: {error}; retry the sync") from error
            state.store()  # (device tensors: their host twins' bytes back)
            state.revision = plan.revision
            state.fresh = False
            info = SyncInfo(self.server.tx - tx0, rx, plan.revision)
            self._log(info, sorted(served), took)
            return info
        finally:
            self.serving = self.plan = None
            self._planned.clear()

    def _log(self, info: SyncInfo, sources: list[int], took: float) -> None:
        ids = self.control.ids(revision=info.revision, bytes=info.rx_bytes, sources=sources,
                               sent=info.tx_bytes)
        if info.rx_bytes:
            log.info("synced shared state: revision %d, fetched %d B from peers %s in %.2f s",
                     info.revision, info.rx_bytes, ", ".join(map(str, sources)), took, extra=ids)
        else:
            log.debug("synced shared state: revision %d, nothing fetched (sent %d B)",
                      info.revision, info.tx_bytes, extra=ids)

    async def _fetch(self, state: SharedState, plan: m.SyncPlan, progress: ProgressFn | None,
                     served: collections.Counter[int]) -> int:
        me = self.control.peer_id
        sources = [Source(s.host, s.state_port, s.peer_id, self.keys.key(s.peer_id))
                   for s in plan.sources if s.peer_id != me]
        if not sources:
            raise SharedStateError(f"no peer can serve revision {plan.revision}")
        # Rotate so that requesters spread over the sources, then share ranges between them.
        k = me % len(sources)
        sources = sources[k:] + sources[:k]
        pieces = []
        for key in plan.keys:
            pieces.extend(split(key, state.view(key)))
        tls = self.config.ssl if self.config.ssl_server is not None else None
        meter = Meter(progress, sum(len(p[2]) for p in pieces),
                      self.control.ids(revision=plan.revision))
        rx = await fetch_ranges(sources, plan.revision, pieces, self.data_timeout, me, tls,
                                on_bytes=meter.add if meter.active else None, served=served)
        for key, want in zip(plan.keys, plan.hashes):
            if want and hash_bytes(state.view(key)) != want:
                raise SharedStateError(
                    f"entry {key!r} received from a peer does not match the elected hash")
        meter.finish()
        return rx
