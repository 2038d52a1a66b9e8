"""Sans-IO length-prefixed framing of control messages.

A frame is ``u32 big-endian body length`` followed by the msgpack body. Frames longer than
``max_size`` are a protocol error: the reader closes that connection.
"""

from __future__ import annotations

import struct
from typing import Final

from .._errors import RemoteProtocolError

MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
_LEN: Final = struct.Struct(">I")
HEADER_SIZE: Final = _LEN.size


def frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length."""
    return _LEN.pack(len(body)) + body


def body_length(header: bytes, max_size: int = MAX_FRAME_SIZE) -> int:
    """Length announced by a 4-byte header; RemoteProtocolError if over ``max_size``."""
    (n,) = _LEN.unpack(header)
    if n > max_size:
        raise RemoteProtocolError(f"frame of {n} bytes exceeds the maximum of {max_size}")
    return int(n)
