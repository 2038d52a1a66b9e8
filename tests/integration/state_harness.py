"""What the shared-state tests (``test_shared_state_*.py``) have in common: buffers, sync
helpers, and a crash that also kills a peer's state server.

Peer ids ascend in the order ``peers(n)`` returns the communicators, so "the lowest peer id"
is always the first communicator of a list. Vote order is forced where it matters by waiting
until the master holds a vote before the next peer votes (no sleeps).
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

import pccl_aio as pccl
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



def u8(value: int, n: int = 1024) -> np.ndarray:
    return np.full(n, value, np.uint8)


def raw(t) -> bytes:
    """The bytes of a numpy array or torch tensor (bfloat16 included), for bit-exact checks."""
    if torch is not None and isinstance(t, torch.Tensor):
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.numpy().tobytes()
    return t.tobytes()


def random_bits(shape, dtype, seed: int) -> np.ndarray:
    """An array of ``dtype`` whose bytes are random (NaN payloads, -0.0, infinities...)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    b = np.random.default_rng(seed).integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return b.view(dt).reshape(shape)


async def sync(comms, states, strategies=None):
    strategies = strategies or [EP] * len(comms)
    return await asyncio.gather(*(c.sync_shared_state(s, strategy=st)
                                  for c, s, st in zip(comms, states, strategies)))


async def sync_settled(comms, states, strategies=None):
    strategies = strategies or [EP] * len(comms)
    return await asyncio.gather(*(c.sync_shared_state(s, strategy=st)
                                  for c, s, st in zip(comms, states, strategies)),
                                return_exceptions=True)


async def wait_voted(master, comm) -> None:
    """Until the master holds ``comm``'s sync vote (it is then reset at consensus)."""
    while master.state._peers[comm.peer_id].sync_vote is None:
        await asyncio.sleep(0)


async def sync_in_order(master, comms, states, order, strategies=None):
    """Vote in ``order`` (indices into comms): each vote reaches the master before the next."""
    strategies = strategies or [EP] * len(comms)
    tasks: dict[int, asyncio.Future] = {}
    for n, i in enumerate(order):
        tasks[i] = asyncio.ensure_future(comms[i].sync_shared_state(states[i], strategy=strategies[i]))
        if n < len(order) - 1:
            await wait_voted(master, comms[i])
    return await asyncio.gather(*(tasks[i] for i in range(len(comms))), return_exceptions=True)


def vanish(comm, *tasks) -> None:
    """Like ``crash`` (a killed process), also killing the shared-state server and the tasks
    the "process" was running (conftest's ``crash`` leaves the state server listening)."""
    crash(comm)
    srv = comm._state_server
    if srv._server is not None:
        srv._server.close()
    for w in list(srv._writers):
        w.transport.abort()
    for t in tasks:
        t.cancel()


async def reap(*tasks) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(BaseException):
            await t


def tx_rx(infos):
    return [(i.tx_bytes, i.rx_bytes) for i in infos]
