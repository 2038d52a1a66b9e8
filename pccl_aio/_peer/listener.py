"""The data plane's listening socket: accepts receive connections for ``receiver._Receiver``."""

from __future__ import annotations

import asyncio
import contextlib

from .receiver import Registry, _Receiver


class Listener:
    """The p2p listening socket of one communicator."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.conns: set[_Receiver] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int = 0) -> None:
        """Listen on ``host:port`` (0: the OS chooses; ``port`` tells it)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Receiver(self.registry, self.conns), host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    def abort(self) -> None:
        """Stop listening and drop every receive connection at once."""
        if self._server is not None:
            self._server.close()
        for c in list(self.conns):
            c.close()

    async def close(self) -> None:
        """``abort``, then wait (at most 1 s) until the listening socket is closed."""
        self.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
