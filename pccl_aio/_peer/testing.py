"""Test hooks of a ``Communicator``: its parts, a crash, a spy on what it tells the master.

For tests and fault injection; not part of the stable API. A test reaches a communicator's
insides only through these functions (``tests/unit/test_private_access.py`` checks it), so that the
production classes keep their private attributes private and a change of their layout is
one change here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._wire import messages as m
from .communicator import Communicator
from .data.dataplane import DataPlane
from .data.measure import Measurer
from .observe.core.stats import PeerStats
from .p2p.calls import PointToPoint
from .session.control import ControlPlane
from .state.sync import SharedStateSync

__all__ = ["control_plane", "crash", "data_plane", "hold_fetches", "measurer", "pair_key",
           "point_to_point", "record_sends", "shared_state_sync", "stats"]


def control_plane(comm: Communicator) -> ControlPlane:
    """The master session of ``comm``: membership, collectives in flight (``colls``), votes."""
    return comm._control


def stats(comm: Communicator) -> PeerStats:
    """``comm``'s counters: payload bytes sent to and received from each peer, latencies."""
    return comm._obs.stats


def data_plane(comm: Communicator) -> DataPlane:
    """The data plane of ``comm``: its listener (``listener.port``), links, receive table
    (``registry``) and scratch buffers; a collective's ``env`` is it."""
    return comm._data


def point_to_point(comm: Communicator) -> PointToPoint:
    """The point-to-point part of ``comm``: its ``mailbox`` (receives, stash), ``outbox``."""
    return comm._p2p


def shared_state_sync(comm: Communicator) -> SharedStateSync:
    """Shared-state sync of ``comm``: its state server (``server.port``)."""
    return comm._sync


def measurer(comm: Communicator) -> Measurer:
    """The link measurements of ``comm``: probes sent, measurement connections received."""
    return comm._measure


def pair_key(comm: Communicator, peer_id: int) -> bytes:
    """The key ``comm`` shares with ``peer_id`` (empty in a run without a secret)."""
    return comm._keys.key(peer_id)


def crash(comm: Communicator) -> None:
    """Make ``comm`` vanish like a killed process: drop every connection at once (master,
    data, state server), no goodbye; its state server serves nothing from now on. Its tasks
    end through ``close``."""
    comm._control.abort()
    comm._data.abort()
    comm._sync.server.lookup = None  # a dead process serves nothing
    comm._sync.server.abort()


def record_sends(comm: Communicator) -> list[m.PeerToMaster]:
    """Every message ``comm`` sends to the master from now on, in order (a spy on its
    control plane's ``send``; what it sends is unchanged)."""
    sent: list[m.PeerToMaster] = []
    control = comm._control
    send = control.send

    def spy(*msgs: Any) -> None:
        sent.extend(msgs)
        send(*msgs)

    control.send = spy  # type: ignore[method-assign]
    return sent


def hold_fetches(comm: Communicator) -> tuple[asyncio.Event, asyncio.Event]:
    """From now on each shared-state fetch of ``comm`` waits before it starts until the
    second event is set; the first is set once one waits (a fetch held across a master's
    loss, say). Set the second to let this one and every later fetch through."""
    sync = comm._sync
    fetch, waiting, release = sync._fetch, asyncio.Event(), asyncio.Event()

    async def held(*args: Any) -> int:
        waiting.set()
        await release.wait()
        return await fetch(*args)

    sync._fetch = held  # type: ignore[method-assign,assignment]
    return waiting, release
