"""A tiny read-only HTTP/1.1 server on asyncio streams: the master's status page and the
``/metrics`` endpoints of the master and of peers.

It answers ``GET`` and ``HEAD`` of a fixed set of paths, one request per connection
(``Connection: close``), and nothing else: a request line and headers above 8 KiB, a client
slower than ``timeout`` or beyond ``max_clients`` at once get the connection closed (or a
4xx/5xx). A route is a plain function called on the event loop, so it must be quick (it
reads in-memory state): serving never blocks the loop for longer than a route takes.
A route may read the request's ``Host`` (``request_host``); a path in ``missing`` is a 404
whose body says where to look instead.
``close`` stops listening and cancels the connections being served.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import ssl as _ssl
from collections.abc import Callable, Mapping
from http import HTTPStatus

from .._errors import InvalidUsageError
from .tasks import TaskSet

__all__ = ["HttpServer", "Response", "Route", "check_port", "request_host"]

log = logging.getLogger("pccl_aio.http")

Response = tuple[str, bytes]  # content type, body
Route = Callable[[], Response]

_MAX_HEAD = 8192
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253})(:[0-9]{1,5})?")
_request_host: contextvars.ContextVar[str] = contextvars.ContextVar("request_host", default="")


def request_host() -> str:
    """The host of the ``Host`` header of the request a route answers (``"[::1]"`` for IPv6),
    "" outside a request or without a well-formed one."""
    return _request_host.get()


def check_port(name: str, port: object) -> int | None:
    """``port`` (an int in 0..65535, 0: the OS picks) or None; else InvalidUsageError that
    names the argument ``name``."""
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 <= port <= 65535):
        raise InvalidUsageError(f"{name} must be a port (0-65535) or None, not {port!r}")
    return port


class HttpServer:
    """Serve ``routes`` (path -> function returning (content type, body)) on host:port
    (port 0: the OS picks one; ``port`` then tells it)."""

    def __init__(self, routes: Mapping[str, Route], host: str = "127.0.0.1", port: int = 0, *,
                 name: str = "pccl_aio http", timeout: float = 10.0, max_clients: int = 32,
                 ssl: _ssl.SSLContext | None = None,
                 missing: Mapping[str, str] | None = None) -> None:
        self.routes = dict(routes)
        self.missing = dict(missing or {})  # path -> the body of its 404 (a hint)
        self.host, self._port, self.name = host, port, name
        self._timeout, self._max, self._ssl = timeout, max_clients, ssl
        self._server: asyncio.Server | None = None
        self._tasks = TaskSet(name)

    @property
    def port(self) -> int:
        """The port it listens on (the OS's choice once started with port 0)."""
        if self._server is not None and self._server.sockets:
            return int(self._server.sockets[0].getsockname()[1])
        return self._port

    async def start(self) -> None:
        """Listen (raises OSError if the address is taken)."""
        self._server = await asyncio.start_server(self._on_client, self.host, self._port,
                                                  ssl=self._ssl, limit=_MAX_HEAD)
        log.info("%s on http://%s:%d/ (%s)", self.name, self.host, self.port,
                 ", ".join(sorted(self.routes)))

    async def close(self) -> None:
        """Stop listening; cancel and await the requests being served."""
        if self._server is not None:
            self._server.close()
        await self._tasks.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tasks) >= self._max:
            writer.close()  # beyond max_clients at once: shed it
            return
        self._tasks.spawn(self._serve(reader, writer), name=f"{self.name} request")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                status, headers, body, head_only = self._answer(await _read_head(reader))
                writer.write(_response(status, headers, b"" if head_only else body, len(body)))
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ValueError):
            pass  # a slow, vanished or oversized client: nothing to answer
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[HTTPStatus, dict[str, str], bytes, bool]:
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return HTTPStatus.BAD_REQUEST, {}, b"bad request\n", False
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return HTTPStatus.METHOD_NOT_ALLOWED, {"Allow": "GET, HEAD"}, b"GET only\n", False
        route = self.routes.get(target)
        if route is None:
            hint = self.missing.get(target, "not found")
            return HTTPStatus.NOT_FOUND, {}, f"{hint}\n".encode(), method == "HEAD"
        token = _request_host.set(_host(head))
        try:
            ctype, body = route()
        except Exception:  # a route bug must not end the server: 500 and a log line
            log.exception("%s: GET %s failed", self.name, target)
            return HTTPStatus.INTERNAL_SERVER_ERROR, {}, b"internal error\n", method == "HEAD"
        finally:
            _request_host.reset(token)
        return HTTPStatus.OK, {"Content-Type": ctype, "Cache-Control": "no-store"}, body, \
            method == "HEAD"


def _host(head: bytes) -> str:
    """The host of the head's ``Host`` header ("" if absent or not a host[:port])."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            found = _HOST.fullmatch(value.strip().decode("latin-1"))
            return found.group(1) if found else ""
    return ""


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line and headers (raises LimitOverrunError above the reader's limit)."""
    return await reader.readuntil(b"\r\n\r\n")


def _response(status: HTTPStatus, headers: dict[str, str], body: bytes, length: int) -> bytes:
    lines = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Length: {length}",
             "Connection: close", "X-Content-Type-Options: nosniff"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if "Content-Type" not in headers:
        lines.append("Content-Type: text/plain; charset=utf-8")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
