"""Failures inside one event loop: vanished peers, bad input to the master, master loss, a
peer whose data port refuses for a while."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import msgspec
import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._net.handshake import Gate
from pccl_aio._peer import testing
from pccl_aio._wire import auth
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import frame
from tests.helpers import FAST, crash, crash_after, raw_master, reduce_ok


async def _reduce_ok(comms, n=100):
    xs = [np.ones(n, np.float32) for _ in comms]
    infos = await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    assert all((x == len(comms)).all() for x in xs)
    return infos


async def test_crash_mid_allreduce_aborts_everyone_and_retry_works(peers):
    comms = await peers(4)
    victim, survivors = comms[1], [comms[0], comms[2], comms[3]]
    xs = [np.arange(1 << 20, dtype=np.float32) * (i + 1) for i in range(4)]
    originals = [x.copy() for x in xs]
    hs = [c.all_reduce_async(x, tag=7) for c, x in zip(comms, xs)]
    assert await hs[0].started()
    crash(victim)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    res = await asyncio.gather(*(hs[i] for i in (0, 2, 3)), return_exceptions=True)
    assert loop.time() - t0 < 2.0
    for r in res:  # every survivor, neighbour of the victim or not
        assert isinstance(r, pccl.PeerLostError), r
    for i, c in zip((0, 2, 3), survivors):
        assert c.peer_group_world_size == 3  # updated without update_topology
        assert xs[i].tobytes() == originals[i].tobytes()  # in-place input restored
    infos = await asyncio.gather(*(c.all_reduce(xs[i], tag=7)
                                   for i, c in zip((0, 2, 3), survivors)))
    want = originals[0] + originals[2] + originals[3]
    for i in (0, 2, 3):
        assert xs[i].tobytes() == xs[0].tobytes()
        np.testing.assert_allclose(xs[i], want, rtol=1e-6)
    assert [i.world_size for i in infos] == [3, 3, 3]


async def test_a_victims_data_links_closing_before_its_master_connection_still_update_first(
        peers):
    """A killed process's sockets do not all close at once: under load its data connections
    closed a few ms before its master connection, the neighbours' failure reports reached
    the master first, and the survivors saw the abort before the smaller membership
    (test_kill.py's SIGKILL test, about 1 run in 6 on a loaded machine). The report names the
    suspect, and the master gives its master connection up to 100 ms to close."""
    comms = await peers(4)
    victim, survivors = comms[1], [comms[0], comms[2], comms[3]]
    xs = [np.arange(1 << 20, dtype=np.float32) for _ in range(4)]
    hs = [c.all_reduce_async(x, tag=3) for c, x in zip(comms, xs)]
    assert await hs[0].started()

    async def world_at_error(i: int) -> int:
        with pytest.raises(pccl.PeerLostError):
            await hs[i]
        return comms[i].peer_group_world_size

    testing.data_plane(victim).abort()  # its data connections go first ...
    control = testing.control_plane(victim)
    asyncio.get_running_loop().call_later(0.03, control.abort)  # ... its master's later
    assert await asyncio.gather(*(world_at_error(i) for i in (0, 2, 3))) == [3, 3, 3]
    crash(victim)
    await reduce_ok(survivors)


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out-of-place"])
@pytest.mark.parametrize("when", [(0, 1), (0, 3), (1, 1), (1, 4)],
                         ids=["rs-first", "rs-third", "ag-first", "ag-fourth"])
async def test_crash_at_each_pipeline_point_leaves_inputs_intact(peers, in_place, when):
    """dst segments are backed up (or filled from src) only when first written: a crash after
    the k-th received segment of a phase still restores an in-place input bit-exactly and never
    touches an out-of-place input."""
    comms = await peers(3)
    n = 3 * (1 << 20)  # 4 MiB float32 chunks: 4 segments each
    xs = [np.arange(n, dtype=np.float32) * (i + 1) + 0.5 for i in range(3)]
    originals = [x.copy() for x in xs]
    outs = [np.full(n, -1.0, np.float32) for _ in range(3)]
    phase, k = when
    with crash_after(comms[0], comms[1], phase, k) as seen:
        hs = [c.all_reduce_async(x, None if in_place else o, tag=3)
              for c, x, o in zip(comms, xs, outs)]
        res = await asyncio.gather(hs[0], hs[2], return_exceptions=True)
    assert seen[0] >= k
    for r in res:
        assert isinstance(r, pccl.PeerLostError), r
    for i in (0, 2):
        assert xs[i].tobytes() == originals[i].tobytes()
    infos = await asyncio.gather(*(comms[i].all_reduce(xs[i], None if in_place else outs[i], tag=3)
                                   for i in (0, 2)))
    result = [xs[i] if in_place else outs[i] for i in (0, 2)]
    assert result[0].tobytes() == result[1].tobytes()
    np.testing.assert_array_equal(result[0], originals[0] + originals[2])
    assert [i.world_size for i in infos] == [2, 2]


async def test_crash_without_restore_on_abort_leaves_input_unrestored_and_retry_works(peers):
    """restore_on_abort=False: a crash after the survivor's first all-gather segment landed
    raises PeerLostError saying the input was not restored (its buffer already holds some
    final bytes); refilled, the retry among the survivors is exact."""
    comms = await peers(3)
    n = 3 * (1 << 20)
    xs = [np.arange(n, dtype=np.float32) * (i + 1) + 0.5 for i in range(3)]
    originals = [x.copy() for x in xs]
    with crash_after(comms[0], comms[1], phase=1, k=1):
        hs = [c.all_reduce_async(x, tag=4, restore_on_abort=False) for c, x in zip(comms, xs)]
        res = await asyncio.gather(hs[0], hs[2], return_exceptions=True)
    for r in res:
        assert isinstance(r, pccl.PeerLostError), r
        assert "not restored" in str(r)
    assert xs[0].tobytes() != originals[0].tobytes()  # an all-gather segment landed, kept
    for i in (0, 2):
        xs[i][:] = originals[i]
    await asyncio.gather(*(comms[i].all_reduce(xs[i], tag=4, restore_on_abort=False)
                           for i in (0, 2)))
    assert xs[0].tobytes() == xs[2].tobytes()
    np.testing.assert_array_equal(xs[0], originals[0] + originals[2])


def _first_start(comm: pccl.Communicator, monkeypatch) -> asyncio.Event:
    """Set when a collective of ``comm`` is started by the master (data begins to flow)."""
    from pccl_aio._peer.data import collective as _collective

    started = asyncio.Event()
    on_start = _collective.Collective.on_start

    def spy(self, seq, ring_ids, me):
        on_start(self, seq, ring_ids, me)
        if self.env is testing.data_plane(comm):
            started.set()

    monkeypatch.setattr(_collective.Collective, "on_start", spy)
    return started


async def test_multiple_with_retry_survives_a_crash(peers, monkeypatch):
    comms = await peers(3, p2p_connections=2)
    started = _first_start(comms[2], monkeypatch)
    tensors = [[np.full(40_000, t + 1 + 100 * i, np.float64) for t in range(10)] for i in range(3)]
    tasks = [asyncio.ensure_future(c.all_reduce_multiple_with_retry(ts, max_in_flight=4))
             for c, ts in zip(comms, tensors)]
    await started.wait()  # crash once the first collective started on the victim
    crash(comms[2])
    tasks[2].cancel()
    infos = await asyncio.gather(tasks[0], tasks[1])
    assert len(infos[0]) == 10
    for t in range(10):
        assert tensors[0][t].tobytes() == tensors[1][t].tobytes()
        assert tensors[0][t][0] in (2 * (t + 1) + 100, 3 * (t + 1) + 300)


async def test_too_few_peers_after_crash(peers, monkeypatch):
    a, b = await peers(2)
    started = _first_start(a, monkeypatch)
    x = np.ones(1 << 18, np.float32)
    y = np.ones(1 << 18, np.float32)
    ta = asyncio.ensure_future(a.all_reduce_multiple_with_retry([x]))
    hb = asyncio.ensure_future(b.all_reduce_multiple_with_retry([y]))
    await started.wait()
    crash(b)
    hb.cancel()
    with pytest.raises(pccl.TooFewPeersError):
        await ta
    assert a.peer_group_world_size == 1


async def test_crash_during_admission_vote(master, peers):
    comms = await peers(3)
    joiner = pccl.Communicator(master.address, **FAST)
    async with joiner:
        task = asyncio.ensure_future(joiner.connect())
        while not all(await asyncio.gather(*(c.are_peers_pending() for c in comms))):
            pass
        votes = [asyncio.ensure_future(c.update_topology()) for c in comms[:2]]
        crash(comms[2])  # never votes
        await asyncio.gather(*votes)
        await task
        assert comms[0].world_size == 3 and joiner.world_size == 3
        await _reduce_ok([comms[0], comms[1], joiner])


async def test_master_loss_fails_pending_and_later_calls(master, peers):
    """With ``master_timeout=0`` a lost master ends the session at once (the failover
    behaviour, the default, is ``test_failover.py``'s)."""
    a, b = await peers(2, master_timeout=0)
    vote = asyncio.ensure_future(a.update_topology())  # b never votes
    x = np.ones(4, np.float32)
    await master.close()
    with pytest.raises(pccl.MasterConnectionError):
        await vote
    with pytest.raises(pccl.MasterConnectionError):
        await b.all_reduce(x)
    assert (x == 1).all()


async def _raw(master):
    return await raw_master(master.port)


@pytest.mark.parametrize("payload", [
    b"\x00\x00\x00\x05garbage-not-msgpack",
    struct.pack(">I", 1 << 30) + b"x",  # oversized frame
    frame(msgspec.msgpack.encode([99, 1, 2])),  # unknown message tag
    frame(m.encode(m.VoteUpdateTopology())),  # a vote before Hello
    b"\xff" * 64,
])
async def test_bad_bytes_close_only_that_connection(master, peers, payload):
    comms = await peers(2)
    reader, writer = await _raw(master)
    writer.write(payload)
    await writer.drain()
    rest = await reader.read()  # the master closes us (maybe after a Kicked frame)
    assert rest == b"" or m.decode_master_to_peer(rest[4:]).__class__ in (m.Kicked, m.Rejected)
    writer.close()
    await _reduce_ok(comms)


async def test_other_protocol_version_refused_clearly(master):
    reader, writer = await _raw(master)
    writer.write(frame(msgspec.msgpack.encode([1, 99, 0, 5000, ""])))
    body = await reader.read()
    msg = m.decode_master_to_peer(body[4:])
    assert isinstance(msg, m.Rejected) and "version 99" in msg.reason
    writer.close()


async def test_peer_refuses_master_of_other_version():
    async def fake_master(reader, writer):  # passes the handshake, refuses the Hello
        assert await Gate("fake").admit(reader, writer, _no_secret) is not None
        await reader.read(100)
        other = m.PROTOCOL_VERSION + 1
        writer.write(frame(m.encode(m.Rejected(f"protocol version {other - 1} is not supported",
                                               other))))
        writer.close()

    server = await asyncio.start_server(fake_master, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, pccl.Communicator(f"127.0.0.1:{port}", **FAST) as c:
        with pytest.raises(pccl.VersionMismatchError):
            await c.connect(attempts=1)


async def _no_secret(opening):
    return b""


async def test_a_master_heartbeat_before_the_welcome_is_skipped():
    """Found by bench/security.py over a 100 ms WAN: the master's tick reached a joiner before
    its Welcome, and connect() failed with "unexpected first message MasterHeartbeat()"."""
    async def fake_master(reader, writer):
        assert await Gate("fake").admit(reader, writer, _no_secret) is not None
        await reader.read(100)  # the Hello
        writer.write(frame(m.encode(m.MasterHeartbeat())) + frame(m.encode(m.MasterHeartbeat()))
                     + frame(m.encode(m.Welcome(1, True)))
                     + frame(m.encode(m.Membership(1, 1, 1, 1, [m.PeerAddr(1, "127.0.0.1", 9)]))))
        await reader.read()  # until the peer leaves

    server = await asyncio.start_server(fake_master, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, pccl.Communicator(f"127.0.0.1:{port}", **FAST) as c:
        await c.connect(attempts=1)
        assert c.peer_id == 1 and c.world_size == 1


async def test_peer_refuses_master_of_other_handshake_version():
    async def fake_master(reader, writer):
        await reader.readexactly(auth.OPEN.size)
        writer.write(auth.refusal(auth.BAD_VERSION))
        writer.close()

    server = await asyncio.start_server(fake_master, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, pccl.Communicator(f"127.0.0.1:{port}", **FAST) as c:
        with pytest.raises(pccl.VersionMismatchError, match="handshake version"):
            await c.connect(attempts=1)


async def test_illegal_vote_kicks_that_peer_only(peers):
    a, b, c = await peers(3)
    pending = testing.control_plane(a).expect("pending")  # what are_peers_pending() waits on
    testing.control_plane(a).send(m.VotePeersPending())
    testing.control_plane(a).send(m.VotePeersPending())  # a duplicate vote breaks the protocol
    with pytest.raises(pccl.KickedError):
        await pending
    with pytest.raises(pccl.KickedError):
        await a.all_reduce(np.ones(3, np.float32))
    await _reduce_ok([b, c])
    assert b.world_size == 2


async def _wait(h):
    return await h


async def _tasks_of(comms):
    return {t for t in asyncio.all_tasks() if "Collective" in repr(t.get_coro())}


@pytest.mark.parametrize("when", ["voting", "voting-cancel-method", "running"])
async def test_cancelling_an_allreduce_aborts_it_for_the_group(peers, when):
    comms = await peers(3)
    xs = [np.full(1 << 20, i + 1, np.float32) for i in range(3)]
    originals = [x.copy() for x in xs]
    if when.startswith("voting"):  # peer 2 never launches; peer 0 gives up while voting
        hs = [c.all_reduce_async(x) for c, x in zip(comms[:2], xs)]
        # joint vote as a barrier: both collective votes reached the master before it
        await asyncio.gather(*(c.are_peers_pending() for c in comms))
        if when == "voting":  # the awaiting task is cancelled (here by wait_for's deadline)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(_wait(hs[0]), 0.2)
        else:
            assert hs[0].cancel() and hs[0].cancel()  # idempotent while it runs
            with pytest.raises(asyncio.CancelledError):
                await hs[0]
            assert not hs[0].cancel()  # it ended
        with pytest.raises(pccl.PeerLostError, match="cancelled"):
            await hs[1]
    else:
        hs = [c.all_reduce_async(x) for c, x in zip(comms, xs)]
        task = asyncio.ensure_future(hs[0])
        assert await hs[0].started()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for h in hs[1:]:
            with pytest.raises(pccl.PeerLostError):
                await h
    for x, o in zip(xs, originals):
        assert x.tobytes() == o.tobytes()  # nothing half-reduced is left behind
    with contextlib.suppress(pccl.PeerLostError, asyncio.CancelledError):
        await hs[0].wait()  # the cancelled attempt ends with the master's verdict
    assert hs[0].done()
    assert not await _tasks_of(comms)  # no task leaked
    infos = await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    assert all(i.world_size == 3 for i in infos) and (xs[0] == 6).all()


# A data link whose connect failed used to be cached, so it was never retried.
@pytest.mark.timeout(60)
async def test_a_refused_data_connect_is_retried_by_the_next_collective(peers):
    a, b = await peers(2)
    listener = testing.data_plane(b).listener
    host, port = "127.0.0.1", listener.port  # (where b listens: it reaches the master there)
    await listener.close()  # b's data port refuses: a cannot reach its ring successor
    xs = [np.ones(1000, np.float32), np.ones(1000, np.float32)]
    results = await asyncio.gather(a.all_reduce(xs[0]), b.all_reduce(xs[1]),
                                   return_exceptions=True)
    assert all(isinstance(r, pccl.PeerLostError) for r in results), results
    assert all((x == 1).all() for x in xs)  # restored
    await listener.start(host, port)  # the listener is back on the same port
    await reduce_ok([a, b])
