"""Opening a master session: dial, prove the run secret, pick a master, say ``Hello``.

With several master addresses the peer asks every one of them at once (``Probe``) and
registers with the master that serves the run at the highest term (``_wire/recovery.py``):
a peer never goes back to a master that stepped down or lost the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import ssl
from collections.abc import Callable

from ... import _log
from ..._errors import (
    AuthenticationError,
    MasterConnectionError,
    PcclTimeoutError,
    RemoteProtocolError,
    VersionMismatchError,
)
from ..._net.handshake import HandshakeError, greet
from ..._net.probe import probe
from ..._net.stream import read_frame, set_nodelay
from ..._wire import auth, liveness
from ..._wire import messages as m
from ..._wire.framing import frame
from ..core.config import PeerConfig

__all__ = ["Session", "heartbeat", "open_retrying", "open_session"]

log = logging.getLogger("pccl_aio.communicator")


@dataclasses.dataclass(slots=True)
class Session:
    """A registered master session: its streams, its session key and the master's answer."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    key: bytes
    welcome: m.Welcome
    where: str
    heard: float = 0.0  # loop time the master last spoke on it (its liveness)
    left: bool = False  # this peer said goodbye (``Leave``) on it


async def goodbye(session: Session | None, timeout: float = 1.0) -> None:
    """After a ``Leave`` and with the session's reader task stopped: read what the master
    still sends until it closes (it does once it read the goodbye), for at most ``timeout``.
    Closing with unread bytes would reset the connection, and a reset may reach the master
    before the goodbye does (it would count a departure as a dead connection)."""
    if session is None or not session.left or session.writer.is_closing():
        return
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            while await session.reader.read(1 << 16):
                pass


async def _dial(cfg: PeerConfig, host: str, port: int
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Connect and prove the run secret, bounded by ``heartbeat_timeout``. Raises OSError or
    TimeoutError (nobody answers: try again), ``AuthenticationError`` or
    ``VersionMismatchError`` (retrying will not help)."""
    where = f"{host}:{port}"
    try:
        async with asyncio.timeout(cfg.heartbeat_timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=cfg.ssl, server_hostname=host if cfg.ssl else None)
    except (OSError, TimeoutError) as exc:
        if cfg.ssl is not None and isinstance(exc, (ssl.SSLError, ConnectionResetError)):
            raise AuthenticationError(  # the TCP connect succeeded: TLS failed
                f"TLS with the master at {where} failed: {exc!r}") from exc
        raise
    set_nodelay(writer.transport)
    try:
        async with asyncio.timeout(cfg.heartbeat_timeout):
            key = await greet(reader, writer, auth.ROLE_MASTER, cfg.key, 0, 0)
    except TimeoutError:
        writer.close()
        raise PcclTimeoutError(
            f"the master at {where} accepted the connection but did not answer within "
            f"{cfg.heartbeat_timeout:.1f} s") from None
    except HandshakeError as exc:
        writer.close()
        with contextlib.suppress(Exception):  # closed before the error is raised
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        if exc.status == auth.BAD_VERSION:
            raise VersionMismatchError(f"the master refused this peer: {exc}") from None
        cls = HandshakeClosed if exc.status == -1 else AuthenticationError
        raise cls(_refused(where, exc)) from None
    except BaseException:
        writer.close()
        raise
    return reader, writer, key


class HandshakeClosed(AuthenticationError):
    """The master closed the connection during the handshake without a verdict: TLS on its
    side only, another protocol, or a master that died (or was evicting handshakes) at that
    moment; ``open_retrying`` tries again a few times before it believes the first."""


CLOSED_RETRIES = 2  # handshakes closed without a verdict that open_retrying tries past


_GIVE = ("give it the run's secret with Communicator(secret=...), $PCCL_AIO_SECRET_FILE or "
         "$PCCL_AIO_SECRET")


def _refused(where: str, exc: HandshakeError) -> str:
    """What a failed handshake with the master means, and what to fix."""
    if exc.mismatch == auth.MISSING:
        return (f"the master at {where} refused this peer: the master requires a run secret "
                f"and this peer has none; {_GIVE}")
    if exc.mismatch == auth.DIFFER:
        return (f"the master at {where} refused this peer: the run secrets differ (this "
                f"peer's is not the master's); {_GIVE}")
    if exc.mismatch == auth.UNEXPECTED:
        return (f"the master at {where} could not prove the run secret: it runs without one "
                f"and this peer has one (a master started without --secret-file, or not "
                f"this run's master)")
    if exc.mismatch == auth.WRONG:
        return (f"the master at {where} accepted this peer but could not prove the run "
                f"secret: it is not this run's master (check the address)")
    return f"the master at {where} refused this peer: {exc}"


async def _probe(cfg: PeerConfig, host: str, port: int
                 ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes, m.ProbeAnswer]:
    reader, writer, key = await _dial(cfg, host, port)
    answer = await probe(reader, writer, f"{host}:{port}", cfg.heartbeat_timeout)
    return reader, writer, key, answer


async def _choose(cfg: PeerConfig, run_id: str, term: int
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes, str]:
    """Probe every address at once; the best answer's streams (the others are closed): a
    master of this run with members at a term not below ``term`` first, then the highest
    term, then the first address. Raises the first failure if none answers."""
    tasks = [asyncio.ensure_future(_probe(cfg, h, p)) for h, p in cfg.masters]
    try:
        await asyncio.wait(tasks)
    finally:
        for t in tasks:
            t.cancel()
    best, rank = -1, (False, -1, 0)
    for i, t in enumerate(tasks):
        if t.cancelled() or t.exception() is not None:
            continue
        a = t.result()[3]
        if run_id and a.run_id and a.run_id != run_id:
            continue
        r = (a.members > 0 and a.term >= term and not a.superseded, a.term, -i)
        if r > rank:
            best, rank = i, r
    for i, t in enumerate(tasks):
        if i != best and not t.cancelled() and t.exception() is None:
            t.result()[1].close()
    if best < 0:
        errors = [t.exception() for t in tasks if not t.cancelled()]
        fatal = [e for e in errors if isinstance(e, (AuthenticationError, VersionMismatchError))]
        if fatal:
            raise fatal[0]
        first = next((e for e in errors if e is not None), None)
        if first is None:
            raise MasterConnectionError("no master serves this run at any address")
        raise first
    reader, writer, key, _ = tasks[best].result()
    host, port = cfg.masters[best]
    return reader, writer, key, f"{host}:{port}"


async def open_session(cfg: PeerConfig, hello: m.Hello, term: int) -> Session:
    """Open a session and register (``hello``); returns at the master's ``Welcome``.

    Raises OSError or TimeoutError when no master answers (retry later),
    ``MasterConnectionError`` for a master that refuses this peer for the moment (another
    run) or breaks the protocol, ``AuthenticationError`` / ``VersionMismatchError`` (do not
    retry), ``PcclTimeoutError`` for a master that accepts and never answers. Every step is
    bounded by ``heartbeat_timeout``; cancelling closes what was opened.
    """
    if len(cfg.masters) == 1:
        host, port = cfg.masters[0]
        reader, writer, key = await _dial(cfg, host, port)
        where = f"{host}:{port}"
    else:
        reader, writer, key, where = await _choose(cfg, hello.run_id, term)
    try:
        async with asyncio.timeout(cfg.heartbeat_timeout):
            writer.write(frame(m.encode(hello)))
            reply = m.decode_master_to_peer(await read_frame(reader))
            while isinstance(reply, m.MasterHeartbeat):  # a tick may precede the Welcome
                reply = m.decode_master_to_peer(await read_frame(reader))
    except TimeoutError:
        writer.close()
        raise PcclTimeoutError(
            f"the master at {where} accepted the connection but did not answer within "
            f"{cfg.heartbeat_timeout:.1f} s") from None
    except (asyncio.IncompleteReadError, OSError, RemoteProtocolError) as exc:
        writer.close()
        raise MasterConnectionError(f"master closed the connection: {exc!r}") from exc
    except BaseException:
        writer.close()
        raise
    if isinstance(reply, m.Welcome) and reply.term >= term:
        log.info("connected to the master at %s (term %d): %s", where, reply.term,
                 "accepted" if reply.accepted else "rejoining as a member" if reply.rebuild
                 else "waiting for admission", extra=_log.ids(
                     reply.run_id, reply.peer_id, cfg.peer_group, master=where, term=reply.term))
        return Session(reader, writer, key, reply, where)
    writer.close()
    if isinstance(reply, m.Rejected):
        cls = VersionMismatchError if reply.version != m.PROTOCOL_VERSION else MasterConnectionError
        raise cls(f"master refused this peer: {reply.reason}")
    if isinstance(reply, m.Superseded):
        raise MasterConnectionError(f"the master at {where} stepped down: {reply.reason}")
    if isinstance(reply, m.Welcome):
        raise MasterConnectionError(
            f"the master at {where} serves term {reply.term}, older than this peer's {term}")
    raise MasterConnectionError(f"unexpected first message {reply!r}")


async def open_retrying(cfg: PeerConfig, hello: m.Hello, term: int, attempts: int,
                        backoff: float) -> Session:
    """``open_session``, tried ``attempts`` times with exponential back-off while no master
    answers. Raises ``MasterConnectionError`` after the last, ``AuthenticationError`` and
    ``VersionMismatchError`` at once (a handshake closed without a verdict only after
    ``CLOSED_RETRIES`` more: a master killed mid-handshake reads so too),
    ``PcclTimeoutError`` (a master that accepts and never answers) on the last attempt.
    Cancelling stops the attempt in progress."""
    last: Exception | None = None
    closed = 0
    for i in range(attempts):
        try:
            return await open_session(cfg, hello, term)
        except (OSError, TimeoutError) as exc:
            if isinstance(exc, HandshakeClosed):
                if closed == CLOSED_RETRIES or i + 1 == attempts:  # believed: the public type
                    raise AuthenticationError(str(exc)) from None
                closed += 1
            elif isinstance(exc, (AuthenticationError, VersionMismatchError)) or (
                    isinstance(exc, PcclTimeoutError) and i + 1 == attempts):
                raise
            last = exc
            if i + 1 < attempts:
                await asyncio.sleep(min(backoff * 2**i, 2.0))  # back-off, not a sync
    where = ", ".join(f"{h}:{p}" for h, p in cfg.masters)
    raise MasterConnectionError(
        f"no master at {where} after {attempts} attempt(s): {last!r}") from last


async def heartbeat(session: Session, cfg: PeerConfig, live: Callable[[], bool]) -> bool:
    """A ``Heartbeat`` on ``session`` after one check period (a joiner counts as pending
    once the master heard from it after its ``Hello``), then every ``heartbeat_interval``
    while ``live()``. Returns True once the master was silent (``session.heard``) for more
    than ``heartbeat_timeout`` (checked every ``liveness.period``): the connection is
    aborted; False once not live. Cancelling stops it."""
    loop = asyncio.get_running_loop()
    writer, beat = session.writer, frame(m.encode(m.Heartbeat()))
    period = liveness.period(cfg.heartbeat_interval, cfg.heartbeat_timeout)
    beaten = -math.inf
    while live():
        await asyncio.sleep(period)  # the check's period
        if not live():
            return False
        now = loop.time()
        if now - session.heard > cfg.heartbeat_timeout:
            writer.transport.abort()
            return True
        if liveness.due(now, beaten, cfg.heartbeat_interval, period) and not writer.is_closing():
            writer.write(beat)
            beaten = now
    return False


def close_quietly(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.close()
