"""Issue 31, point 4: membership seals (``_master/keys.py``). A restarted master with the
master secret believes a rejoin's id, term, epoch and ring only with the seal a master of the
run issued for exactly those; anything else joins as a new peer."""

from __future__ import annotations

import hashlib
import struct

import msgspec
import pytest

from pccl_aio._master.keys import MasterKeys
from pccl_aio._wire import auth
from pccl_aio._wire import messages as m
from tests.helpers import OTHER_SECRET, SECRET

KEY = auth.secret_key(SECRET)


def _membership(epoch: int = 7, term: int = 3) -> m.Membership:
    ring = [m.PeerAddr(p, "127.0.0.1", 1000 + p) for p in (4, 5, 6)]
    return m.Membership(epoch, 3, 1, 3, ring, term=term)


def _hello(seal: bytes, peer_id: int = 5, **change: object) -> m.Hello:
    rejoin = m.Rejoin(peer_id, True, 3, 7, [4, 5, 6], 0, -1, seal=seal)
    return m.Hello(m.PROTOCOL_VERSION, 0, 1, run_id="run", term=3,
                   rejoin=msgspec.structs.replace(rejoin, **change))


def test_a_sealed_rejoin_is_believed_by_another_master_with_the_same_secret():
    issued = MasterKeys(True, KEY).membership(_membership(), 5, b"s" * 32, 0, "run")
    assert len(issued.seal) == 32 and len(issued.keys) == 3
    hello = _hello(issued.seal)
    assert MasterKeys(True, KEY).screen(hello, "here") == hello  # a restarted master


@pytest.mark.parametrize("change", [
    {"peer_id": 4}, {"term": 9}, {"epoch": 8}, {"ring": [5]}, {"ring": [4, 5, 6, 7]}])
def test_a_seal_shown_for_another_claim_claims_nothing(change):
    seal = MasterKeys(True, KEY).membership(_membership(), 5, b"s" * 32, 0, "run").seal
    got = MasterKeys(True, KEY).screen(_hello(seal, **change), "here").rejoin
    assert got is not None
    assert (got.peer_id, got.accepted, got.term, got.epoch, got.ring) == (0, False, 0, 0, [])


def test_no_seal_another_masters_seal_or_a_waiting_peers_claim_claims_nothing():
    other = MasterKeys(True, auth.secret_key(OTHER_SECRET)).membership(
        _membership(), 5, b"s" * 32, 0, "run").seal
    keys = MasterKeys(True, KEY)
    for hello in (_hello(b""), _hello(other), _hello(b"", accepted=False, ring=[])):
        got = keys.screen(hello, "here").rejoin
        assert got is not None and (got.peer_id, got.accepted) == (0, False)


def test_without_a_master_secret_nothing_is_sealed_or_screened():
    keys = MasterKeys(False, b"")
    msg = _membership()
    assert keys.membership(msg, 5, b"", 0, "run") is msg and not keys.sealing
    hello = _hello(b"")
    assert keys.screen(hello, "here") is hello


def test_the_pair_keys_a_member_gets_are_each_pairs_key_and_its_peer_gets_the_same():
    """``pair_keys`` (one keyed state, copied per pair) gives each pair's keyed BLAKE2b of
    its two ids, lower first; ``cutter`` cuts them apart; a ring grown at its end keeps the
    keys it had; the two peers of a pair unwrap one key."""
    run_key = b"k" * 32
    ids = [3, 9, 1, 12, 7]
    joined = auth.pair_keys(auth.pair_hasher(run_key), 9, ids)
    assert list(auth.cutter(len(ids)).unpack(joined)) == [
        hashlib.blake2b(struct.pack("<QQ", min(9, i), max(9, i)), key=run_key,
                        digest_size=32, person=b"pccl pair").digest() for i in ids]
    assert auth.cutter(0).unpack(b"") == ()
    keys = MasterKeys(True, b"")
    ring = [m.PeerAddr(p, "127.0.0.1", 1000 + p) for p in (4, 5, 6)]
    grown = [*ring, m.PeerAddr(8, "127.0.0.1", 1008)]
    sessions = {p: bytes([p]) * 32 for p in (4, 5, 6, 8)}

    def unwrapped(conn: int, r: list[m.PeerAddr], epoch: int) -> list[bytes]:
        got = keys.membership(m.Membership(epoch, len(r), 1, len(r), r), conn, sessions[conn],
                              0, "run")
        return auth.wrap(sessions[conn], epoch, [p.peer_id for p in r], got.keys)

    before = unwrapped(5, ring, 1)
    after = unwrapped(5, grown, 2)
    assert after[:3] == before and len(set(after)) == 4
    assert unwrapped(8, grown, 2)[1] == after[3]  # 8's key with 5 is 5's key with 8
