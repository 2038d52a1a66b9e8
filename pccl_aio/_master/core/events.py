"""Events into and actions out of the sans-IO master (``state.MasterState``)."""

from __future__ import annotations

import dataclasses
from typing import TypeAlias

from ..._wire import messages as m

# ---- events ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Connected:
    conn: int
    host: str
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Received:
    conn: int
    msg: m.PeerToMaster
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Malformed:
    """A frame that failed to decode (``body``) or broke framing; closes that connection."""

    conn: int
    reason: str
    now: float
    body: bytes = b""


@dataclasses.dataclass(frozen=True, slots=True)
class Disconnected:
    conn: int
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    """The master's clock: silent peers and expired votes are judged; with ``beacon``, every
    peer is sent a ``MasterHeartbeat``."""

    now: float
    beacon: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Rejoining:
    """A connection's first message is this rejoining ``Hello``, before it is named (so a
    run it takes over frees its id first: ``Failover.provisional``)."""

    msg: m.Hello
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Heard:
    """Another master of the run (``where``) answered a probe: its term, run and members."""

    answer: m.ProbeAnswer
    where: str
    now: float


Event: TypeAlias = Connected | Received | Malformed | Disconnected | Tick | Heard | Rejoining

# ---- actions --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Send:
    conn: int
    msg: m.MasterToPeer


@dataclasses.dataclass(frozen=True, slots=True)
class Close:
    conn: int
    reason: str


Action: TypeAlias = Send | Close
