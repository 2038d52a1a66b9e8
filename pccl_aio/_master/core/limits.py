"""The master's bounds against hostile clients and members, sans-IO (``MasterState`` holds them).

Every resource a connection can make the master hold is bounded (``Limits``):

- a connection must say ``Hello`` within ``hello_timeout`` (heartbeats do not count);
- at most ``max_pending_peers`` registered peers wait for admission; the next ``Hello`` gets
  ``Rejected("too many peers waiting to join")``;
- a member has at most ``max_collectives_per_peer`` collectives launched and not ended; one
  more is a protocol violation (kicked, its launches dropped like any departed peer's);
- ``Hello.advertise_host`` must be empty or the connection's own address (``advertise_error``)
  unless ``allow_any_advertise_host``: else a joiner could point other peers' traffic anywhere;
- the wire caps every string and list a peer sends (``_wire/messages.py``), and a peer holds at
  most one counted vote of each kind, so nothing else grows per member.

Hello floods. The documented training loop runs ``update_topology()`` when ``are_peers_pending()``
answers True, and that answered True whenever any joiner was registered. A client opening
connections that each say ``Hello`` (and close, or stay silent) kept one joiner registered at
every vote, so every step became a topology round: no all-reduce ran, and every joiner
admitted that way was a member that never voted, which stalled the group until it left or its
heartbeat timed out (and each of those departures re-sent the whole membership to everyone);
each ``Hello`` also parsed the address of every registered peer (1.1 ms at 500 joiners; now
one, ``state.py``).
Two rules (``Admission``) keep the run going: a joiner counts as pending only once the master heard
from it after its ``Hello`` (a ``Communicator`` sends its first heartbeat 0.5 s after its
``Welcome``, whatever its ``heartbeat_interval``), and ``are_peers_pending()`` answers
True at most once per ``admission_interval``: joiners are admitted in batches. A joiner that
leaves before its batch is forgotten without any work for the group. ``update_topology()``
itself still admits every joiner (the callers asked for it), but a joiner of a replica
(``Hello.replica``) only once all ``replica_size`` processes of it registered. What these
rules cannot stop: a flood keeping ``max_pending_peers`` joiners registered refuses honest
joiners (silent ones expire after ``heartbeat_timeout``; before the run starts, only a
replica's processes can wait), and a hostile client that speaks the protocol (heartbeats)
and, once admitted, never votes stalls the group; only a run secret keeps such clients out.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math

from ..._wire import messages as m

__all__ = ["Admission", "Limits", "advertise_error"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The bounds of one master (see the module docstring); checked when built."""

    max_collectives_per_peer: int = 1024
    max_pending_peers: int = 256
    hello_timeout: float = 5.0
    admission_interval: float = 1.0
    allow_any_advertise_host: bool = False

    def __post_init__(self) -> None:
        if self.max_collectives_per_peer < 1 or self.max_pending_peers < 1:
            raise ValueError("max_collectives_per_peer and max_pending_peers must be >= 1")
        if not (self.hello_timeout > 0 and self.admission_interval >= 0):
            raise ValueError("hello_timeout must be > 0 and admission_interval >= 0")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an address (an IPv4-mapped IPv6 one as its IPv4), or None."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])  # no zone: fe80::1%eth0
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def advertise_error(advertised: str, host: str) -> str | None:
    """Why a connection from ``host`` may not advertise ``advertised`` (None: it may)."""
    if not advertised:
        return None
    ip = _ip(advertised)
    if ip is None:
        return (f"advertise_host {advertised[:64]!r} is not an IP address; advertise this "
                "peer's address as seen by the master, or leave it empty")
    if ip != _ip(host):
        return (f"advertise_host {advertised} is not this connection's address {host}; "
                "leave it empty or start the master with allow_any_advertise_host")
    return None


class Admission:
    """Who may join, and when: connections without ``Hello`` (since when), joiners
    (registered, not yet accepted: heard from since their ``Hello``?), the batches they are
    admitted in (one per ``admission_interval``) and the replicas they belong to: a joiner of
    a replica is admissible once every process of it registered (``ready``), so that a
    replica's processes join in the same round."""

    __slots__ = ("_live_now", "_next", "_replica", "_sizes", "_unnamed", "announced", "joiners",
                 "limits")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._unnamed: dict[int, float] = {}  # conn -> connect time, no Hello yet
        self.joiners: dict[int, bool] = {}  # conn -> heard from after its Hello
        self._next = -math.inf  # earliest time of the next batch of joiners
        self.announced = False  # what the members were last told (``PeersWaiting``)
        self._replica: dict[int, tuple[str, int]] = {}  # conn -> (replica, its size)
        self._sizes: dict[str, int] = {}  # replica -> its registered processes
        self._live_now: bool | None = None  # ``_live``, until a joiner or replica changes

    def connected(self, conn: int, now: float) -> None:
        self._unnamed[conn] = now

    def heard(self, conn: int) -> bool:
        """Anything from ``conn``: a joiner is now known to be alive (True: it just became
        one)."""
        if self.joiners.get(conn) is False:
            self.joiners[conn] = True
            self._live_now = None
            return True
        return False

    def full(self) -> bool:
        return len(self.joiners) >= self.limits.max_pending_peers

    def registered(self, conn: int, joiner: bool, replica: str = "", size: int = 1) -> None:
        """``conn`` said ``Hello``: accepted at once, or (``joiner``) waits for admission;
        ``replica`` (of ``size`` processes) is the one it belongs to ("": none)."""
        self._unnamed.pop(conn, None)
        self._live_now = None
        if joiner:
            self.joiners[conn] = False
        if replica:
            self._replica[conn] = (replica, size)
            self._sizes[replica] = self._sizes.get(replica, 0) + 1

    def admitted(self, conn: int) -> None:
        self.joiners.pop(conn, None)
        self._live_now = None

    def forget(self, conn: int) -> None:
        self._live_now = None
        self._unnamed.pop(conn, None)
        self.joiners.pop(conn, None)
        replica = self._replica.pop(conn, None)
        if replica is not None:
            left = self._sizes[replica[0]] - 1
            if left:
                self._sizes[replica[0]] = left
            else:
                del self._sizes[replica[0]]

    def complete(self, conn: int) -> bool:
        """Every process of ``conn``'s replica registered (True without a replica)."""
        replica = self._replica.get(conn)
        return replica is None or self._sizes[replica[0]] >= replica[1]

    def completes(self, hello: m.Hello) -> bool:
        """Would ``hello``'s peer, registered, complete its replica (True without one)?"""
        return self._sizes.get(hello.replica, 0) + 1 >= hello.replica_size

    def ready(self, replica: str | None = None) -> list[int]:
        """The joiners that may be admitted now (their replicas complete; of ``replica``
        only, if given), ascending."""
        return sorted(c for c in self.joiners if self.complete(c) and (
            replica is None or self._replica.get(c, ("", 0))[0] == replica))

    def expired(self, now: float) -> list[int]:
        """Connections without ``Hello`` for longer than ``hello_timeout``."""
        return [c for c, since in self._unnamed.items()
                if now - since > self.limits.hello_timeout]

    def due(self, now: float) -> bool:
        """Would an ``are_peers_pending()`` vote completed at ``now`` answer True?"""
        return now >= self._next and self._live()

    def batch_due(self, now: float) -> bool:
        """The answer to a completed ``are_peers_pending()`` vote at ``now``: True if a live
        joiner of a complete replica waits and no batch was announced within
        ``admission_interval``."""
        if now < self._next or not self._live():
            return False
        self._next = now + self.limits.admission_interval
        return True

    def _live(self) -> bool:
        """A joiner heard from since its ``Hello`` waits, its replica complete (kept until a
        joiner or a replica changes: asked after every event)."""
        if self._live_now is None:
            self._live_now = any(live and self.complete(c) for c, live in self.joiners.items())
        return self._live_now
