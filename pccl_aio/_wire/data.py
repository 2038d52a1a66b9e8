"""The data-plane wire format (sans-IO): a connection's ``HELLO`` and each frame's ``HEADER``.

A connection opens with ``HELLO`` (magic, version, sender peer id, connection index). Then
frames: a fixed ``HEADER`` (magic, phase, tag, seq, byte offset, byte length, two float64
quantization parameters) followed by ``length`` payload bytes. ``seq`` is the master's global
collective number. The structs are packed and parsed only through the names below.
"""

from __future__ import annotations

import struct
from typing import Final

MAGIC: Final = 0x50434131  # "PCA1"
DATA_VERSION: Final = 1
HELLO: Final = struct.Struct("<IHHQH6x")  # magic, version, reserved, peer id, conn index
HEADER: Final = struct.Struct("<IBxxxQQQQdd")  # magic, phase, tag, seq, offset, length, p0, p1

pack_header: Final = HEADER.pack  # bound once: called per frame on the hot path
unpack_header: Final = HEADER.unpack_from


def pack_hello(peer_id: int, index: int) -> bytes:
    """The first bytes of data connection ``index`` from ``peer_id``."""
    return HELLO.pack(MAGIC, DATA_VERSION, 0, peer_id, index)


def parse_hello(buf: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(peer id, connection index) of a ``HELLO``, or None if it is not ours."""
    magic, version, _, peer, index = HELLO.unpack_from(buf)
    if magic != MAGIC or version != DATA_VERSION:
        return None
    return peer, index
