"""The narrow interfaces the peer's parts see each other through (``typing.Protocol``s).

A part depends on the few calls it makes, never on another part's private members: the
collective on a ``CollectiveEnv``, the retry scheduler on a ``Launcher``, the shared-state
sync on a ``SyncControl``. The communicator wires the concrete objects together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._net.tasks import TaskSet
from .._wire import messages as m
from .._wire.fields import VoteKind
from .core.slots import Pool
from .link import Link
from .receiver import Sink

if TYPE_CHECKING:
    from .collective import Collective


class Registry(Protocol):
    """The receive side's seq -> collective table (``receiver.Registry``)."""

    def add(self, seq: int, sink: Sink) -> None: ...

    def skip(self, seq: int) -> None: ...

    def remove(self, seq: int) -> None: ...


class CollectiveEnv(Protocol):
    """What a collective needs from its communicator, and nothing more."""

    @property
    def scratch(self) -> Pool: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def tasks(self) -> TaskSet: ...

    @property
    def p2p_connections(self) -> int: ...

    @property
    def data_timeout(self) -> float: ...

    async def link(self, peer_id: int) -> Link:
        """The open link to ``peer_id`` (connecting it if needed)."""

    def report(self, tag: int, seq: int, ok: bool, reason: str, suspect: int = 0) -> None:
        """Tell the master this peer's part of (tag, seq) ended (``CollectiveDone``)."""


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


class Launcher(Protocol):
    """What the retry scheduler needs: launch a collective, and the group's size now."""

    def launch(self, coll: Collective) -> None: ...

    def awaiting(self, coll: Collective) -> None: ...

    @property
    def peer_group_world_size(self) -> int: ...
