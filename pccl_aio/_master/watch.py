"""A master watching the run's other masters (``Master(others=)``): every
``heartbeat_timeout`` it asks each one which run and term it serves (``Probe``), so that a
master that was cut off or frozen while the run moved on learns of the higher term and steps
down (``core/failover.py``), and its peers move to where the run is. ``first_frame``: the
other side, each ``Probe`` a connection sends before its first message answered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as _ssl
from collections.abc import Callable

from .._errors import ProtocolError, RemoteProtocolError
from .._net.handshake import HandshakeError, greet
from .._net.probe import probe
from .._net.stream import FrameBudget, read_frame
from .._wire import auth
from .._wire import messages as m
from .._wire.framing import frame

__all__ = ["first_frame", "watch"]

log = logging.getLogger("pccl_aio.master")


async def _answer(host: str, port: int, key: bytes, ssl: _ssl.SSLContext | None,
                  timeout: float) -> m.ProbeAnswer | None:
    """The master at host:port's ``ProbeAnswer``, or None if it does not answer within
    ``timeout`` (or is not a pccl_aio master of this secret)."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=ssl, server_hostname=host if ssl else None)
            await greet(reader, writer, auth.ROLE_MASTER, key, 0, 0)
            return await probe(reader, writer, f"{host}:{port}", timeout)
    except (OSError, TimeoutError, HandshakeError, asyncio.IncompleteReadError, ValueError,
            ProtocolError):
        return None
    finally:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()


async def watch(others: list[tuple[str, int]], key: bytes, ssl: _ssl.SSLContext | None,
                period: float, heard: Callable[[m.ProbeAnswer, str], None]) -> None:
    """Probe ``others`` every ``period`` seconds, for ever; ``heard(answer, where)`` for each
    answer. Cancelling stops it."""
    while True:
        answers = await asyncio.gather(*(_answer(h, p, key, ssl, period) for h, p in others))
        for (h, p), answer in zip(others, answers):
            if answer is not None:
                heard(answer, f"{h}:{p}")
        await asyncio.sleep(period)  # the watch's period, not a synchronisation


async def first_frame(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      answer: Callable[[], m.ProbeAnswer], limit: int, timeout: float,
                      budget: FrameBudget) -> tuple[bytes, m.PeerToMaster | str] | None:
    """A connection's first message other than ``Probe`` (each ``Probe`` is answered with
    ``answer()``): it names the connection's peer id (a rejoining peer keeps its own). None,
    and the connection closed, if it sends nothing within ``timeout`` or closes; (body, why)
    for a malformed one (the caller answers it). Frames of at most ``limit`` bytes."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                body = await read_frame(reader, limit, budget)
                try:
                    msg = m.decode_peer_to_master(body)
                except RemoteProtocolError as exc:
                    return body, str(exc)
                if not isinstance(msg, m.Probe):
                    return body, msg
                writer.write(frame(m.encode(answer())))
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError,
            RemoteProtocolError) as exc:
        log.debug("closing a connection before its first message: %r", exc)
        writer.close()
        return None
