"""A small send written by the calling thread straight to the socket (``Channel.send_now``,
what torch's ``send`` uses): its bytes and framing are the loop's, a message the socket
takes only in part is finished by the loop before anything after it, nothing overtakes a
send still waiting on the loop, and closing the connection closes it (the thread's dup of
the socket does not hold it open)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from pccl_aio._peer.p2p.outbox import DIRECT_MAX, Channel
from pccl_aio._wire.p2p import HEADER, pack_header, user_key

torch = pytest.importorskip("torch")
import pccl_aio.torch as pt  # noqa: E402
from pccl_aio import blocking  # noqa: E402
from tests.helpers import blocking_pair  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def message(i: int, n: int) -> tuple[bytes, bytes]:
    payload = bytes((i + k) % 251 for k in range(n))
    return pack_header(user_key(i), n), payload


async def connected(sndbuf: int = 0) -> tuple[Channel, socket.socket]:
    """A channel on a real TCP connection over loopback (a send buffer of ``sndbuf`` bytes
    where given), and the socket at its other end."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    if sndbuf:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    ch = Channel(peer=1)
    await asyncio.get_running_loop().create_connection(lambda: ch, sock=a)
    return ch, b


def read_all(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk, "the connection closed early"
        got += chunk
    return bytes(got)


async def test_a_direct_send_writes_the_loops_bytes_from_the_calling_thread():
    ch, b = await connected()
    loop = asyncio.get_running_loop()
    try:
        header, payload = message(7, 4096)
        done = await asyncio.to_thread(ch.send_now, header, memoryview(payload), loop)
        assert done is not None and done.done() and done.result() == 0
        assert await asyncio.to_thread(read_all, b, HEADER.size + 4096) == header + payload
        assert ch.tx_bytes == HEADER.size + 4096
    finally:
        ch.close()
        b.close()


async def test_a_send_the_socket_takes_in_part_is_finished_by_the_loop_in_order():
    ch, b = await connected(sndbuf=8192)  # (smaller than a message: it is taken in part)
    loop = asyncio.get_running_loop()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sent: list[bytes] = []
    futures = []
    try:
        # (called on the loop's thread here, so that the loop cannot write the tail before
        # the checks: what a caller's thread runs is the same code)
        for i in range(10_000):  # until the socket is full: a tail goes to the loop
            header, payload = message(i, DIRECT_MAX)
            done = ch.send_now(header, memoryview(payload), loop)
            if done is None:
                break
            sent.append(header + payload)
            futures.append(done)
            if not done.done():
                break
        assert futures and not futures[-1].done()  # (a partial write: its rest is queued)
        assert len(ch.tails) == 1
        header, payload = message(99, 16)
        assert ch.send_now(header, memoryview(payload), loop) is None  # (not before the tail)
        later = loop.create_future()
        ch.write(header, memoryview(payload), later)  # the loop's send comes after the tail
        sent.append(header + payload)
        total = sum(map(len, sent))
        got = await asyncio.to_thread(read_all, b, total)
        assert got == b"".join(sent)
        await asyncio.wrap_future(futures[-1])
        assert not ch.tails and ch.tx_bytes == total
    finally:
        ch.close()
        b.close()


async def test_closing_the_channel_closes_the_connection_despite_the_dup():
    ch, b = await connected()
    loop = asyncio.get_running_loop()
    assert ch.sock is not None
    ch.close()
    b.settimeout(10)
    assert await asyncio.to_thread(b.recv, 1) == b""  # EOF: no fd holds it open
    header, payload = message(1, 8)
    assert await asyncio.to_thread(ch.send_now, header, memoryview(payload), loop) is None
    b.close()


async def test_a_send_to_a_closed_peer_is_left_to_the_loop():
    ch, b = await connected()
    loop = asyncio.get_running_loop()
    b.close()
    header, payload = message(1, 8)
    for _ in range(3):  # (the reset may need a write to show)
        await asyncio.to_thread(ch.send_now, header, memoryview(payload), loop)
    assert await asyncio.to_thread(ch.send_now, header, memoryview(payload), loop) is None
    ch.close()


def test_small_and_large_sends_on_one_tag_arrive_in_order_through_the_group():
    """Small sends (written by the caller) and large ones (posted to the loop) alternate on
    one tag: the receiver gets them in the order they were sent, byte for byte."""
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0) as m:
        comms = blocking_pair(m.address)
        groups = [pt.ProcessGroup(c) for c in comms]
        try:
            sizes = [1024, 300_000, 16, 1024, 2_000_000, 8, 8, 70_000, 4]
            msgs = [torch.arange(n, dtype=torch.float32) + i for i, n in enumerate(sizes)]
            outs = [torch.empty(n) for n in sizes]
            recvs = [groups[1].recv([o], 0, 5) for o in outs]
            sends = [groups[0].send([t], 1, 5) for t in msgs]
            for w in sends + recvs:
                assert w.wait()
            for t, o in zip(msgs, outs):
                assert torch.equal(t, o)
        finally:
            for g, c in zip(groups, comms):
                g.close()
                c.close()
