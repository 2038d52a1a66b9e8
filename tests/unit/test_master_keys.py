"""Issue 31, point 4: membership seals (``_master/keys.py``). A restarted master with the
master secret believes a rejoin's id, term, epoch and ring only with the seal a master of the
run issued for exactly those; anything else joins as a new peer."""

from __future__ import annotations

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
