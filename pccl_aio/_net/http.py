"""A tiny read-only HTTP/1.1 server on asyncio streams: the master's status page and the
``/metrics`` endpoints of the master and of peers.

It answers ``GET`` and ``HEAD`` of a fixed set of paths, one request per connection
(``Connection: close``), and nothing else; h11 parses the request and writes the response.
A request line and headers above 8 KiB (h11's ``max_incomplete_event_size``), a head that
takes longer than ``head_timeout``, a client slower than ``timeout`` in all, or one beyond
``max_clients`` at once (``per_address`` from one address) get the connection closed (or a
4xx/5xx): stalled clients hold a slot for seconds, and one address cannot hold them all.
A route is a plain function called on the event loop, so it must be quick (it
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

import h11

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
                 head_timeout: float = 2.0, per_address: int = 4,
                 ssl: _ssl.SSLContext | None = None,
                 missing: Mapping[str, str] | None = None) -> None:
        self.routes = dict(routes)
        self.missing = dict(missing or {})  # path -> the body of its 404 (a hint)
        self.host, self._port, self.name = host, port, name
        self._timeout, self._max, self._ssl = timeout, max_clients, ssl
        self._head_timeout, self._per_address = min(head_timeout, timeout), per_address
        self._clients: dict[str, int] = {}  # address -> connections being served
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
        addr = str((writer.get_extra_info("peername") or ("?",))[0])
        if len(self._tasks) >= self._max or self._clients.get(addr, 0) >= self._per_address:
            writer.close()  # beyond max_clients (or per_address) at once: shed it
            return
        self._clients[addr] = self._clients.get(addr, 0) + 1
        self._tasks.spawn(self._serve(reader, writer, addr), name=f"{self.name} request")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     addr: str) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                async with asyncio.timeout(self._head_timeout):
                    conn, request = await _read_request(reader)
                if conn is None:
                    return  # oversized or cut short: nothing to answer
                status, headers, body = self._answer(request)
                head_only = request is not None and request.method == b"HEAD"
                writer.write(_response(conn, status, headers, body, head_only))
                await writer.drain()
        except (TimeoutError, ConnectionError, h11.LocalProtocolError):
            pass  # a slow or vanished client: nothing to answer
        finally:
            writer.close()
            if (left := self._clients.pop(addr, 1) - 1) > 0:
                self._clients[addr] = left

    def _answer(self, request: h11.Request | None
                ) -> tuple[HTTPStatus, dict[str, str], bytes]:
        if request is None or request.http_version not in (b"1.0", b"1.1"):
            return HTTPStatus.BAD_REQUEST, {}, b"bad request\n"
        method = request.method.decode("ascii")
        target = request.target.decode("latin-1").split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return HTTPStatus.METHOD_NOT_ALLOWED, {"Allow": "GET, HEAD"}, b"GET only\n"
        route = self.routes.get(target)
        if route is None:
            return HTTPStatus.NOT_FOUND, {}, f"{self.missing.get(target, 'not found')}\n".encode()
        token = _request_host.set(_host(request))
        try:
            ctype, body = route()
        except Exception:  # a route bug must not end the server: 500 and a log line
            log.exception("%s: GET %s failed", self.name, target)
            return HTTPStatus.INTERNAL_SERVER_ERROR, {}, b"internal error\n"
        finally:
            _request_host.reset(token)
        return HTTPStatus.OK, {"Content-Type": ctype, "Cache-Control": "no-store"}, body


def _host(request: h11.Request) -> str:
    """The host of the request's ``Host`` header ("" if empty or not a host[:port])."""
    value = next((v for k, v in request.headers if k == b"host"), b"")
    found = _HOST.fullmatch(value.decode("latin-1"))
    return found.group(1) if found else ""


async def _read_request(reader: asyncio.StreamReader
                        ) -> tuple[h11.Connection | None, h11.Request | None]:
    """The connection's h11 state and its request (None: malformed, a 400); (None, None) for
    a head above ``_MAX_HEAD`` or a client that closed before the end of it. Blocks until the
    head is in; cancelling stops the read."""
    conn = _connection()
    received, closed = b"", False
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint != HTTPStatus.BAD_REQUEST or closed:
                return None, None  # above the head limit (431), or cut short
            return _without_host(received) or (conn, None)
        if isinstance(event, h11.Request):
            return conn, event
        if event is not h11.NEED_DATA:
            return None, None  # closed before a request
        # at most one byte past the limit: a longer head is incomplete there, and h11 refuses it
        data = await reader.read(_MAX_HEAD + 1 - len(received))
        received, closed = received + data, not data
        conn.receive_data(data)  # b"": the client closed


def _connection() -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)


def _without_host(received: bytes) -> tuple[h11.Connection, h11.Request] | None:
    """``received`` as a request if its only fault is a missing ``Host`` (h11 requires it of
    HTTP/1.1; this server answers without, and ``request_host`` is then ""), else None."""
    line, newline, rest = received.partition(b"\n")
    if not newline:
        return None
    conn = _connection()
    conn.receive_data(line + newline + b"Host: \r\n" + rest)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return None
    return (conn, event) if isinstance(event, h11.Request) else None


def _response(conn: h11.Connection, status: HTTPStatus, headers: dict[str, str], body: bytes,
              head_only: bool) -> bytes:
    """The response's bytes; ``head_only`` (a ``HEAD``): the length of ``body``, not it."""
    fields = [("Content-Length", str(len(body))), ("Connection", "close"),
              ("X-Content-Type-Options", "nosniff"), *headers.items()]
    if "Content-Type" not in headers:
        fields.append(("Content-Type", "text/plain; charset=utf-8"))
    out = conn.send(h11.Response(status_code=status.value, headers=fields,
                                 reason=status.phrase.encode("ascii"))) or b""
    if body and not head_only:
        out += conn.send(h11.Data(data=body)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")
