"""The blocking ``Master`` of ``pccl_aio.blocking``: the async master served from a thread of
its own (``_net/loopthread.py``), for scripts and tests."""

from __future__ import annotations

import weakref
from types import TracebackType
from typing import Any

from .._net.loopthread import finalize
from .._net.loopthread import owned as _owned
from .server import Master as _AsyncMaster

__all__ = ["Master"]

_HERE = frozenset({__file__})  # a traceback leaves this module's wrappers out


class Master:
    """A blocking ``pccl_aio.Master`` for scripts and tests: the same options; ``start()`` (or
    ``with``) binds and serves from a background thread until ``close()``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 48148, **options: Any) -> None:
        self._runner, self._master = _owned("pccl_aio blocking master",
                                             lambda: _AsyncMaster(host, port, **options), _HERE)
        self._finalizer = weakref.finalize(self, finalize, self._runner, self._master.close)

    def start(self) -> Master:
        """Bind and serve; returns once listening. OSError if the address is taken."""
        self._runner.call(self._master.start())
        return self

    def close(self) -> None:
        """Stop serving, close every connection and stop the thread. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Master:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port the master listens on (the OS's choice when constructed with 0)."""
        return self._master.port

    @property
    def address(self) -> str:
        """``host:port`` peers connect to."""
        return self._master.address

    @property
    def gate(self) -> Any:
        """The listener's handshake counters (``gate.stats``)."""
        return self._master.gate

    @property
    def host(self) -> str:
        """The host the master listens on."""
        return self._master.host

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between the master's liveness ticks."""
        return self._master.heartbeat_interval

    @property
    def status_address(self) -> str:
        """``http://host:port/`` of the status page ("" without one)."""
        return self._master.status_address

    @property
    def metrics_address(self) -> str:
        """``http://host:port/metrics`` ("" without metrics)."""
        return self._master.metrics_address
