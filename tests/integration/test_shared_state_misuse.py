"""Shared-state misuse: a sync while a collective or another sync runs on the same peer
(scenario 26), and bad arguments. Shared helpers: ``state_harness``.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

import pccl_aio as pccl
from tests.integration.state_harness import Tally, first_of, sync, sync_settled, tx_rx, u8

# ---- misuse -----------------------------------------------------------------------------------


async def test_sync_with_a_collective_in_flight_is_refused_and_the_collective_completes(peers):
    """Scenario 26."""
    a, b = await peers(2)
    xa, xb = np.full(1 << 16, 1, np.float32), np.full(1 << 16, 2, np.float32)
    ha, hb = a.all_reduce_async(xa, tag=5), b.all_reduce_async(xb, tag=5)
    sa, sb = pccl.SharedState({"k": u8(1)}), pccl.SharedState({"k": u8(2)})
    with pytest.raises(pccl.InvalidUsageError):
        await a.sync_shared_state(sa)
    infos = await asyncio.gather(ha, hb)
    assert (xa == 3).all() and (xb == 3).all() and infos[0].world_size == 2
    assert tx_rx(await sync([a, b], [sa, sb])) == [(1024, 0), (0, 1024)]


async def test_second_concurrent_sync_on_one_peer_is_refused_and_the_first_completes(
        peers, monkeypatch):
    """A second sync_shared_state while one runs on the same peer raises InvalidUsageError and
    must not disturb the running one, also when it comes while the first is still hashing
    (states above 32 MiB are hashed in a worker thread, so the loop runs meanwhile; the hashing
    is held here by a gate to make that window deterministic)."""
    import pccl_aio._peer.state.sync as sync_mod

    a, b = await peers(2)
    xa, xb = u8(42, 4096), u8(0, 4096)
    sa, sb = pccl.SharedState({"k": xa}), pccl.SharedState({"k": xb})
    gate, hashing = asyncio.Event(), Tally()
    real_hashes = sync_mod._hashes

    async def slow_hashes(state):
        hashing.add(state)
        await gate.wait()
        return await real_hashes(state)

    monkeypatch.setattr(sync_mod, "_hashes", slow_hashes)
    first = asyncio.ensure_future(a.sync_shared_state(sa))
    await first_of(hashing.reached(1), first)
    assert hashing.items == [sa], first  # the first sync is hashing, held by the gate
    second = asyncio.ensure_future(a.sync_shared_state(sa))
    other = asyncio.ensure_future(b.sync_shared_state(sb))
    # The second call either ends at once (refused before hashing) or hashes too, like b's.
    await first_of(hashing.reached(3), second)
    if second.done():  # refused before hashing: nothing can go wrong any more
        assert isinstance(second.exception(), pccl.InvalidUsageError)
    await first_of(hashing.reached(3 - second.done()), other)
    assert len(hashing) == 3 - second.done(), (hashing.items, second, other)
    gate.set()
    res = await asyncio.gather(first, second, other, return_exceptions=True)
    assert isinstance(res[1], pccl.InvalidUsageError), res
    assert isinstance(res[0], pccl.SyncInfo) and isinstance(res[2], pccl.SyncInfo), res
    assert (res[0].tx_bytes, res[2].rx_bytes) == (4096, 4096) and (xb == 42).all()


async def test_bad_arguments(peers):
    (a,) = await peers(1)
    with pytest.raises(pccl.InvalidUsageError):
        await a.sync_shared_state({"k": u8(1)})
    with pytest.raises(pccl.InvalidUsageError):
        pccl.SharedState({})
    with pytest.raises(pccl.InvalidUsageError):
        pccl.SharedState({"k": u8(1)}, revision=-1)
    with pytest.raises(pccl.InvalidUsageError, match="2\\*\\*63"):  # what the wire carries
        pccl.SharedState({"k": u8(1)}, revision=2**63)
    big = pccl.SharedState({"k": u8(1)}, revision=2**63 - 1)
    big.revision += 1
    with pytest.raises(pccl.InvalidUsageError, match="2\\*\\*63"):
        await a.sync_shared_state(big)
    with pytest.raises(pccl.InvalidUsageError):
        pccl.SharedState({"k": u8(1)}, allow_content_inequality=["nope"])
    ro = u8(1)
    ro.flags.writeable = False
    with pytest.raises(pccl.InvalidUsageError):
        pccl.SharedState({"k": ro})
    with pytest.raises(pccl.InvalidUsageError):
        pccl.SharedState({"k": np.zeros((4, 4), np.float32)[:, 1]})
    # a lone peer syncs with itself: nothing to move
    info = await a.sync_shared_state(pccl.SharedState({"k": u8(1)}, 3))
    assert (info.tx_bytes, info.rx_bytes, info.revision) == (0, 0, 3)


def test_a_key_longer_than_the_wire_allows_is_refused_at_once():
    """The master refuses keys over 4096 UTF-8 bytes (it would kick the peer at its vote)."""
    pccl.SharedState({"k" * 4096: np.zeros(1, np.uint8)})
    with pytest.raises(pccl.InvalidUsageError, match="4096 UTF-8 bytes"):
        pccl.SharedState({"é" * 2049: np.zeros(1, np.uint8)})


def test_an_advertise_host_longer_than_an_address_is_refused_at_once():
    with pytest.raises(pccl.InvalidUsageError, match="advertise_host"):
        pccl.Communicator("127.0.0.1:1", advertise_host="h" * 254)


async def test_a_layout_kick_names_the_first_differing_key_with_both_dtypes_and_sizes(
        peers, caplog):
    """The kicked peer's KickedError, the master's log and the survivors' log all name key
    'w' with both sides' dtype, element count and bytes (not just "keys, dtypes or sizes
    differ")."""
    caplog.set_level(logging.INFO, "pccl_aio.master")
    caplog.set_level(logging.INFO, "pccl_aio.state")
    comms = await peers(3)
    ids = [c.peer_id for c in comms]

    def state(dtype):
        return pccl.SharedState({"a": u8(0), "w": np.zeros(512, dtype), "z": u8(0)})

    states = [state(np.float32), state(np.float16), state(np.float32)]
    res = await sync_settled(comms, states)
    assert isinstance(res[1], pccl.KickedError), res
    assert isinstance(res[0], pccl.SyncInfo) and isinstance(res[2], pccl.SyncInfo), res
    said = (f"key 'w' is float16, 512 elements (1024 B) on peer {ids[1]} but float32, "
            f"512 elements (2048 B) on peers {ids[0]}, {ids[2]}")
    assert said in str(res[1]), res[1]
    master = [r.getMessage() for r in caplog.records if r.name == "pccl_aio.master"]
    assert any(f"peer {ids[1]} kicked" in line and said in line for line in master), master
    survivors = [r.getMessage() for r in caplog.records if r.name == "pccl_aio.state"]
    assert len([s for s in survivors if f"peer {ids[1]} was kicked" in s and said in s]) == 2, \
        survivors
