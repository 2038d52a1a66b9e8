"""``DataPlane``: one communicator's data-plane resources, and the ``CollectiveEnv`` its
collectives run in.

It owns the listener (receive side, ``receiver.py``), one ``Link`` per ring successor
(``link.py``), the pooled scratch buffers and the tasks of running collectives. Addresses
come from the master's latest ``Membership``; reports go to the master through ``report``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

from ..._errors import InvalidUsageError
from ..._net.handshake import Gate
from ..._net.tasks import TaskSet
from ..._wire import auth
from ..._wire import messages as m
from ..core.config import PeerConfig
from .core.scratch import ScratchPool
from .keys import KeyRing
from .link import Link
from .listener import Acceptor, Listener
from .measure import Measurer
from .receiver import Registry


class DataPlane:
    """Listener, links, buffers and collective tasks of one communicator."""

    def __init__(self, config: PeerConfig,
                 report: Callable[[int, int, bool, str, int, bool], None], keys: KeyRing,
                 gate: Gate, registry: Registry, measure: Measurer,
                 p2p: Acceptor | None = None) -> None:
        self.config = config
        self._report = report  # CollectiveDone to the master
        self.registry = registry  # shared with the control plane (its tickets' seqs)
        self.scratch = ScratchPool()
        self.tasks = TaskSet("pccl_aio data plane")
        self.keys = keys
        self.listener = Listener(self.registry, keys.accepting(auth.ROLE_DATA), gate,
                                 measure, p2p)
        self._links: dict[int, Link] = {}
        self._bandwidth: dict[int, float] = {}  # peer id -> measured bits/s (set_bandwidth)
        self._ring: list[m.PeerAddr] = []
        self.peer_id = 0

    def report(self, tag: int, seq: int, ok: bool, reason: str, suspect: int = 0,
               stalled: bool = False) -> None:
        self._report(tag, seq, ok, reason, suspect, stalled)

    @property
    def p2p_connections(self) -> int:
        """The connections per link: the fixed count, or (automatic) the most any open link
        has (a collective sizes its receive-slot blocks by it)."""
        fixed = self.config.p2p_connections
        return fixed if fixed is not None else max((k.k for k in self._links.values()),
                                                   default=1)

    @property
    def links(self) -> Mapping[int, Link]:
        """Peer id -> the link to it, open or broken (a read-only view)."""
        return MappingProxyType(self._links)

    @property
    def bandwidths(self) -> dict[int, float]:
        """Peer id -> the bandwidth ``set_bandwidth`` holds for it (bits/s; a copy)."""
        return dict(self._bandwidth)

    def link_connections(self) -> dict[int, int]:
        """Peer id -> connections of the open link to it (for benchmarks and tests)."""
        return {pid: len(k.senders) for pid, k in self._links.items() if k.senders}

    def set_bandwidth(self, peer_id: int, bits_per_s: float | None) -> None:
        """A measured bandwidth to ``peer_id`` (bits/s; None forgets it), used to choose the
        connections of the link to it (``p2p_connections`` automatic) when that link is next
        built: the first collective to that peer, or the one after a ring change or a broken
        connection. A link already open keeps its connections, so no collective in flight
        changes its striping. Raises InvalidUsageError unless positive and finite."""
        if bits_per_s is None:
            self._bandwidth.pop(peer_id, None)
        elif isinstance(bits_per_s, bool) or not isinstance(bits_per_s, (int, float)) or not (
                math.isfinite(bits_per_s) and bits_per_s > 0):
            raise InvalidUsageError(f"bandwidth must be positive bits/s, not {bits_per_s!r}")
        else:
            self._bandwidth[peer_id] = float(bits_per_s)
        link = self._links.get(peer_id)
        if link is not None:
            link.set_bandwidth(self._bandwidth.get(peer_id))

    @property
    def data_timeout(self) -> float:
        return self.config.data_timeout

    async def start(self, host: str) -> None:
        """Open the listener on ``host``; ``listener.port`` tells where."""
        await self.listener.start(host, tls=self.config.ssl_server)

    def on_membership(self, msg: m.Membership, peer_id: int) -> None:
        """A new ring: close the links to peers that left it, and every link if this peer's
        id changed (it rejoined as a new member: its links name the old id, and a frame on
        one is another sender's to the receiver, which aborts the collective)."""
        renamed = peer_id != self.peer_id
        self._ring, self.peer_id = list(msg.ring), peer_id
        alive = {p.peer_id for p in msg.ring}
        self._bandwidth = {p: b for p, b in self._bandwidth.items() if p in alive}
        for pid in [p for p in self._links if renamed or p not in alive]:
            self._links.pop(pid).close()

    def address(self, peer_id: int) -> m.PeerAddr | None:
        """The listener of ring member ``peer_id`` (None: not in the ring)."""
        return next((p for p in self._ring if p.peer_id == peer_id), None)

    async def link(self, peer_id: int) -> Link:
        """The open link to ``peer_id``, replacing a broken one. Raises ConnectionError if
        the peer is not in the ring or cannot be reached. Cancelling stops waiting only."""
        link = self._links.get(peer_id)
        if link is None or link.broken:
            if link is not None:
                link.close()
            addr = self.address(peer_id)
            if addr is None:
                raise ConnectionError(f"peer {peer_id} is not in the ring")
            link = Link(addr, self.keys.key(peer_id), self.config, self.peer_id, self.tasks,
                        self._bandwidth.get(peer_id))
            self._links[peer_id] = link
        await link.open()
        return link

    def abort(self) -> None:
        """Drop every connection at once (no goodbye); tasks end through ``close``."""
        for link in self._links.values():
            link.close()
        self._links.clear()
        self.listener.abort()

    async def close(self) -> None:
        """Close every link and the listener, and wait for every collective task to end."""
        self.abort()
        await self.listener.close()
        await self.tasks.close()
