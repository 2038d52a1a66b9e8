"""Point-to-point: ``send``/``recv`` between two peers of a group, over real sockets.

Bytes arrive exact and in order per (sender, tag); a receive posted before or after its
message, or for any sender, gets it; a message bigger than the receiver's stash waits on
its connection until the receive comes; a wrong size fails the receive and the next
message still arrives; a peer that leaves fails what waits on it; bad arguments raise
before anything is sent; a connection that sends what is not a message is closed, and the
peers go on."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._net.handshake import connect
from pccl_aio._peer import testing
from pccl_aio._peer.p2p.calls import MAX_PER_PEER
from pccl_aio._wire import auth

pytestmark = pytest.mark.timeout(60)


async def test_send_and_recv_move_exact_bytes_in_order(peers):
    a, b, c = await peers(3)
    xs = [np.random.default_rng(i).standard_normal(1000 + i).astype(np.float32)
          for i in range(4)]
    sends = [a.send_async(x, b.peer_id, tag=7) for x in xs]
    outs = [np.empty_like(x) for x in xs]
    infos = [await b.recv(o, a.peer_id, tag=7, timeout=10) for o in outs]
    await asyncio.gather(*sends)
    for x, o, info in zip(xs, outs, infos):
        assert o.tobytes() == x.tobytes()
        assert info == pccl.TransferInfo(a.peer_id, 7, x.nbytes)
    # a receive posted first (zero copy), and one from any sender
    got = np.empty(10, np.int64)
    h = c.recv_async(got, None, tag=-3)
    assert not h.done()
    info = await b.send(np.arange(10, dtype=np.int64), c.peer_id, tag=-3)
    assert (await h).peer == b.peer_id and (got == np.arange(10)).all()
    assert info.nbytes == 80


async def test_tags_are_matched_not_arrival_order(peers):
    a, b = await peers(2)
    await a.send(np.full(4, 1, np.int32), b.peer_id, tag=1)
    await a.send(np.full(4, 2, np.int32), b.peer_id, tag=2)
    two, one = np.empty(4, np.int32), np.empty(4, np.int32)
    await b.recv(two, a.peer_id, tag=2, timeout=10)
    await b.recv(one, a.peer_id, tag=1, timeout=10)
    assert (one == 1).all() and (two == 2).all()
    # both directions at once, zero-length messages too
    empty = np.empty(0, np.float32)
    await asyncio.gather(a.send(empty, b.peer_id), b.recv(empty, a.peer_id, timeout=10),
                         b.send(np.ones(3), a.peer_id), a.recv(np.empty(3), b.peer_id,
                                                                  timeout=10))


async def test_a_message_beyond_the_stash_waits_for_its_receive(peers):
    a, b = await peers(2)
    testing.point_to_point(b).mailbox.stash_bytes = 1 << 20  # (a small stash: 1 MiB)
    big = np.random.default_rng(1).integers(0, 255, 8 << 20, dtype=np.uint8)
    sent = a.send_async(big, b.peer_id, tag=1)
    small = a.send_async(np.full(8, 5, np.uint8), b.peer_id, tag=2)
    with pytest.raises(pccl.PcclTimeoutError):
        await small.wait(0.5)  # behind the big one, which waits on its connection
    assert testing.point_to_point(b).mailbox.stashed <= 1 << 20
    out = np.empty_like(big)
    await b.recv(out, a.peer_id, tag=1, timeout=10)
    assert out.tobytes() == big.tobytes()
    await sent
    tail = np.empty(8, np.uint8)
    await b.recv(tail, a.peer_id, tag=2, timeout=10)
    assert (tail == 5).all()


async def test_a_wrong_size_fails_the_receive_and_the_next_message_arrives(peers):
    a, b = await peers(2)
    await a.send(np.ones(10, np.float32), b.peer_id)
    with pytest.raises(pccl.InvalidUsageError, match="40 bytes"):
        await b.recv(np.empty(11, np.float32), a.peer_id, timeout=10)
    h = b.recv_async(np.empty(3, np.float64), a.peer_id, tag=4)  # posted first this time
    await a.send(np.ones(4, np.float64), b.peer_id, tag=4)
    with pytest.raises(pccl.InvalidUsageError, match="32 bytes"):
        await h.wait(10)
    out = np.empty(5, np.int16)
    await asyncio.gather(a.send(np.arange(5, dtype=np.int16), b.peer_id),
                         b.recv(out, a.peer_id, timeout=10))
    assert (out == np.arange(5)).all()


async def test_bad_arguments_raise_before_anything_is_sent(peers):
    a, b = await peers(2)
    for bad in (a.peer_id, 10_000, "1", None, 1.5):
        with pytest.raises(pccl.InvalidUsageError):
            a.send_async(np.ones(2), bad)  # type: ignore[arg-type]
    with pytest.raises(pccl.InvalidUsageError):
        a.send_async(np.ones(2), b.peer_id, tag=1 << 64)
    with pytest.raises(pccl.InvalidUsageError):
        a.recv_async(np.ones(4)[::2], b.peer_id)
    ro = np.ones(2)
    ro.flags.writeable = False
    with pytest.raises(pccl.InvalidUsageError):
        a.recv_async(ro, b.peer_id)


async def test_a_cancelled_or_timed_out_receive_leaves_the_message_for_the_next(peers):
    a, b = await peers(2)
    with pytest.raises(pccl.PcclTimeoutError):
        await b.recv(np.empty(4, np.int32), a.peer_id, timeout=0.2)
    h = b.recv_async(np.empty(4, np.int32), a.peer_id)
    assert h.cancel() and not h.cancel()
    await a.send(np.arange(4, dtype=np.int32), b.peer_id)
    out = np.empty(4, np.int32)
    await b.recv(out, a.peer_id, timeout=10)
    assert (out == np.arange(4)).all()


async def test_a_peer_that_leaves_fails_what_waits_on_it(master, peers):
    a, b, c = await peers(3)
    waiting = b.recv_async(np.empty(4), c.peer_id)
    anyone = b.recv_async(np.empty(4), None, tag=9)
    await c.close()
    with pytest.raises(pccl.PeerLostError):
        await waiting.wait(10)
    with pytest.raises(pccl.PeerLostError):
        await a.send(np.ones(4), c.peer_id, timeout=10)
    await a.send(np.ones(4), b.peer_id, tag=9)  # the others go on
    assert (await anyone.wait(10)).peer == a.peer_id


async def test_a_member_sending_garbage_is_cut_off_and_the_others_go_on(peers):
    a, b = await peers(2)
    h = b.recv_async(np.empty(4, np.int32), a.peer_id)

    class Raw(asyncio.Protocol):
        transport: asyncio.Transport

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

    addr = testing.data_plane(a).address(b.peer_id)
    assert addr is not None
    raw = Raw()
    await connect(addr.host, addr.port, None, auth.ROLE_P2P, b"", a.peer_id, b.peer_id, raw)
    raw.transport.write(b"\x00" * 64)  # a header that is not ours
    with pytest.raises(pccl.PeerLostError):
        await h.wait(10)
    out = np.empty(4, np.int32)
    await asyncio.gather(a.send(np.arange(4, dtype=np.int32), b.peer_id),
                         b.recv(out, a.peer_id, timeout=10))
    assert (out == np.arange(4)).all()


async def test_all_to_all_moves_each_block_to_its_rank(peers):
    comms = await peers(3)
    by_rank = _by_rank(comms)
    # rank r sends r*10 + j (j + 1 elements) to rank j: unequal blocks
    srcs = [[np.full(j + 1 + r, r * 10 + j, np.int64) for j in range(3)] for r in range(3)]
    dsts = [[np.empty(r + 1 + j, np.int64) for j in range(3)] for r in range(3)]
    hs = [c.all_to_all_async(s, d, tag=5) for c, s, d in zip(by_rank, srcs, dsts)]
    infos = await asyncio.wait_for(asyncio.gather(*hs), 20)
    for r in range(3):
        for j in range(3):
            assert (dsts[r][j] == j * 10 + r).all() and len(dsts[r][j]) == r + 1 + j
    assert infos[0].world_size == 3 and infos[0].tx_bytes == 8 * (2 + 3)
    # the same tag again, with float32 and empty blocks
    srcs2 = [[np.full(4 if j != r else 0, r, np.float32) for j in range(3)] for r in range(3)]
    dsts2 = [[np.empty(4 if j != r else 0, np.float32) for j in range(3)] for r in range(3)]
    await asyncio.wait_for(asyncio.gather(
        *(c.all_to_all(s, d, tag=5) for c, s, d in zip(by_rank, srcs2, dsts2))), 20)
    assert all((dsts2[r][j] == j).all() for r in range(3) for j in range(3))


async def test_an_all_to_all_that_fails_on_one_rank_fails_on_every_rank(peers):
    comms = await peers(3)
    by_rank = _by_rank(comms)
    srcs = [[np.ones(8, np.float32) for _ in range(3)] for _ in range(3)]
    dsts = [[np.empty(8, np.float32) for _ in range(3)] for _ in range(3)]
    dsts[2][0] = np.empty(9, np.float32)  # rank 2 expects another size from rank 0
    hs = [c.all_to_all_async(s, d, tag=1) for c, s, d in zip(by_rank, srcs, dsts)]
    got = await asyncio.wait_for(asyncio.gather(*(h.wait() for h in hs),
                                                return_exceptions=True), 20)
    assert all(isinstance(e, pccl.PcclError) for e in got), got
    assert isinstance(got[2], pccl.InvalidUsageError)
    # the next one with the same tag works (nothing stale is taken)
    dsts = [[np.empty(8, np.float32) for _ in range(3)] for _ in range(3)]
    srcs = [[np.full(8, r, np.float32) for _ in range(3)] for r in range(3)]
    await asyncio.wait_for(asyncio.gather(
        *(c.all_to_all(s, d, tag=1) for c, s, d in zip(by_rank, srcs, dsts))), 20)
    assert all((dsts[r][j] == j).all() for r in range(3) for j in range(3))


async def test_an_all_to_all_with_a_crashed_rank_raises_on_every_survivor(peers):
    comms = await peers(3)
    ring, by_rank = comms[0].ranks, _by_rank(comms)
    testing.crash(by_rank[1])
    srcs = [[np.ones(1000, np.float32) for _ in range(3)] for _ in range(3)]
    dsts = [[np.empty(1000, np.float32) for _ in range(3)] for _ in range(3)]
    hs = [by_rank[r].all_to_all_async(srcs[r], dsts[r], tag=2, ring=ring) for r in (0, 2)]
    got = await asyncio.wait_for(asyncio.gather(*(h.wait() for h in hs),
                                                return_exceptions=True), 20)
    assert all(isinstance(e, pccl.PeerLostError) for e in got), got


async def test_what_a_peer_sent_before_it_left_is_still_received(peers):
    a, b, c = await peers(3)
    await c.send(np.arange(6, dtype=np.int32), a.peer_id, tag=3)
    gone = c.peer_id
    await c.close()
    await asyncio.gather(a.update_topology(), b.update_topology())
    assert gone not in a.ranks  # (the membership without it is known)
    out = np.empty(6, np.int32)
    info = await a.recv(out, gone, tag=3, timeout=10)
    assert info.peer == gone and (out == np.arange(6)).all()
    with pytest.raises(pccl.PeerLostError):  # nothing more is coming from it
        await a.recv(out, gone, tag=3, timeout=10)
    with pytest.raises(pccl.PeerLostError):
        a.send_async(out, gone)


async def test_a_member_opening_too_many_connections_is_cut_off(peers):
    a, b, c = await peers(3)
    addr = testing.data_plane(c).address(b.peer_id)
    assert addr is not None
    raws = []
    for _ in range(MAX_PER_PEER + 1):  # connections in c's name
        raw = _Raw()
        await connect(addr.host, addr.port, None, auth.ROLE_P2P, b"", c.peer_id, b.peer_id, raw)
        raws.append(raw)
    await asyncio.wait_for(raws[-1].lost, 10)  # the one too many is closed
    assert not any(r.lost.done() for r in raws[:-1])
    out = np.empty(4, np.int32)  # the others' messages go through
    await asyncio.gather(a.send(np.arange(4, dtype=np.int32), b.peer_id),
                         b.recv(out, a.peer_id, timeout=10))
    assert (out == np.arange(4)).all()
    for r in raws[:-1]:
        r.transport.close()


class _Raw(asyncio.Protocol):
    transport: asyncio.Transport

    def __init__(self) -> None:
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


def _by_rank(comms: list[pccl.Communicator]) -> list[pccl.Communicator]:
    """The communicators in rank order."""
    ring = comms[0].ranks
    return sorted(comms, key=lambda c: ring.index(c.peer_id))
