"""What a master adds to its messages and checks with its private keys: each member's pair
keys (from a key only this master holds) and, with a master secret, the seals of memberships
that a restarted master checks before it believes a rejoining peer's id and ring."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

import msgspec

from .._wire import auth
from .._wire import messages as m

log = logging.getLogger("pccl_aio.security")


def kept_secret_name(run_key: bytes) -> str:
    """The name of the file a master keeps the master secret of a run in by default:
    ``master-<tag>.secret``, the tag a one-way function of the run secret's key (``run_key``),
    so each run secret has its own, and the name says nothing of the secret."""
    tag = hmac.new(run_key, b"pccl_aio kept master secret", hashlib.sha256).hexdigest()
    return f"master-{tag[:16]}.secret"


class MasterKeys:
    """Pair keys (``secured``: the run has a secret) and membership seals (``seal_key``:
    from the master secret, shared by the run's masters; empty: none). Pure computation."""

    def __init__(self, secured: bool, master_key: bytes) -> None:
        self._run_key = secrets.token_bytes(auth.KEY_SIZE) if secured else b""
        self._hasher = auth.pair_hasher(self._run_key)
        self._seal_key = auth.seal_key(master_key)
        # member -> its last ring and their pair keys, joined: a ring that grew at its end
        # (joiners) costs the new keys only (32 bytes per member and peer: ~32 MB at 1,024)
        self._pairs: dict[int, tuple[tuple[int, ...], bytes]] = {}

    @property
    def sealing(self) -> bool:
        """Memberships are sealed (a master secret was given)."""
        return bool(self._seal_key)

    def membership(self, msg: m.Membership, conn: int, session: bytes, group: int,
                   run_id: str) -> m.Membership:
        """``msg`` for member ``conn``: the key it shares with each peer of its ring, wrapped
        for its ``session`` (only the two peers of a pair can prove that pair's key), and the
        seal of its place."""
        changes: dict[str, object] = {}
        if self._run_key:
            ids = tuple(p.peer_id for p in msg.ring)
            joined = auth.wrap_joined(session, msg.epoch, ids, self._keys_of(conn, ids))
            changes["keys"] = list(auth.cutter(len(ids)).unpack(joined))
        if self._seal_key:
            changes["seal"] = auth.seal(self._seal_key, run_id, conn, group, msg.term,
                                        msg.epoch, [p.peer_id for p in msg.ring])
        return msgspec.structs.replace(msg, **changes) if changes else msg

    def _keys_of(self, conn: int, ids: tuple[int, ...]) -> bytes:
        """``conn``'s pair keys with the ring ``ids``, joined (``auth.pair_keys``)."""
        known, keys = self._pairs.get(conn, ((), b""))
        if ids[: len(known)] != known:
            known, keys = (), b""
        keys += auth.pair_keys(self._hasher, conn, ids[len(known):])
        self._pairs[conn] = (ids, keys)
        return keys

    def forget(self, conn: int) -> None:
        """``conn``'s session ended: drop what was kept of it."""
        self._pairs.pop(conn, None)

    def screen(self, hello: m.Hello, where: str) -> m.Hello:
        """A ``Hello`` as this master believes it: with sealing on, a ``Rejoin`` without a
        valid seal claims nothing (no id, ring or term: the peer joins as a new one, as a
        peer that was waiting to join does), and a claim of membership is logged."""
        r = hello.rejoin
        if not self._seal_key or r is None:
            return hello
        want = auth.seal(self._seal_key, hello.run_id, r.peer_id, hello.peer_group, r.term,
                         r.epoch, r.ring)
        if r.accepted and hmac.compare_digest(want, r.seal):
            return hello
        if r.accepted:
            log.warning("a peer at %s claimed to rejoin as peer %d of term %d without a valid "
                        "seal: it joins as a new peer", where, r.peer_id, r.term)
        bare = msgspec.structs.replace(r, peer_id=0, accepted=False, term=0, epoch=0, ring=[],
                                       seal=b"")
        return msgspec.structs.replace(hello, rejoin=bare)
