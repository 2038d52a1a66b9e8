"""The point-to-point wire format (sans-IO): the frames of a ``send`` connection.

A sender opens one connection to each peer it sends to (handshake role ``ROLE_P2P``) and
writes messages on it in the order they were sent: a fixed ``HEADER`` (magic, channel, tag,
payload length in bytes) followed by the payload. The receiver matches each message to a
receive posted for (sender, channel, tag), in order. The channel keeps the user's
``send``/``recv`` tags (``USER``) apart from the messages of an all-to-all (``ALL_TO_ALL``,
whose ``round`` counts the all-to-alls of its tag, so that a late message of a failed one is
never taken for the next one's). The struct is packed and parsed only through the names
below.
"""

from __future__ import annotations

import struct
from typing import Final

MAGIC: Final = 0x50434150  # "PCAP"
HEADER: Final = struct.Struct("<IBxxxQIQ")  # magic, channel, tag, round, length
USER, ALL_TO_ALL = 0, 1
CHANNELS: Final = (USER, ALL_TO_ALL)
#: The largest message a header may announce (1 TiB): a bound for forged lengths. A receiver
#: also never buffers more than its stash allows for messages nobody waits for yet.
MAX_MESSAGE: Final = 1 << 40
TAG_MIN, TAG_MAX = -(1 << 63), (1 << 63) - 1  # a user's tag (two's complement on the wire)
#: what a message is matched by besides its sender: (channel, tag, round)
Key = tuple[int, int, int]


def user_key(tag: int) -> Key:
    """The key of a user's ``send``/``recv`` with ``tag`` (TAG_MIN..TAG_MAX)."""
    return USER, tag & ((1 << 64) - 1), 0


def pack_header(key: Key, length: int) -> bytes:
    """The header of a message of ``length`` bytes with ``key``."""
    return HEADER.pack(MAGIC, *key, length)


def parse_header(buf: bytes | bytearray | memoryview) -> tuple[Key, int] | None:
    """(key, length) of a header, or None if it is not ours or announces too much."""
    magic, channel, tag, round_, length = HEADER.unpack_from(buf)
    if magic != MAGIC or channel not in CHANNELS or length > MAX_MESSAGE:
        return None
    return (channel, tag, round_), length
