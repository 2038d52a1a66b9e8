"""The handshake every connection opens with, and the run's pair keys (sans-IO).

A mutual challenge-response over HMAC-SHA256; the key never crosses the wire::

    client -> server  OPEN       magic, version, role, client nonce, client id, server id
    server -> client  CHALLENGE  magic, status, server nonce,
                                 HMAC(key, "server" | OPEN | server nonce)
    client -> server  PROOF      HMAC(key, "client" | OPEN | server nonce)
    server -> client  VERDICT    magic, status

A client that cannot verify the server's MAC never sends a proof of its key: its ``PROOF`` is
then a *doubt* (``doubt``): the empty key's proof if it has no key, else zeros; neither
reveals anything, and the server learns which side lacks the key (``server_mismatch``).

Each side proves it knows the key over the other side's fresh nonce, so a recorded handshake
replayed in either direction fails. The MACs cover the role and both peer ids, so a proof made
for one connection is worth nothing on another. The key is the run secret for the master
connection and the pair key the master issued for two peers (``pair_key``) for connections
between peers; in a run without a secret it is empty (the handshake then proves nothing, but
keeps one code path). Both sides derive a session key from the transcript (``session_key``);
the master wraps pair keys with it before sending them (``wrap``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from typing import Final, NamedTuple

MAGIC: Final = 0x50434831  # "PCH1"
VERSION: Final = 1
NONCE_SIZE: Final = 32
KEY_SIZE: Final = 32

ROLE_MASTER, ROLE_DATA, ROLE_STATE, ROLE_MEASURE = 1, 2, 3, 4
ROLES: Final = {ROLE_MASTER: "master", ROLE_DATA: "data", ROLE_STATE: "state transfer",
                ROLE_MEASURE: "link measurement"}

OK, REFUSED, UNKNOWN_PEER, BAD_VERSION = 0, 1, 2, 3
STATUS: Final = {OK: "accepted", REFUSED: "refused: wrong run secret",
                 UNKNOWN_PEER: "refused: not a member of this run (or not yet)",
                 BAD_VERSION: "refused: another handshake version"}

#: Why a handshake's keys do not match (``client_mismatch``, ``server_mismatch``): the client
#: has no key, the server has none, both have one and they differ, or none of these (a proof
#: that fails: a replay or a forgery).
MISSING, UNEXPECTED, DIFFER, WRONG = "missing", "unexpected", "differ", "wrong"

OPEN: Final = struct.Struct("<IHBx32sQQ")  # magic, version, role, nonce, client id, server id
CHALLENGE: Final = struct.Struct("<IB3x32s32s")  # magic, status, nonce, server MAC
PROOF: Final = struct.Struct("<32s")  # client MAC
VERDICT: Final = struct.Struct("<IB3x")  # magic, status


class Opening(NamedTuple):
    """A parsed ``OPEN`` and its raw bytes (which both MACs cover)."""

    raw: bytes
    version: int
    role: int
    client_id: int
    server_id: int


def secret_key(secret: str | bytes | None) -> bytes:
    """The key of a run secret (empty without one): SHA-256 of its bytes."""
    if not secret:
        return b""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    return hashlib.sha256(b"pccl_aio run secret\0" + raw).digest()


def _mac(key: bytes, label: bytes, opening: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, label + opening + nonce, hashlib.sha256).digest()


def open_message(role: int, client_id: int, server_id: int) -> bytes:
    """The client's ``OPEN`` with a fresh nonce."""
    return OPEN.pack(MAGIC, VERSION, role, secrets.token_bytes(NONCE_SIZE), client_id, server_id)


def parse_open(raw: bytes) -> Opening | None:
    """The fields of an ``OPEN``, or None if it is not ours (then close without answering)."""
    magic, version, role, _nonce, client, server = OPEN.unpack(raw)
    if magic != MAGIC or role not in ROLES:
        return None
    return Opening(bytes(raw), version, role, client, server)


def challenge(key: bytes, opening: Opening) -> tuple[bytes, bytes]:
    """(the server's ``CHALLENGE``, its nonce): proves the server holds ``key``."""
    nonce = secrets.token_bytes(NONCE_SIZE)
    return CHALLENGE.pack(MAGIC, OK, nonce, _mac(key, b"server", opening.raw, nonce)), nonce


def refusal(status: int) -> bytes:
    """A ``CHALLENGE`` carrying only a refusal ``status``."""
    return CHALLENGE.pack(MAGIC, status, bytes(NONCE_SIZE), bytes(32))


def answer(key: bytes, opening: bytes, raw_challenge: bytes) -> tuple[int, bytes | None, bytes]:
    """The client's check of a ``CHALLENGE``: (status, ``PROOF`` or None, server nonce).

    ``PROOF`` is None when the server refused (``status``) or failed to prove the key (status
    ``REFUSED``); the client then closes. A bad magic is status -1.
    """
    magic, status, nonce, mac = CHALLENGE.unpack(raw_challenge)
    if magic != MAGIC:
        return -1, None, nonce
    if status != OK:
        return status, None, nonce
    if not hmac.compare_digest(mac, _mac(key, b"server", opening, nonce)):
        return REFUSED, None, nonce
    return OK, PROOF.pack(_mac(key, b"client", opening, nonce)), nonce


def client_mismatch(key: bytes, opening: bytes, raw_challenge: bytes) -> str:
    """Why the server's MAC failed the client's check: ``MISSING`` (the client has no key),
    ``UNEXPECTED`` (the server proved the empty key: it has none) or ``DIFFER``."""
    if not key:
        return MISSING
    _, _, nonce, mac = CHALLENGE.unpack(raw_challenge)
    return UNEXPECTED if hmac.compare_digest(mac, _mac(b"", b"server", opening, nonce)) else DIFFER


def doubt(key: bytes, opening: bytes, nonce: bytes) -> bytes:
    """The client's ``PROOF`` when the server failed to prove the key: the empty key's proof
    without a key, else zeros (never a proof of a real key to an unproven server)."""
    return PROOF.pack(bytes(32) if key else _mac(b"", b"client", opening, nonce))


def server_mismatch(key: bytes, opening: Opening, nonce: bytes, proof: bytes) -> str:
    """Why a ``PROOF`` failed ``verify``: ``MISSING`` (the empty key's proof), ``DIFFER``
    or ``UNEXPECTED`` (a doubt: the client has another key, or one where the server has
    none), else ``WRONG``."""
    if proof == bytes(32):
        return DIFFER if key else UNEXPECTED
    return MISSING if key and verify(b"", opening, nonce, proof) else WRONG


def verify(key: bytes, opening: Opening, nonce: bytes, proof: bytes) -> bool:
    """The server's check of the client's ``PROOF``."""
    return hmac.compare_digest(proof, _mac(key, b"client", opening.raw, nonce))


def verdict(status: int) -> bytes:
    return VERDICT.pack(MAGIC, status)


def parse_verdict(raw: bytes) -> int:
    """The status of a ``VERDICT`` (-1 for a bad magic)."""
    magic, status = VERDICT.unpack(raw)
    return status if magic == MAGIC else -1


def session_key(key: bytes, opening: bytes, nonce: bytes) -> bytes:
    """A key both sides derive from the transcript, known to nobody without ``key``."""
    return _mac(key, b"session", opening, nonce)


def pair_key(run_key: bytes, a: int, b: int) -> bytes:
    """The key peers ``a`` and ``b`` share, from the master's private ``run_key``."""
    lo, hi = min(a, b), max(a, b)
    return hmac.new(run_key, struct.pack("<QQ", lo, hi), hashlib.sha256).digest()


def wrap(session: bytes, epoch: int, peer_id: int, key: bytes) -> bytes:
    """``key`` encrypted for one session (XOR with a pad unique to the epoch and peer);
    ``wrap`` is its own inverse."""
    pad = hmac.new(session, struct.pack("<QQ", epoch, peer_id), hashlib.sha256).digest()
    return bytes(x ^ y for x, y in zip(key, pad, strict=True))
