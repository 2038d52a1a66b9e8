"""The point-to-point wire format (sans-IO): the frames of a ``send`` connection.

A sender opens one connection to each peer it sends to (handshake role ``ROLE_P2P``) and
writes messages on it in the order they were sent: a fixed ``HEADER`` (magic, tag, payload
length in bytes) followed by the payload. The receiver matches each message to a receive
posted for (sender, tag), in order. The struct is packed and parsed only through the names
below.
"""

from __future__ import annotations

import struct
from typing import Final

MAGIC: Final = 0x50434150  # "PCAP"
HEADER: Final = struct.Struct("<IxxxxqQ")  # magic, tag, length
#: The largest message a header may announce (1 TiB): a bound for forged lengths. A receiver
#: also never buffers more than its stash allows for messages nobody waits for yet.
MAX_MESSAGE: Final = 1 << 40
TAG_MIN, TAG_MAX = -(1 << 63), (1 << 63) - 1


def pack_header(tag: int, length: int) -> bytes:
    """The header of a message of ``length`` bytes with ``tag``."""
    return HEADER.pack(MAGIC, tag, length)


def parse_header(buf: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(tag, length) of a header, or None if it is not ours or announces too much."""
    magic, tag, length = HEADER.unpack_from(buf)
    if magic != MAGIC or length > MAX_MESSAGE:
        return None
    return tag, length
