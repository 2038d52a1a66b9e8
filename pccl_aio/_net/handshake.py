"""The handshake of ``_wire/auth.py`` over asyncio streams: the client's side (``greet``) and
the listener's ``Gate`` (a deadline per handshake, a cap on handshakes in progress, counters).

After a successful handshake the connection carries its protocol (control frames, data
frames, state requests) exactly as without one. Stream connections (master, state server)
keep their streams; the zero-copy protocols of the data plane and the state fetcher start
on a ``Handoff`` and take its transport over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from .._wire import auth

log = logging.getLogger("pccl_aio.security")

HANDSHAKE_TIMEOUT: Final = 5.0
MAX_PENDING: Final = 64
LOG_BURST, LOG_WINDOW = 10, 10.0  # refusals logged one by one per window; then a count

#: The server's key for an ``OPEN``, or None to refuse it as not a member (may wait).
KeyFor = Callable[[auth.Opening], Awaitable[bytes | None]]


class HandshakeError(ConnectionError):
    """The other side refused this connection's handshake (``status``, ``auth.STATUS``), or
    could not complete it (status -1). ``mismatch``: why the keys do not match
    (``auth.MISSING``: this side has none; ``UNEXPECTED``: the other side has none;
    ``DIFFER``; ``WRONG``: the other side accepted and could not prove its own), else ""."""

    def __init__(self, message: str, status: int = -1, mismatch: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.mismatch = mismatch


class Reader(Protocol):
    async def readexactly(self, n: int) -> bytes: ...


class Writer(Protocol):
    @property
    def transport(self) -> asyncio.BaseTransport: ...

    def write(self, data: bytes) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class Handoff(asyncio.Protocol):
    """A connection during its handshake (both ``Reader`` and ``Writer``); then
    ``hand_over`` gives its transport to the connection's real protocol, bytes already
    received included. ``on_made`` (a server's) is called when the connection is made."""

    def __init__(self, on_made: Callable[[Handoff], object] | None = None) -> None:
        self._on_made = on_made
        self._buf = bytearray()
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None
        return self._transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes; ``IncompleteReadError`` at EOF. Cancelling stops waiting."""
        while len(self._buf) < n:
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(self._buf), n)
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def hand_over(self, protocol: asyncio.BaseProtocol) -> None:
        """Make ``protocol`` the connection's protocol, and feed it what is buffered."""
        transport, rest = self.transport, bytes(self._buf)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if rest and isinstance(protocol, asyncio.BufferedProtocol):
            view = memoryview(rest)
            while view:
                buf = memoryview(protocol.get_buffer(len(view)))
                n = min(len(buf), len(view))
                buf[:n] = view[:n]
                protocol.buffer_updated(n)
                view = view[n:]
        elif rest and isinstance(protocol, asyncio.Protocol):
            protocol.data_received(rest)


async def greet(reader: Reader, writer: Writer, role: int,
                key: bytes, me: int, them: int) -> bytes:
    """The client's handshake on a fresh connection; returns the session key.

    Blocks for two round trips (bound it with a timeout). Raises ``HandshakeError`` if the
    server refuses this side's proof or does not prove the key, or closes the connection
    meanwhile (another protocol, TLS on one side only). Cancelling leaves the connection for
    the caller to close.
    """
    opening = auth.open_message(role, me, them)
    writer.write(opening)
    mismatch = ""
    try:
        status, nonce = auth.parse_challenge(await reader.readexactly(auth.CHALLENGE.size))
        if status == auth.OK:
            writer.write(auth.proof(key, opening, nonce))
            status, mismatch = auth.check_verdict(
                key, opening, nonce, await reader.readexactly(auth.VERDICT.size))
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise HandshakeError(
            "the other side closed the connection during the handshake (TLS on one side only, "
            "another version of pccl_aio, or it stopped at that moment)") from exc
    if status != auth.OK:
        why = auth.STATUS.get(status, "not a pccl_aio handshake")
        if mismatch:
            why = {auth.MISSING: "refused: the other side has a secret, and this side has none",
                   auth.UNEXPECTED: "refused: the other side has no secret, and this side has one",
                   auth.DIFFER: "refused: the secrets differ",
                   }.get(mismatch, "accepted, but the other side could not prove the secret "
                                   "(not the side this one meant to reach)")
        raise HandshakeError(f"handshake {why}", status, mismatch)
    return auth.session_key(key, opening, nonce)


async def connect(host: str, port: int, tls: ssl.SSLContext | None, role: int, key: bytes,
                  me: int, them: int, protocol: asyncio.BaseProtocol) -> None:
    """Open a connection to peer ``them`` (over TLS with ``tls``), complete the handshake for
    ``role`` and hand the transport to ``protocol``. Raises ``OSError`` (``HandshakeError``
    included) with nothing left open; cancelling closes the connection too. Bound it with a
    timeout."""
    transport, conn = await asyncio.get_running_loop().create_connection(
        Handoff, host, port, ssl=tls, server_hostname=host if tls else None)
    try:
        await greet(conn, conn, role, key, me, them)
    except BaseException:
        transport.abort()
        raise
    conn.hand_over(protocol)


class Gate:
    """Admission to one listener: every connection must complete the handshake within
    ``timeout`` seconds before any other byte is parsed. At most ``max_pending`` handshakes
    run at once; a new connection beyond that drops the oldest (so connections that stall
    cannot lock out the run's members). Failures are counted in ``stats`` and logged once
    each with the address, at most ``LOG_BURST`` per ``LOG_WINDOW`` seconds (then one line
    counts the rest), so a flood cannot fill the disk or block on a full log pipe."""

    def __init__(self, name: str, timeout: float = HANDSHAKE_TIMEOUT,
                 max_pending: int = MAX_PENDING) -> None:
        self.name = name
        self.timeout = timeout
        self.max_pending = max_pending
        self.stats = {"accepted": 0, "refused": 0, "timed_out": 0, "evicted": 0}
        self._pending: dict[Writer, None] = {}  # in arrival order
        self.clock: Callable[[], float] = time.monotonic
        self._window, self._logged, self._quiet = -math.inf, 0, 0

    async def admit(self, reader: Reader, writer: Writer, key_for: KeyFor
                    ) -> tuple[auth.Opening, bytes] | None:
        """Run the server's side; returns (the client's ``OPEN``, the session key), or None
        after closing a connection that failed. Blocks at most ``timeout``; cancelling
        closes the connection."""
        if len(self._pending) >= self.max_pending:
            oldest = next(iter(self._pending))
            self._pending.pop(oldest)
            self.stats["evicted"] += 1
            _abort(oldest)
        self._pending[writer] = None
        try:
            async with asyncio.timeout(self.timeout):
                why, result = await self._run(reader, writer, key_for)
        except TimeoutError:
            why, result = "timed out", None
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            why, result = "closed during the handshake", None
        except BaseException:
            self._pending.pop(writer, None)
            _abort(writer)
            raise
        if writer not in self._pending:  # evicted: counted and closed already
            return None
        del self._pending[writer]
        if result is not None:
            self.stats["accepted"] += 1
            return result
        self.stats["timed_out" if why == "timed out" else "refused"] += 1
        self._log(_address(writer), why)
        _abort(writer)
        return None

    def _log(self, address: str, why: str) -> None:
        now = self.clock()
        if now - self._window >= LOG_WINDOW:
            if self._quiet:
                log.warning("%s: refused %d more connections in %.0f s", self.name,
                            self._quiet, now - self._window)
            self._window, self._logged, self._quiet = now, 0, 0
        if self._logged < LOG_BURST:
            self._logged += 1
            log.warning("%s: refused a connection from %s: %s", self.name, address, why)
        else:
            self._quiet += 1

    async def _run(self, reader: Reader, writer: Writer, key_for: KeyFor
                   ) -> tuple[str, tuple[auth.Opening, bytes] | None]:
        opening = auth.parse_open(await reader.readexactly(auth.OPEN.size))
        if opening is None:
            return "not a pccl_aio handshake (or TLS on one side only)", None
        if opening.version != auth.VERSION:
            writer.write(auth.refusal(auth.BAD_VERSION))
            return f"handshake version {opening.version}", None
        key = await key_for(opening)
        if key is None:
            writer.write(auth.refusal(auth.UNKNOWN_PEER))
            return (f"{auth.ROLES[opening.role]} connection from peer {opening.client_id}, "
                    f"which may not connect here"), None
        message, nonce = auth.challenge(opening)
        writer.write(message)
        proof = await reader.readexactly(auth.PROOF.size)
        if not auth.verify(key, opening, nonce, proof):
            why = auth.server_mismatch(key, opening, nonce, proof)
            writer.write(auth.verdict(key, opening, nonce, auth.REFUSED, why))
            return _mismatch(why, opening.role), None
        writer.write(auth.verdict(key, opening, nonce, auth.OK))
        return "", (opening, auth.session_key(key, opening.raw, nonce))


def _mismatch(why: str, role: int) -> str:
    """The log's words for a ``auth.server_mismatch``."""
    key, here = ("run secret", "this master") if role == auth.ROLE_MASTER else ("pair key",
                                                                               "this side")
    return {auth.MISSING: f"the peer has no {key} ({here} requires one)",
            auth.UNEXPECTED: f"the peer has a {key}, and {here} has none",
            }.get(why, f"the peer's {key} differs from {here}'s (or a replayed handshake)")


def _address(writer: Writer) -> str:
    with contextlib.suppress(Exception):
        host, port = writer.get_extra_info("peername")[:2]
        return f"{host}:{port}"
    return "?"


def _abort(writer: Writer) -> None:
    transport = writer.transport
    if isinstance(transport, asyncio.WriteTransport):
        transport.abort()
    else:
        transport.close()
