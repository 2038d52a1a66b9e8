"""The shared-state transfer wire format (sans-IO).

A request is ``REQ`` (magic, key length, revision, offset, length) followed by the key's
UTF-8 bytes; the answer is ``RESP`` (magic, status, length) followed by ``length`` raw bytes.
Requests may be pipelined on one connection.
"""

from __future__ import annotations

import struct
from typing import Final

MAGIC: Final = 0x50435331  # "PCS1"
REQ: Final = struct.Struct("<IIQQQ")  # magic, key length, revision, offset, length
RESP: Final = struct.Struct("<IIQ")  # magic, status, length
OK, NOT_SERVING, BAD_RANGE = 0, 1, 2
MAX_KEY: Final = 4096


def pack_request(key: str, revision: int, offset: int, length: int) -> bytes:
    kb = key.encode()
    return REQ.pack(MAGIC, len(kb), revision, offset, length) + kb


def parse_request(buf: bytes) -> tuple[int, int, int, int] | None:
    """(key length, revision, offset, length), or None for a bad magic or an oversized key."""
    magic, klen, revision, off, length = REQ.unpack(buf)
    if magic != MAGIC or klen > MAX_KEY:
        return None
    return klen, revision, off, length


def pack_response(status: int, length: int = 0) -> bytes:
    return RESP.pack(MAGIC, status, length)


def parse_response(buf: bytes | bytearray) -> tuple[int, int] | None:
    """(status, length), or None for a bad magic."""
    magic, status, length = RESP.unpack(buf)
    return None if magic != MAGIC else (status, length)
