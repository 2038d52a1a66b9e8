"""Asking a master which run and term it serves (``Probe``, answered by ``ProbeAnswer``;
``_wire/recovery.py``): a peer choosing among several masters (``_peer/session/dial.py``)
and a master watching the run's others (``_master/watch.py``) ask the same way."""

from __future__ import annotations

import asyncio

from .._errors import MasterConnectionError
from .._wire import messages as m
from .._wire.framing import frame
from .stream import read_frame

__all__ = ["probe"]


async def probe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str,
                timeout: float) -> m.ProbeAnswer:
    """Send ``Probe`` on a master session that passed the handshake and return the master's
    ``ProbeAnswer``; blocks for at most ``timeout`` seconds. The connection stays open (the
    caller closes it or registers on it). On failure (TimeoutError, OSError,
    IncompleteReadError, RemoteProtocolError for a malformed answer, MasterConnectionError
    for another message) and on cancellation the writer is closed and the error raised."""
    try:
        async with asyncio.timeout(timeout):
            writer.write(frame(m.encode(m.Probe())))
            answer = m.decode_master_to_peer(await read_frame(reader))
        if not isinstance(answer, m.ProbeAnswer):
            raise MasterConnectionError(f"the master at {where} answered {answer!r}")
    except BaseException:
        writer.close()
        raise
    return answer
