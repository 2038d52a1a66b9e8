"""Shared fixtures: a master on 127.0.0.1 with an OS-chosen port, and joined peer sets."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import pccl_aio as pccl
from pccl_aio import blocking
from pccl_aio._peer.testing import crash, record_sends

__all__ = ["FAST", "admit", "blocking_pair", "closed", "crash", "crash_after", "join_peers",
           "master", "peers", "raw_master", "record_sends", "reduce_ok", "rss"]

FAST = {"heartbeat_interval": 0.2, "heartbeat_timeout": 2.0}
#: Run secrets for tests: strong enough for ``auth.check_secret`` (made once with
#: ``python -m pccl_aio.secret``), and two that differ.
SECRET = "uV4hS0dXcW3tm7pE8Rk2Jf9yLq1Zb6Na5Gs-TeYoHiQ"
OTHER_SECRET = "Pz7Wq2Xe9Rt4Yu1Io8Ka3Sd6Fg0Hj5Kl-MnBvCxZaQ"


@pytest.fixture
async def master() -> AsyncIterator[pccl.Master]:
    """A master on an OS-chosen port. Joiners are admitted as soon as they are heard from
    (``admission_interval=0``): tests join peers one after another, and batching them once
    a second (the default) would only make the suite slower; ``test_master_bounds.py`` and
    the README's process tests run with the default."""
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                           admission_interval=0.0) as m:
        yield m


async def admit(accepted: list[pccl.Communicator], joiner: pccl.Communicator) -> None:
    """Connect ``joiner`` and admit it with a joint vote of the ``accepted`` peers."""
    task = asyncio.ensure_future(joiner.connect())
    # are_peers_pending is a joint vote, so every round trip is a real protocol exchange.
    while not all(await asyncio.gather(*(c.are_peers_pending() for c in accepted))):
        if task.done():
            await task  # raises why the joiner could not connect
    await asyncio.gather(*(c.update_topology() for c in accepted))
    await task


async def join_peers(master: pccl.Master, n: int, *, groups: list[int] | None = None,
                     **kw: Any) -> list[pccl.Communicator]:
    """Connect ``n`` communicators: the first alone, each next one admitted by a joint vote."""
    opts = {**FAST, **kw}
    groups = groups or [0] * n
    comms = [pccl.Communicator(master.address, peer_group=g, **opts) for g in groups]
    await comms[0].connect()
    for i in range(1, n):
        await admit(comms[:i], comms[i])
    return comms


@pytest.fixture
async def peers(
        master: pccl.Master) -> AsyncIterator[Callable[..., Awaitable[list[pccl.Communicator]]]]:
    made: list[pccl.Communicator] = []

    async def make(n: int, **kw: Any) -> list[pccl.Communicator]:
        comms = await join_peers(master, n, **kw)
        made.extend(comms)
        return comms

    yield make
    for c in made:
        with contextlib.suppress(Exception):
            await c.close()


async def reduce_ok(comms: list[pccl.Communicator], n: int = 1000) -> None:
    """A correct all-reduce of the whole group (peer i contributes i + 1): they still work."""
    import numpy as np

    xs = [np.full(n, i + 1, np.float32) for i in range(len(comms))]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    total = sum(range(1, len(comms) + 1))
    assert all((x == total).all() for x in xs)


async def raw_master(port: int, secret: str | bytes | None = None
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A bare connection to a master on 127.0.0.1 that completed the handshake with
    ``secret`` (none: a run without a secret), as a hand-written client would."""
    from pccl_aio._net.handshake import greet
    from pccl_aio._wire import auth

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.wait_for(
        greet(reader, writer, auth.ROLE_MASTER, auth.secret_key(secret), 0, 0), 5)
    return reader, writer


async def closed(r: asyncio.StreamReader, within: float = 5.0) -> bool:
    """True once the other side closed the connection (EOF or reset) within ``within`` s,
    discarding whatever it sent before."""
    try:
        async with asyncio.timeout(within):
            while await r.read(1 << 16):
                pass
    except TimeoutError:
        return False
    except (ConnectionError, OSError):
        pass
    return True


def rss(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no VmRSS for process {pid}")


def blocking_pair(address: str) -> list[blocking.Communicator]:
    """Two blocking communicators of one group at ``address`` (FAST heartbeats), in rank
    order: the first connects, then admits the second while it connects from a thread."""
    comms = [blocking.Communicator(address, **FAST) for _ in range(2)]
    comms[0].connect()
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(comms[1].connect)
        while not comms[0].are_peers_pending():
            pass
        comms[0].update_topology()
        joining.result()
    return sorted(comms, key=lambda c: c.rank)


@contextlib.contextmanager
def crash_after(watched, victim, phase: int, k: int) -> Iterator[list[int]]:
    """Crash ``victim`` once ``watched`` received its ``k``-th segment of ``phase``; yields a
    one-item list counting those segments. Collective.on_segment is restored on exit."""
    from pccl_aio._peer import testing
    from pccl_aio._peer.data import collective as _collective

    seen = [0]
    orig_on_segment = _collective.Collective.on_segment

    def on_segment(self, ph, off, length, p0, p1):
        orig_on_segment(self, ph, off, length, p0, p1)
        if self.env is testing.data_plane(watched) and ph == phase:
            seen[0] += 1
            if seen[0] == k:
                crash(victim)

    _collective.Collective.on_segment = on_segment  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        _collective.Collective.on_segment = orig_on_segment  # type: ignore[method-assign]
