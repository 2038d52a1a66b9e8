"""A tiny read-only HTTP/1.1 server on asyncio streams: the master's status page and the
``/metrics`` endpoints of the master and of peers.

It answers ``GET`` and ``HEAD`` of a fixed set of paths, one request per connection
(``Connection: close``), and nothing else; h11 parses the request and writes the response.
A request line and headers above 8 KiB (h11's ``max_incomplete_event_size``), a head not in
within ``head_timeout`` of the connection's arrival (one deadline: trickled bytes do not
extend it), or a client slower than ``timeout`` in all get the connection closed (or a
4xx/5xx). Connections are admitted fairly (``Limits``): one client address (an IPv6 /64)
holds at most ``per_address`` at once, a surplus one is closed at once; with ``max_clients``
held, a newcomer from a new address (or one holding two fewer than the busiest) takes the
busiest address's oldest slot, so stalled clients, however many addresses they come from
and however fast they reconnect, cannot keep a new address out. A route is a plain function
called on the event loop, so it must be quick (it reads in-memory state): serving never
blocks the loop for longer than a route takes. A route may read the request's ``Host``
(``request_host``); a path in ``missing`` is a 404 whose body says where to look instead.
``close`` stops listening and cancels the connections being served.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import logging
import re
import ssl as _ssl
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import NamedTuple

import h11

from .._errors import InvalidUsageError
from .tasks import TaskSet

__all__ = ["HttpServer", "Limits", "Response", "Route", "check_port", "client_key",
           "request_host"]

log = logging.getLogger("pccl_aio.http")

Response = tuple[str, bytes]  # content type, body
Route = Callable[[], Response]

_MAX_HEAD = 8192
_BACKLOG = 1024  # a burst of connects must not overflow the accept queue (a dropped SYN: 1 s)
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


class Limits(NamedTuple):
    """What one HTTP port gives its clients: connections at once in all (``max_clients``)
    and per client address (``per_address``), seconds from a connection's arrival to the
    end of its request head (``head_timeout``) and to the end of its answer (``timeout``)."""

    max_clients: int = 32
    per_address: int = 4
    head_timeout: float = 2.0
    timeout: float = 10.0

    def checked(self) -> Limits:
        """These limits, or InvalidUsageError naming the one that is not positive."""
        for name in ("max_clients", "per_address"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidUsageError(f"{name} must be a positive int, not {value!r}")
        for name in ("head_timeout", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value < float("inf"):
                raise InvalidUsageError(f"{name} must be a positive number of seconds, "
                                        f"not {value!r}")
        return self


def client_key(address: str) -> str:
    """Whom a connection from ``address`` counts against: the address itself, an IPv6
    address's /64 (one host's usual share), an IPv4-mapped one's IPv4 address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _Client:
    """One admitted connection: whom it counts against, its writer and its task."""

    def __init__(self, key: str, writer: asyncio.StreamWriter, order: int) -> None:
        self.key, self.writer, self.order = key, writer, order  # order: of arrival
        self.task: asyncio.Task[None] | None = None


class HttpServer:
    """Serve ``routes`` (path -> function returning (content type, body)) on host:port
    (port 0: the OS picks one; ``port`` then tells it), within ``limits``. ``stats`` counts
    the connections ``shed`` (surplus of their address, or every slot held by addresses
    holding no more than theirs), ``evicted`` (their slot given to a newcomer) and
    ``stalled`` (no request head within ``head_timeout``, or no answer within ``timeout``)."""

    def __init__(self, routes: Mapping[str, Route], host: str = "127.0.0.1", port: int = 0, *,
                 name: str = "pccl_aio http", limits: Limits | None = None,
                 ssl: _ssl.SSLContext | None = None,
                 missing: Mapping[str, str] | None = None) -> None:
        self.routes = dict(routes)
        self.missing = dict(missing or {})  # path -> the body of its 404 (a hint)
        self.host, self._port, self.name = host, port, name
        self.limits, self._ssl = (limits or Limits()).checked(), ssl
        self._held: dict[str, list[_Client]] = {}  # client key -> its connections, oldest first
        self._count = self._arrivals = 0
        self.stats = {"shed": 0, "evicted": 0, "stalled": 0}
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
        self._server = await asyncio.start_server(
            self._on_client, self.host, self._port, ssl=self._ssl, limit=_MAX_HEAD,
            backlog=_BACKLOG,
            ssl_handshake_timeout=self.limits.head_timeout if self._ssl else None)
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
        key = client_key(str((writer.get_extra_info("peername") or ("?",))[0]))
        mine = len(self._held.get(key, ()))
        if mine >= self.limits.per_address or (self._count >= self.limits.max_clients
                                               and not self._evict(mine)):
            self.stats["shed"] += 1
            writer.close()
            return
        self._arrivals += 1
        client = _Client(key, writer, self._arrivals)
        self._held.setdefault(key, []).append(client)
        self._count += 1
        client.task = self._tasks.spawn(self._serve(reader, writer, client),
                                        name=f"{self.name} request")

    def _evict(self, mine: int) -> bool:
        """Free a slot for a newcomer whose address holds ``mine``: close the oldest
        connection of the address holding the most (of those, the one whose oldest is
        oldest), if that address holds two more than ``mine``, or any while ``mine`` is 0;
        False if none does. (So a new address always gets a slot, and the addresses already
        held settle within one of each other instead of taking turns evicting.)"""
        busiest = max(self._held.values(), key=len, default=[])
        if not busiest or (mine and len(busiest) < mine + 2):
            return False
        victim = min((held[0] for held in self._held.values() if len(held) == len(busiest)),
                     key=lambda c: c.order)
        self._forget(victim)
        self.stats["evicted"] += 1
        victim.writer.close()
        if victim.task is not None:
            victim.task.cancel()
        return True

    def _forget(self, client: _Client) -> None:
        held = self._held.get(client.key, [])
        if client in held:
            held.remove(client)
            self._count -= 1
            if not held:
                del self._held[client.key]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     client: _Client) -> None:
        limits = self.limits
        try:
            async with asyncio.timeout(limits.timeout):
                async with asyncio.timeout(min(limits.head_timeout, limits.timeout)):
                    conn, request = await _read_request(reader)
                if conn is None:
                    return  # oversized or cut short: nothing to answer
                status, headers, body = self._answer(request)
                head_only = request is not None and request.method == b"HEAD"
                writer.write(_response(conn, status, headers, body, head_only))
                await writer.drain()
        except TimeoutError:
            self.stats["stalled"] += 1  # a client too slow: nothing to answer
        except (ConnectionError, h11.LocalProtocolError):
            pass  # a vanished client
        finally:
            writer.close()
            self._forget(client)

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
