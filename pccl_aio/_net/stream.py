"""Small asyncio socket helpers shared by the master and the peers."""

from __future__ import annotations

import asyncio
import os
import socket

from .._wire import framing as _framing


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Disable Nagle's algorithm: small control frames must not wait for an ACK."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def own_socket(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A socket object of the caller's own on a dup of the transport's fd (close it when
    done), or None if the transport has no real socket. The loop's transport socket (uvloop's
    pseudo-socket) cannot peek and builds a new socket object on every ``setsockopt``."""
    try:
        return socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
    except (OSError, AttributeError, ValueError):
        return None


async def read_frame(reader: asyncio.StreamReader, max_size: int = _framing.MAX_FRAME_SIZE) -> bytes:
    """Read one length-prefixed frame body.

    Blocks until a whole frame arrived. Raises ``asyncio.IncompleteReadError`` at EOF and
    ``RemoteProtocolError`` for an oversized frame. Cancelling leaves the stream mid-frame:
    close the connection afterwards.
    """
    header = await reader.readexactly(_framing.HEADER_SIZE)
    return await reader.readexactly(_framing.body_length(header, max_size))
