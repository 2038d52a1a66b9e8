"""The master's records of peers and collectives, and the words its messages use (sans-IO)."""

from __future__ import annotations

import dataclasses
import ipaddress
from enum import IntEnum

from ..._types import CollectiveKind, DataType, QuantAlgo, ReduceOp
from ..._wire import messages as m
from .limits import advertise_error

#: A collective's descriptor as a voter gave it: (count, dtype, op, quant algo, quant dtype,
#: kind, root, launch epoch); the peers of a group must agree on all but the epoch.
Desc = tuple[int, ...]

__all__ = ["Desc", "Op", "Peer", "describe", "is_loopback", "membership", "registration_error",
           "version_reason"]


@dataclasses.dataclass(slots=True)
class Peer:
    """One connection; a peer once registered (``Hello``), a ring member once accepted."""

    conn: int
    host: str
    last_seen: float
    registered: bool = False
    accepted: bool = False
    group: int = 0
    port: int = 0
    voted_topology: bool = False
    voted_pending: bool = False
    tags: set[int] = dataclasses.field(default_factory=set)
    state_port: int = 0
    tls: bool = False  # its listeners speak TLS

    def addr(self) -> m.PeerAddr:
        return m.PeerAddr(self.conn, self.host, self.port, self.state_port)


@dataclasses.dataclass(slots=True)
class Op:
    """One collective of a group: voting (seq 0) or running on ``participants``.

    ``ticket`` (seq, epoch): the seq the group may run it as without a ``CollectiveStart``
    (handed out with the tag's previous verdict); ``early``: the voters already running it so;
    ``done`` may fill before the start with their reports."""

    descs: dict[int, Desc] = dataclasses.field(default_factory=dict)
    seq: int = 0
    participants: tuple[int, ...] = ()
    done: set[int] = dataclasses.field(default_factory=set)
    waits: set[int] = dataclasses.field(default_factory=set)  # voters awaiting it (not started)
    ticket: tuple[int, int] = (0, 0)
    early: set[int] = dataclasses.field(default_factory=set)


def membership(epoch: int, accepted: list[Peer], conns: list[int], term: int = 0,
               rounds: tuple[int, int] = (0, 0)) -> list[tuple[int, m.Membership]]:
    """The ``Membership`` of each of ``conns``: its group's ring among ``accepted`` (in order)."""
    sizes: dict[int, int] = {}
    for p in accepted:
        sizes[p.group] = sizes.get(p.group, 0) + 1
    groups = {p.conn: p.group for p in accepted}
    rings: dict[int, list[m.PeerAddr]] = {}  # (one list per group, shared by its members)
    for p in accepted:
        rings.setdefault(p.group, []).append(p.addr())
    out = []
    for c in conns:
        out.append((c, m.Membership(epoch, len(accepted), len(sizes),
                                    max(sizes.values(), default=0), rings[groups[c]],
                                    term=term, pending_round=rounds[0],
                                    topology_round=rounds[1])))
    return out


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def registration_error(hello: m.Hello, host: str, other: Peer | None,
                       any_host: bool = False) -> str | None:
    """Why a ``Hello`` from ``host`` may not register next to ``other``, any registered peer
    (None: it may): a foreign ``advertise_host`` (unless ``any_host``), loopback and not
    mixed, TLS and not mixed. (The registered peers agree on both, so one stands for all: a
    ``Hello`` costs O(1) address parses, not one per registered peer.)"""
    why = None if any_host else advertise_error(hello.advertise_host, host)
    if why is None and other and is_loopback(other.host) != is_loopback(
            hello.advertise_host or host):
        why = "loopback and non-loopback peers cannot be mixed in one run"
    if why is None and other and other.tls != hello.tls:
        why = (f"this run's peers {'' if other.tls else 'do not '}use TLS between them "
               f"(Communicator(ssl_server=)); this peer does{'' if hello.tls else ' not'}")
    return why


def _name(cls: type[IntEnum], code: int, lower: bool = False) -> str:
    try:
        name = cls(code).name
    except ValueError:  # only a message built past decoding carries an unknown code
        return f"{cls.__name__} {code}"
    return name.lower() if lower else name


def describe(desc: Desc) -> str:
    """A collective's descriptor in words: ``all-reduce 1024 x float32 SUM`` (+ its
    quantization), ``broadcast 1024 x float32 from rank 0``, ``barrier``."""
    count, dtype, op, algo, qdtype, kind, root = desc[:7]
    name = _name(CollectiveKind, kind, True).replace("_", "-")
    if kind == CollectiveKind.BARRIER:
        return name
    text = f"{name} {count} x {_name(DataType, dtype, True)}"
    if kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER):
        text += f" {_name(ReduceOp, op)}"
    if kind == CollectiveKind.BROADCAST:
        text += f" from rank {root}"
    if algo:
        text += f" quantized {_name(QuantAlgo, algo)} to {_name(DataType, qdtype, True)}"
    return text


def version_reason(version: int) -> str:
    return (f"protocol version {version} is not supported; this master speaks "
            f"version {m.PROTOCOL_VERSION}")
