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
