"""Shared-state synchronisation under faults: corrupted bytes (scenario 56), crashed
requesters and voters (scenario 36), and distributors crashing before, during and after
their transfer (fail-over to another source). Shared helpers: ``state_harness``.
"""

from __future__ import annotations

import asyncio

import numpy as np

import pccl_aio as pccl
from pccl_aio._peer.state import transfer
from tests.integration.state_harness import (
    PIECE,
    MasterLog,
    Tally,
    first_of,
    random_bits,
    reap,
    state_server,
    sync,
    sync_settled,
    tx_rx,
    u8,
    vanish,
)

# ---- scenario 56 and fault injection -------------------------------------------------------------


async def test_received_bytes_not_matching_the_elected_hash_fail_the_requester(peers):
    """Scenario 56: a source serves modified bytes -> the requester's sync raises
    SharedStateError, and (unlike PCCL, where the source completes) so does the source's,
    naming the failed part, so that the whole group retries together; with an honest source
    the retry repairs the state."""
    a, b = await peers(2)
    xa, xb = u8(42), u8(0)
    sa, sb = pccl.SharedState({"key1": xa}), pccl.SharedState({"key1": xb})
    # The state server holds the lookup it was built with: patch that one.
    honest = state_server(a).lookup
    served = []

    async def liar(peer, key, revision):
        served.append(key)
        return memoryview(bytearray(b"x" * 1024))

    state_server(a).lookup = liar
    ra, rb = await sync_settled([a, b], [sa, sb])
    assert served == ["key1"]
    assert isinstance(rb, pccl.SharedStateError) and "hash" in str(rb), rb
    assert isinstance(ra, pccl.SharedStateError) and f"peer {b.peer_id}'s part failed" in str(ra)
    assert sb.revision == 0 and sa.revision == 0
    state_server(a).lookup = honest
    infos = await sync([a, b], [sa, sb])
    # the same sync, retried
    assert infos[1].rx_bytes == 1024 and (xb == 42).all() and sb.revision == 0


async def test_a_bad_source_among_honest_ones_is_caught_by_the_hash(peers):
    """Several sources, one of which lies for every range it serves: the requester must not
    silently accept the corrupted bytes."""
    comms = await peers(3)
    n = 2 * PIECE
    good = random_bits(n, np.uint8, 1)
    xs = [good.copy(), good.copy(), np.zeros(n, np.uint8)]
    states = [pccl.SharedState({"k": x}, r) for x, r in zip(xs, [1, 1, 0])]
    lied = []

    async def liar(peer, key, rev):
        lied.append(key)
        return memoryview(bytearray(n))

    state_server(comms[1]).lookup = liar
    res = await sync_settled(comms, states)
    if lied:  # the requester's sync fails, and so does the group's (everyone retries)
        assert all(isinstance(r, pccl.SharedStateError) for r in res), res
        assert "hash" in str(res[2]) and "part failed" in str(res[0]), res
    else:  # every range happened to come from the honest peer
        assert all(isinstance(r, pccl.SyncInfo) for r in res), res
        assert xs[2].tobytes() == good.tobytes()


async def test_a_crashed_requester_does_not_block_the_others(peers):
    """Scenario 36: a peer that is not a distributor dies in the middle of its fetch; the
    sources' sync completes."""
    comms = await peers(3)
    xs = [u8(4, 3 * PIECE), u8(4, 3 * PIECE), u8(0, 3 * PIECE)]
    states = [pccl.SharedState({"k": x}, r) for x, r in zip(xs, [1, 1, 0])]
    tasks = [asyncio.ensure_future(c.sync_shared_state(s)) for c, s in zip(comms, states)]
    served = []
    for src in comms[:2]:
        real = state_server(src).lookup

        async def lookup(peer, key, rev, real=real):
            if not served:
                vanish(comms[2], tasks[2])
            served.append(key)
            return await real(peer, key, rev)

        state_server(src).lookup = lookup
    infos = await asyncio.gather(tasks[0], tasks[1])
    assert served and [i.revision for i in infos] == [1, 1]
    assert comms[0].peer_group_world_size == 2
    await reap(tasks[2])


async def test_a_peer_crashed_before_voting_does_not_block_the_others(master, peers):
    """Scenario 36: the group's sync runs as soon as the dead peer is dropped from the vote."""
    log = MasterLog(master)  # before the peers connect
    comms = await peers(3)
    xs = [u8(1), u8(2), u8(2)]
    tasks = [await log.vote(comms[i], comms[i].sync_shared_state(pccl.SharedState({"k": xs[i]})))
             for i in (0, 1)]
    vanish(comms[2])  # both votes are in: the master waits for the third one only
    infos = await asyncio.gather(*tasks)
    # 1 vs 1 among the survivors: the lowest id (1) wins
    assert tx_rx(infos) == [(1024, 0), (0, 1024)] and (xs[1] == 1).all()


async def test_distributor_crash_before_the_fetch_fails_over_to_another_source(peers, monkeypatch):
    """A source listed in the plan is dead when the requester connects: the other source serves
    every range (the sync still completes, bytes correct)."""
    import pccl_aio._peer.state.sync as sync_mod

    comms = await peers(3)
    good = random_bits(2 * PIECE + 3, np.uint8, 2)
    xs = [good.copy(), good.copy(), np.zeros_like(good)]
    states = [pccl.SharedState({"k": x}, r) for x, r in zip(xs, [1, 1, 0])]
    tasks = [asyncio.ensure_future(c.sync_shared_state(s)) for c, s in zip(comms, states)]
    real_fetch = sync_mod.fetch_ranges

    async def fetch_after_crash(*args, **kw):
        vanish(comms[0], tasks[0])
        return await real_fetch(*args, **kw)

    monkeypatch.setattr(sync_mod, "fetch_ranges", fetch_after_crash)
    infos = await asyncio.gather(tasks[1], tasks[2])
    assert infos[1].rx_bytes == good.nbytes and infos[0].tx_bytes == good.nbytes
    assert xs[2].tobytes() == good.tobytes() and states[2].revision == 1
    await reap(tasks[0])


async def test_distributor_crash_mid_transfer_fails_over_to_another_source(peers):
    """A source dies while serving its first range (4 ranges, 2 sources): the requester's
    ranges fail over to the other source and the sync completes with the right bytes."""
    comms = await peers(3)
    good = random_bits(4 * PIECE, np.uint8, 3)
    xs = [good.copy(), good.copy(), np.zeros_like(good)]
    states = [pccl.SharedState({"k": x}, r) for x, r in zip(xs, [1, 1, 0])]
    tasks = [asyncio.ensure_future(c.sync_shared_state(s)) for c, s in zip(comms, states)]
    calls = []

    async def crash_on_first_request(peer, key, rev):
        calls.append(key)
        vanish(comms[0], tasks[0])
        return None

    state_server(comms[0]).lookup = crash_on_first_request
    infos = await asyncio.gather(tasks[1], tasks[2])
    assert calls, "the crashing source was never asked for a range"
    assert infos[1].rx_bytes == good.nbytes and infos[0].tx_bytes == good.nbytes
    assert xs[2].tobytes() == good.tobytes()
    await reap(tasks[0])


async def test_distributor_crash_after_the_other_source_finished(peers, monkeypatch):
    """The failing source holds its ranges in flight (it never answers) while the other
    source has already served everything else: the other source must still take them over
    (no idle worker may give up while a range can come back)."""
    comms = await peers(3)
    good = random_bits(3 * PIECE, np.uint8, 4)
    xs = [good.copy(), good.copy(), np.zeros_like(good)]
    states = [pccl.SharedState({"k": x}, r) for x, r in zip(xs, [1, 1, 0])]
    tasks = [asyncio.ensure_future(c.sync_shared_state(s)) for c, s in zip(comms, states)]
    stalled = Tally()
    never = asyncio.Event()

    async def stall(peer, key, rev):
        stalled.add(key)
        await never.wait()  # answers in order: every later request on the connection waits
        return None

    state_server(comms[0]).lookup = stall
    source_of: dict[int, int] = {}  # id(protocol) -> the peer id it fetches from
    in_flight: dict[int, tuple[int, int]] = {}  # id(target) -> (source, bytes)
    done = [0]
    only_stalled_left = asyncio.Event()
    real_connect, real_fetch = transfer.connect, transfer._FetchProtocol.fetch

    async def connect(*args):
        source_of[id(args[-1])] = args[-2]
        return await real_connect(*args)

    async def counted_fetch(self, key, revision, offset, target):
        in_flight[id(target)] = (source_of[id(self)], len(target))
        await real_fetch(self, key, revision, offset, target)
        del in_flight[id(target)]
        done[0] += len(target)
        held = [n for src, n in in_flight.values() if src == comms[0].peer_id]
        if len(held) == len(in_flight) and done[0] + sum(held) == good.nbytes:
            only_stalled_left.set()

    monkeypatch.setattr(transfer, "connect", connect)
    monkeypatch.setattr(transfer._FetchProtocol, "fetch", counted_fetch)
    # Set by the last range the honest source completes while the stalled one holds the rest:
    # the requester's workers have nothing left in the queue and wait for ranges to come back.
    await first_of(asyncio.gather(stalled.reached(1), only_stalled_left.wait()), tasks[2])
    assert stalled.items and only_stalled_left.is_set() and 0 < done[0] < good.nbytes, done
    t0 = asyncio.get_running_loop().time()
    vanish(comms[0], tasks[0])
    infos = await asyncio.gather(tasks[1], tasks[2])
    assert asyncio.get_running_loop().time() - t0 < 5  # no data_timeout wait
    assert xs[2].tobytes() == good.tobytes() and infos[1].rx_bytes == good.nbytes
    assert infos[0].tx_bytes == good.nbytes
    never.set()
    await reap(tasks[0])


async def test_only_distributor_crash_fails_cleanly_and_a_later_sync_recovers(peers):
    """The single source dies mid-transfer: both requesters raise SharedStateError (no hang);
    a retry without any up-to-date peer fails cleanly; once a survivor restores revision 1
    from its own copy, the other fetches it."""
    comms = await peers(3)
    good = random_bits(PIECE + 5, np.uint8, 5)
    xs = [good.copy(), np.zeros_like(good), np.zeros_like(good)]
    states = [pccl.SharedState({"k": x}, r) for x, r in zip(xs, [1, 0, 0])]
    tasks = [asyncio.ensure_future(c.sync_shared_state(s)) for c, s in zip(comms, states)]

    async def crash_on_first_request(peer, key, rev):
        vanish(comms[0], tasks[0])
        return None

    state_server(comms[0]).lookup = crash_on_first_request
    res = await asyncio.gather(tasks[1], tasks[2], return_exceptions=True)
    assert all(isinstance(r, pccl.SharedStateError) for r in res), res
    assert states[1].revision == states[2].revision == 0
    await reap(tasks[0])
    survivors, left = comms[1:], states[1:]
    # nobody holds revision 1 (the master's last one): a clean failure, nobody kicked
    res = await sync_settled(survivors, left)
    assert all(isinstance(r, pccl.SharedStateError) for r in res), res
    assert survivors[0].peer_group_world_size == 2
    # peer 2 restores revision 1 from its checkpoint; peer 3 fetches it
    xs[1][:] = good
    left[0].revision = 1
    infos = await sync(survivors, left)
    assert tx_rx(infos) == [(good.nbytes, 0), (0, good.nbytes)]
    assert xs[2].tobytes() == good.tobytes() and left[1].revision == 1
