"""What a collective sees of its communicator: ``CollectiveEnv`` (``typing.Protocol``s).

A part depends on the few calls it makes, never on another part's private members; each
Protocol sits beside its consumer (this one: ``collective.py`` and ``pipeline.py``; the
retry scheduler's ``Launcher`` in ``retry.py``, the shared-state sync's ``SyncControl`` in
``state/sync.py``). The communicator wires the concrete objects together.
"""

from __future__ import annotations

from typing import Protocol

from ..._net.tasks import TaskSet
from .core.slots import Pool
from .link import Link
from .receiver import Sink


class SinkTable(Protocol):
    """The receive side's seq -> collective table as a collective uses it
    (``receiver.Registry``)."""

    def add(self, seq: int, sink: Sink) -> None: ...

    def skip(self, seq: int) -> None: ...

    def remove(self, seq: int) -> None: ...


class CollectiveEnv(Protocol):
    """What a collective needs from its communicator, and nothing more."""

    @property
    def scratch(self) -> Pool: ...

    @property
    def registry(self) -> SinkTable: ...

    @property
    def tasks(self) -> TaskSet: ...

    @property
    def p2p_connections(self) -> int: ...

    @property
    def data_timeout(self) -> float: ...

    async def link(self, peer_id: int) -> Link:
        """The open link to ``peer_id`` (connecting it if needed)."""

    def report(self, tag: int, seq: int, ok: bool, reason: str, suspect: int = 0,
               stalled: bool = False) -> None:
        """Tell the master this peer's part of (tag, seq) ended (``CollectiveDone``)."""
