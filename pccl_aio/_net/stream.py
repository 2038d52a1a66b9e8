"""Small asyncio socket helpers shared by the master and the peers."""

from __future__ import annotations

import asyncio
import os
import socket

from .._errors import RemoteProtocolError
from .._wire import framing as _framing

_TCP_CLOSED_BY_PEER = (7, 8)  # Linux tcp_info states TCP_CLOSE (reset), TCP_CLOSE_WAIT (FIN)


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Disable Nagle's algorithm: small control frames must not wait for an ACK. Nothing
    for a transport closed meanwhile (uvloop's raises ``RuntimeError`` then)."""
    try:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, RuntimeError):
        if not transport.is_closing():
            raise


def own_socket(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A socket object of the caller's own on a dup of the transport's fd (close it when
    done), or None if the transport has no real socket. The loop's transport socket (uvloop's
    pseudo-socket) cannot peek and builds a new socket object on every ``setsockopt``."""
    try:
        return socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
    except (OSError, AttributeError, ValueError):
        return None


def at_eof(sock: socket.socket) -> bool:
    """The peer closed or reset ``sock``, even if unread bytes still precede the EOF (a
    peek alone would see those bytes and miss it). Never blocks."""
    try:
        if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] in _TCP_CLOSED_BY_PEER:
            return True
    except (OSError, AttributeError):
        pass  # no TCP_INFO here: the peek decides
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False  # alive: nothing to read
    except OSError:
        return True  # reset


class FrameBudget:
    """Bytes of large frames being received at once, over every connection of a server: a
    frame above ``small`` bytes reserves its length until it is complete, and a frame that
    would exceed ``total`` is a protocol error. Memory is taken as bytes arrive, but a
    length prefix alone must not let a client make the server hold more than ``total``."""

    def __init__(self, total: int, small: int = 64 << 10) -> None:
        self.total, self.small, self.reserved = total, small, 0


async def read_frame(reader: asyncio.StreamReader, max_size: int = _framing.MAX_FRAME_SIZE,
                     budget: FrameBudget | None = None) -> bytes:
    """Read one length-prefixed frame body.

    Blocks until a whole frame arrived. Raises ``asyncio.IncompleteReadError`` at EOF and
    ``RemoteProtocolError`` for an oversized frame or one over ``budget``. Cancelling leaves
    the stream mid-frame: close the connection afterwards.
    """
    n = _framing.body_length(await reader.readexactly(_framing.HEADER_SIZE), max_size)
    if budget is None or n <= budget.small:
        return await reader.readexactly(n)
    if budget.reserved + n > budget.total:
        raise RemoteProtocolError(
            f"a frame of {n} bytes while {budget.reserved} bytes of large frames are being "
            f"received (at most {budget.total})")
    budget.reserved += n
    try:
        return await reader.readexactly(n)
    finally:
        budget.reserved -= n


async def local_address(host: str, port: int) -> str:
    """The address of this host's interface that routes to ``host:port`` (a UDP socket's
    ``connect`` picks it and sends nothing); ``"0.0.0.0"`` when there is none (no route, an
    unresolvable name). Blocks on name resolution only (in the loop's executor)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return str(s.getsockname()[0])
    except (OSError, IndexError):
        return "0.0.0.0"
