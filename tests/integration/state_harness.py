"""What the shared-state tests (``test_shared_state_*.py``) have in common: buffers, sync
helpers, a crash that also kills a peer's state server, and event-driven synchronisation.

Peer ids ascend in the order ``peers(n)`` returns the communicators, so "the lowest peer id"
is always the first communicator of a list. Vote order is forced where it matters by waiting
until the master has handled a vote before the next peer votes (``MasterLog``; no sleeps).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any

import numpy as np

import pccl_aio as pccl
from pccl_aio._master.core.events import Event, Received, Send
from pccl_aio._peer import testing
from pccl_aio._peer.state.transfer import StateServer
from pccl_aio._wire import messages as m
from tests.helpers import crash

EP = pccl.SyncStrategy.ENFORCE_POPULAR
RO = pccl.SyncStrategy.RECEIVE_ONLY
SO = pccl.SyncStrategy.SEND_ONLY
MiB = 1 << 20
PIECE = 8 * MiB  # ranges are fetched in pieces of this size

try:
    import torch
except ImportError:  # pragma: no cover - torch is installed in CI
    torch = None


# ---- buffers ------------------------------------------------------------------------------------


def u8(value: int, n: int = 1024) -> np.ndarray:
    return np.full(n, value, np.uint8)


def raw(t: Any) -> bytes:
    """The bytes of a numpy array or torch tensor (bfloat16 included), for bit-exact checks."""
    if torch is not None and isinstance(t, torch.Tensor):
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.numpy().tobytes()
    return t.tobytes()


def random_bits(shape: Any, dtype: Any, seed: int) -> np.ndarray:
    """An array of ``dtype`` whose bytes are random (NaN payloads, -0.0, infinities...)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    b = np.random.default_rng(seed).integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return b.view(dt).reshape(shape)


def tx_rx(infos: Sequence[Any]) -> list[tuple[int, int]]:
    return [(i.tx_bytes, i.rx_bytes) for i in infos]


# ---- events instead of polling -------------------------------------------------------------------


class Tally:
    """Things that happened, in order; ``await tally.reached(n)`` returns once ``n`` have.

    ``add`` is called from the code under observation (a spy), so a waiter is woken by the
    event itself, never by polling.
    """

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: Any = None) -> None:
        self.items.append(item)
        for n, fut in self._waiters:
            if len(self.items) >= n and not fut.done():
                fut.set_result(None)
        self._waiters = [(n, f) for n, f in self._waiters if not f.done()]

    async def reached(self, n: int) -> None:
        if len(self.items) >= n:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        await fut


class MasterLog:
    """Records every message the master has *handled*, per sending peer and message type.

    It wraps the master's sans-IO entry point (``master.state.handle``: every event goes
    through it) and learns each connection's peer id from the ``Welcome`` the master answers
    with, so it depends on messages only, not on the master's internals. Create it before the
    peers connect.
    """

    def __init__(self, master: pccl.Master) -> None:
        self._peer_of: dict[int, int] = {}  # connection -> peer id, from Welcome
        self._tallies: dict[tuple[int, type[m.PeerToMaster]], Tally] = {}
        handle = master.state.handle

        def spy(event: Event) -> list[Any]:
            actions = handle(event)
            for act in actions:
                if isinstance(act, Send) and isinstance(act.msg, m.Welcome):
                    self._peer_of[act.conn] = act.msg.peer_id
            if isinstance(event, Received) and event.conn in self._peer_of:
                self._tally(self._peer_of[event.conn], type(event.msg)).add(event.msg)
            return actions

        master.state.handle = spy  # type: ignore[method-assign]

    def _tally(self, peer_id: int, kind: type[m.PeerToMaster]) -> Tally:
        return self._tallies.setdefault((peer_id, kind), Tally())

    def received(self, comm: pccl.Communicator, kind: type[m.PeerToMaster]) -> Tally:
        """The ``kind`` messages from ``comm`` that the master has handled so far."""
        assert comm.peer_id in self._peer_of.values(), \
            f"peer {comm.peer_id} connected before this MasterLog was created"
        return self._tally(comm.peer_id, kind)

    async def vote(self, comm: pccl.Communicator, aw: Awaitable[Any]) -> asyncio.Future[Any]:
        """Start ``aw`` (a sync of ``comm``) and return its future once the master has handled
        the ``VoteSync`` that it sends."""
        votes = self.received(comm, m.VoteSync)
        n = len(votes)
        task = asyncio.ensure_future(aw)
        await first_of(votes.reached(n + 1), task)
        assert len(votes) > n, f"the sync ended before its vote reached the master: {task}"
        return task


async def first_of(event: Awaitable[Any], *tasks: asyncio.Future[Any]) -> None:
    """Wait for ``event``, or until one of ``tasks`` ends first (then the event never comes:
    the caller's assertion, not a timeout, reports it)."""
    waiter = asyncio.ensure_future(event)
    try:
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter


# ---- syncs ---------------------------------------------------------------------------------------


async def sync(comms, states, strategies=None):
    strategies = strategies or [EP] * len(comms)
    return await asyncio.gather(*(c.sync_shared_state(s, strategy=st)
                                  for c, s, st in zip(comms, states, strategies)))


async def sync_settled(comms, states, strategies=None):
    strategies = strategies or [EP] * len(comms)
    return await asyncio.gather(*(c.sync_shared_state(s, strategy=st)
                                  for c, s, st in zip(comms, states, strategies)),
                                return_exceptions=True)


async def sync_in_order(log: MasterLog, comms, states, order, strategies=None):
    """Vote in ``order`` (indices into comms): each vote reaches the master before the next."""
    strategies = strategies or [EP] * len(comms)
    tasks: dict[int, asyncio.Future[Any]] = {}
    for n, i in enumerate(order):
        call = comms[i].sync_shared_state(states[i], strategy=strategies[i])
        if n < len(order) - 1:
            tasks[i] = await log.vote(comms[i], call)
        else:
            tasks[i] = asyncio.ensure_future(call)
    return await asyncio.gather(*(tasks[i] for i in range(len(comms))), return_exceptions=True)


# ---- crashes -------------------------------------------------------------------------------------


def state_server(comm: pccl.Communicator) -> StateServer:
    """The server that answers ``comm``'s range requests; tests swap its ``lookup`` to serve
    wrong bytes, stall or crash mid-transfer. The one place that knows where it lives."""
    return testing.shared_state_sync(comm).server


def vanish(comm: pccl.Communicator, *tasks: asyncio.Future[Any]) -> None:
    """A killed process: ``crash`` (every socket aborted, the state server closed) and the
    tasks the "process" was running cancelled."""
    crash(comm)
    for t in tasks:
        t.cancel()


async def reap(*tasks: asyncio.Future[Any]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(BaseException):
            await t

