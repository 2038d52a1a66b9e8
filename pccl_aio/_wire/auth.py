"""The handshake every connection opens with, and the run's pair keys (sans-IO).

A mutual challenge-response over HMAC-SHA256 in which the connecting side proves first; the
key never crosses the wire::

    client -> server  OPEN       magic, version, role, client nonce, client id, server id
    server -> client  CHALLENGE  magic, status, server nonce
    client -> server  PROOF      HMAC(key, "client" | OPEN | server nonce)
    server -> client  VERDICT    magic, status, reason,
                                 HMAC(key, "server" | OPEN | server nonce) if accepted

The server proves the key only to a client that proved it first, so a listener is never a
guessing oracle: an outsider sees a nonce and a refusal, nothing it could test guesses of the
secret against. (A client that dials an impostor does hand it a proof to guess against; the
secret's strength, ``check_secret``, and its stretching, ``secret_key``, are what protect it
then.) A refusal's ``reason`` says which side lacks the key (``MISSING``, ``UNEXPECTED``) or
that the keys differ (``DIFFER``), so both sides can say what to fix.

Each side proves it knows the key over the other side's fresh nonce, so a recorded handshake
replayed in either direction fails. The MACs cover the role and both peer ids, so a proof made
for one connection is worth nothing on another. The key is the run secret's key for the master
connection and the pair key the master issued for two peers (``pair_keys``) for connections
between peers; in a run without a secret it is empty (the handshake then proves nothing, but
keeps one code path). Both sides derive a session key from the transcript (``session_key``);
the master wraps pair keys with it before sending them (``wrap``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import secrets
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

MAGIC: Final = 0x50434831  # "PCH1"
VERSION: Final = 2  # 1: the server proved first (an oracle for guessing the secret)
NONCE_SIZE: Final = 32
KEY_SIZE: Final = 32

ROLE_MASTER, ROLE_DATA, ROLE_STATE, ROLE_MEASURE, ROLE_P2P = 1, 2, 3, 4, 5
ROLES: Final = {ROLE_MASTER: "master", ROLE_DATA: "data", ROLE_STATE: "state transfer",
                ROLE_MEASURE: "link measurement", ROLE_P2P: "point-to-point"}

OK, REFUSED, UNKNOWN_PEER, BAD_VERSION = 0, 1, 2, 3
STATUS: Final = {OK: "accepted", REFUSED: "refused: wrong run secret",
                 UNKNOWN_PEER: "refused: not a member of this run (or not yet)",
                 BAD_VERSION: "refused: another handshake version"}

#: Why a handshake's keys do not match (a ``VERDICT``'s reason): the client has no key, the
#: server has none, both have one and they differ (or a replay), or the server accepted the
#: client and could not prove the key itself (an impostor).
MISSING, UNEXPECTED, DIFFER, WRONG = "missing", "unexpected", "differ", "wrong"
_REASONS: Final = ("", MISSING, UNEXPECTED, DIFFER)

OPEN: Final = struct.Struct("<IHBx32sQQ")  # magic, version, role, nonce, client id, server id
CHALLENGE: Final = struct.Struct("<IB3x32s")  # magic, status, nonce
PROOF: Final = struct.Struct("<32s")  # client MAC
VERDICT: Final = struct.Struct("<IBB2x32s")  # magic, status, reason, server MAC

#: The least a run secret may hold (``check_secret``), and the stretching every secret gets:
#: scrypt with 16 MiB of memory (the standard library's, so nothing to install).
MIN_SECRET_BITS: Final = 128
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
MAKE_SECRET: Final = "python -m pccl_aio.secret"


class Opening(NamedTuple):
    """A parsed ``OPEN`` and its raw bytes (which both MACs cover)."""

    raw: bytes
    version: int
    role: int
    client_id: int
    server_id: int


def _class(c: int) -> tuple[str, int]:
    """A byte's character class and its size."""
    if 97 <= c <= 122:
        return "lower", 26
    if 65 <= c <= 90:
        return "upper", 26
    if 48 <= c <= 57:
        return "digit", 10
    return ("other ASCII", 33) if c < 128 else ("other", 128)


def secret_bits(secret: str | bytes) -> float:
    """A generous estimate of a secret's entropy: the bits of a character drawn from the
    classes it uses (lower case, upper case, digits, other ASCII, other bytes) times its
    length, a character that repeats the one before it counting for nothing. It cannot tell
    a quotation from a random string; it does catch the short and the simple."""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    pool = sum(dict(_class(c) for c in raw).values())
    length = sum(1 for i, c in enumerate(raw) if i == 0 or c != raw[i - 1])
    return length * math.log2(pool) if pool else 0.0


def check_secret(secret: str | bytes) -> None:
    """Raise ``ValueError`` (saying how to make a good one) for a secret estimated below
    ``MIN_SECRET_BITS`` (``secret_bits``)."""
    bits = secret_bits(secret)
    if bits < MIN_SECRET_BITS:
        raise ValueError(
            f"the run secret is too weak (about {bits:.0f} bits; at least {MIN_SECRET_BITS} "
            f"are needed, so it cannot be guessed): make one with `{MAKE_SECRET}` (or "
            f"`{MAKE_SECRET} --file run.secret`)")


@functools.lru_cache(maxsize=16)
def secret_key(secret: str | bytes | None) -> bytes:
    """The key of a run secret (empty without one): the secret stretched with scrypt
    (``SCRYPT_N``; ~16 MiB and tens of ms once per process and secret), so that each guess
    costs an attacker as much. Raises ``ValueError`` for a weak secret (``check_secret``)."""
    if not secret:
        return b""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    check_secret(raw)
    return hashlib.scrypt(raw, salt=b"pccl_aio run secret", n=SCRYPT_N, r=SCRYPT_R,
                          p=SCRYPT_P, maxmem=64 * 2**20, dklen=KEY_SIZE)


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


def challenge(opening: Opening) -> tuple[bytes, bytes]:
    """(the server's ``CHALLENGE``, its nonce): nothing about the key yet."""
    nonce = secrets.token_bytes(NONCE_SIZE)
    return CHALLENGE.pack(MAGIC, OK, nonce), nonce


def refusal(status: int) -> bytes:
    """A ``CHALLENGE`` carrying only a refusal ``status``."""
    return CHALLENGE.pack(MAGIC, status, bytes(NONCE_SIZE))


def parse_challenge(raw: bytes) -> tuple[int, bytes]:
    """(status, server nonce) of a ``CHALLENGE``; status -1 for a bad magic."""
    magic, status, nonce = CHALLENGE.unpack(raw)
    return (status if magic == MAGIC else -1), nonce


def proof(key: bytes, opening: bytes, nonce: bytes) -> bytes:
    """The client's ``PROOF`` that it holds ``key``."""
    return PROOF.pack(_mac(key, b"client", opening, nonce))


def verify(key: bytes, opening: Opening, nonce: bytes, raw_proof: bytes) -> bool:
    """The server's check of the client's ``PROOF``."""
    return hmac.compare_digest(raw_proof, _mac(key, b"client", opening.raw, nonce))


def server_mismatch(key: bytes, opening: Opening, nonce: bytes, raw_proof: bytes) -> str:
    """Why a ``PROOF`` failed ``verify``: ``MISSING`` (the empty key's proof: the client has
    no key), ``UNEXPECTED`` (this server has none) or ``DIFFER`` (another key, or a replay)."""
    if not key:
        return UNEXPECTED
    return MISSING if verify(b"", opening, nonce, raw_proof) else DIFFER


def verdict(key: bytes, opening: Opening, nonce: bytes, status: int, reason: str = "") -> bytes:
    """The server's ``VERDICT``: with its own proof of ``key`` if ``status`` is ``OK``."""
    mac = _mac(key, b"server", opening.raw, nonce) if status == OK else bytes(32)
    return VERDICT.pack(MAGIC, status, _REASONS.index(reason), mac)


def check_verdict(key: bytes, opening: bytes, nonce: bytes, raw: bytes) -> tuple[int, str]:
    """The client's reading of a ``VERDICT``: (status, mismatch). An ``OK`` whose MAC does
    not prove ``key`` is (``REFUSED``, ``WRONG``); a bad magic is status -1."""
    magic, status, reason, mac = VERDICT.unpack(raw)
    if magic != MAGIC:
        return -1, ""
    if status != OK:
        return status, _REASONS[reason] if reason < len(_REASONS) else ""
    if not hmac.compare_digest(mac, _mac(key, b"server", opening, nonce)):
        return REFUSED, WRONG
    return OK, ""


def session_key(key: bytes, opening: bytes, nonce: bytes) -> bytes:
    """A key both sides derive from the transcript, known to nobody without ``key``."""
    return _mac(key, b"session", opening, nonce)


def pair_hasher(run_key: bytes) -> hashlib.blake2b:
    """The pair keys' hash, keyed once with the master's private ``run_key`` (``pair_keys``
    copies it per pair)."""
    return hashlib.blake2b(key=run_key, digest_size=KEY_SIZE, person=b"pccl pair")


def pair_keys(hasher: hashlib.blake2b, a: int, ids: Sequence[int]) -> bytes:
    """The key peer ``a`` shares with each peer ``b`` of ``ids``, joined: keyed BLAKE2b of
    (min, max) of the two ids (``hasher``: ``pair_hasher(run_key)``, copied per pair). Only
    the master derives them, one per member and ring peer at every epoch."""
    out = []
    for b in ids:
        h = hasher.copy()
        h.update(_PAIR.pack(a, b) if a < b else _PAIR.pack(b, a))
        out.append(h.digest())
    return b"".join(out)


@functools.lru_cache(maxsize=16)
def cutter(n: int) -> struct.Struct:
    """Cuts ``n`` joined keys apart (``list(cutter(n).unpack(joined))``)."""
    return struct.Struct(f"{KEY_SIZE}s" * n)


_PAIR = struct.Struct("<QQ")


def seal_key(master_key: bytes) -> bytes:
    """The key masters seal memberships with, from the master secret's key (empty: none)."""
    return hmac.new(master_key, b"pccl_aio membership seal", hashlib.sha256).digest() \
        if master_key else b""


def seal(key: bytes, run_id: str, peer_id: int, group: int, term: int, epoch: int,
         ring: Sequence[int]) -> bytes:
    """A master's proof that ``peer_id`` was a member of ``ring`` (group ``group``) at
    (``term``, ``epoch``) of run ``run_id``: only a holder of the master secret can make
    one, so a restarted master believes a rejoining peer's id and ring only with its seal."""
    data = struct.pack(f"<QQQQQ{len(ring)}Q", peer_id, group, term, epoch, len(ring), *ring)
    return hmac.new(key, b"seal" + data + run_id.encode(), hashlib.sha256).digest()


def wrap(session: bytes, epoch: int, ids: Sequence[int], keys: Sequence[bytes]) -> list[bytes]:
    """The pair keys ``keys`` of the ring peers ``ids`` (in ring order) encrypted for one
    session (``wrap_joined`` of them, cut); its own inverse. A ``keys`` shorter than ``ids``
    gives that many; a key not of ``KEY_SIZE`` bytes is a ``ValueError``."""
    n = min(len(ids), len(keys))
    if any(len(k) != KEY_SIZE for k in keys[:n]):
        raise ValueError(f"a wrapped key is not {KEY_SIZE} bytes")
    out = wrap_joined(session, epoch, ids, b"".join(keys[:n]))
    return [out[i : i + KEY_SIZE] for i in range(0, len(out), KEY_SIZE)]


def wrap_joined(session: bytes, epoch: int, ids: Sequence[int], keys: bytes) -> bytes:
    """``keys`` (the first ``len(keys) // KEY_SIZE`` ring peers' pair keys, joined) XOR one
    pad per key, cut from a SHAKE-256 stream of the session key, the epoch and the whole
    ring ``ids`` (a pad is never reused for another key): one call per member and epoch."""
    seed = struct.pack(f"<QQ{len(ids)}Q", epoch, len(ids), *ids)
    pad = hashlib.shake_256(b"pccl keys" + session + seed).digest(len(keys))
    return (int.from_bytes(keys) ^ int.from_bytes(pad)).to_bytes(len(keys))
