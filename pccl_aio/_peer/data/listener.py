"""The data plane's listening socket: every connection completes the handshake
(``_net/handshake.py``) before its bytes reach a ``receiver._Receiver`` (or, for a link
measurement, the ``measure.Measurer`` it was given)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Protocol

from ..._net.handshake import Gate, Handoff, KeyFor
from ..._net.tasks import TaskSet
from ..._wire import auth
from .measure import Measurer
from .receiver import Registry, _Receiver


class Acceptor(Protocol):
    """Who takes the connections of another role (point-to-point, ``_peer/p2p``)."""

    key_for: KeyFor

    def accept(self, conn: Handoff, peer: int) -> None: ...


class Listener:
    """The p2p listening socket of one communicator. ``key_for`` decides who may connect
    (``KeyRing.accepting``); ``gate`` bounds the handshakes and counts refusals; ``measure``
    takes the link-measurement connections (None: refused like any unknown role), ``p2p``
    the point-to-point ones."""

    def __init__(self, registry: Registry, key_for: KeyFor, gate: Gate,
                 measure: Measurer | None = None, p2p: Acceptor | None = None) -> None:
        self.registry = registry
        self.conns: set[_Receiver] = set()
        self._key_for, self._gate = key_for, gate
        self._server: asyncio.Server | None = None
        self._tasks = TaskSet("pccl_aio data listener")
        self.port = 0
        self.measure = measure
        self.p2p = p2p

    async def start(self, host: str, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        """Listen on ``host:port`` (0: the OS chooses; ``port`` tells it), over TLS with ``tls``."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Handoff(lambda c: self._tasks.spawn(self._accept(c))), host, port, ssl=tls,
            ssl_handshake_timeout=self._gate.timeout if tls else None)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, conn: Handoff) -> None:
        admitted = await self._gate.admit(conn, conn, self._role_key)
        if admitted is None:
            return
        if self._server is None or not self._server.is_serving():
            conn.transport.abort()
            return
        if admitted[0].role == auth.ROLE_MEASURE and self.measure is not None:
            self.measure.accept(conn)
            return
        if admitted[0].role == auth.ROLE_P2P and self.p2p is not None:
            self.p2p.accept(conn, admitted[0].client_id)
            return
        conn.hand_over(_Receiver(self.registry, self.conns, peer=admitted[0].client_id))

    async def _role_key(self, opening: auth.Opening) -> bytes | None:
        if opening.role == auth.ROLE_MEASURE and self.measure is not None:
            return await self.measure.key_for(opening)
        if opening.role == auth.ROLE_P2P and self.p2p is not None:
            return await self.p2p.key_for(opening)
        return await self._key_for(opening)

    def abort(self) -> None:
        """Stop listening and drop every receive connection at once."""
        if self._server is not None:
            self._server.close()
        for c in list(self.conns):
            c.close()

    async def close(self) -> None:
        """``abort``, then wait (at most 1 s) until the listening socket is closed and every
        handshake ended."""
        self.abort()
        await self._tasks.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
