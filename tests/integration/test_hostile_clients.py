"""What a hostile or misbehaving client can make a master or a peer's state server do:
nothing harmful. Each attack (issue 17's findings) runs against a real master and peers on
127.0.0.1 and is refused or harmless: the state server serves only planned fetchers at the
planned revision, a flood of Hellos costs a training loop no admission round, a connection
that never says Hello expires, ``advertise_host`` must be the connection's own address, and
a client that does not read is closed before the master grows. (Injection and the seq
flood: ``test_dataplane_guard.py``; the master's memory under partial frames:
``tests/process/test_master_memory.py``; outsiders and sybils in a run with a secret:
``test_security.py``.)"""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._net.handshake import greet
from pccl_aio._net.stream import read_frame
from pccl_aio._peer import testing
from pccl_aio._wire import auth
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import frame
from pccl_aio._wire.state import NOT_SERVING, RESP, pack_request, parse_response
from tests.helpers import FAST, closed, join_peers, raw_master, reduce_ok


async def _request(port: int, me: int, source: int, key: str, revision: int, n: int) -> int:
    """A bare state-transfer request as peer ``me`` (a run without a secret: the handshake
    passes with the empty key); the status of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await greet(reader, writer, auth.ROLE_STATE, b"", me, source)
        writer.write(pack_request(key, revision, 0, n))
        answer = parse_response(await asyncio.wait_for(reader.readexactly(RESP.size), 5))
        assert answer is not None
        return answer[0]
    finally:
        writer.close()


async def test_the_state_server_serves_only_planned_fetchers_at_the_planned_revision(peers):
    """Finding: "the state server hands any entry to anyone while a sync is open (the
    requested revision is ignored)". While a real fetch is held open, an outsider and a
    fetcher asking for another revision get NOT_SERVING; the fetcher's own request is served."""
    a, b = await peers(2)
    n = 8192
    wa, wb = np.arange(n // 4, dtype=np.float32), np.zeros(n // 4, np.float32)
    sa, sb = pccl.SharedState({"w": wa}, revision=3), pccl.SharedState({"w": wb}, revision=0)
    server = testing.shared_state_sync(a).server
    real = server.lookup
    assert real is not None
    probes: dict[str, int] = {}

    async def lookup(peer: int, key: str, revision: int) -> memoryview | None:
        if peer == b.peer_id and not probes:  # b's real fetch: probe while it waits
            probes["outsider"] = await _request(server.port, 999, a.peer_id, "w", 3, n)
            probes["a itself"] = await _request(server.port, a.peer_id, a.peer_id, "w", 3, n)
            probes["old revision"] = await _request(server.port, b.peer_id, a.peer_id, "w", 2, n)
            probes["other key"] = await _request(server.port, b.peer_id, a.peer_id, "v", 3, n)
        return await real(peer, key, revision)

    server.lookup = lookup
    await asyncio.gather(a.sync_shared_state(sa), b.sync_shared_state(sb))
    assert probes == {"outsider": NOT_SERVING, "a itself": NOT_SERVING,
                      "old revision": NOT_SERVING, "other key": NOT_SERVING}
    np.testing.assert_array_equal(wb, wa)
    # outside a sync nothing is served, even to a member at the current revision
    assert await _request(server.port, b.peer_id, a.peer_id, "w", 3, n) == NOT_SERVING


async def test_a_flood_of_hellos_does_not_turn_a_readme_loop_into_topology_rounds(master, peers):
    """Finding: "a client that keeps sending Hellos cuts a README-style loop's throughput by
    99 %". 300 connections each say Hello and go, during 30 steps of the README's loop: no
    step is spent admitting them, and every step's all-reduce is exact."""
    comms = await peers(2)
    stop = asyncio.Event()

    async def flood() -> int:
        sent = 0
        while not stop.is_set() and sent < 300:
            _, w = await raw_master(master.port)
            w.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 1))))
            await w.drain()
            w.close()
            sent += 1
        return sent

    rounds = [0, 0]

    async def loop(i: int, c: pccl.Communicator) -> None:
        for step in range(30):
            if await c.are_peers_pending():
                rounds[i] += 1
                await c.update_topology()
            x = np.full(1024, float(i + 1 + step), np.float32)
            await c.all_reduce(x)
            assert (x == 3 + 2 * step).all()

    flooder = asyncio.ensure_future(flood())
    try:
        await asyncio.gather(*(loop(i, c) for i, c in enumerate(comms)))
    finally:
        stop.set()
        sent = await flooder
    assert sent > 0 and rounds == [0, 0], (sent, rounds)
    assert [c.world_size for c in comms] == [2, 2]


async def test_a_connection_that_only_heartbeats_is_expired():
    """Finding: "connections that only heartbeat and never say Hello are never expired"."""
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.1, hello_timeout=0.5) as mst:
        reader, writer = await raw_master(mst.port)
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def beat() -> None:
            while True:
                writer.write(frame(m.encode(m.Heartbeat())))
                await asyncio.sleep(0.1)  # the client's pace, not a synchronisation

        beating = asyncio.ensure_future(beat())
        try:
            while await asyncio.wait_for(reader.read(1 << 16), 5):
                pass  # master heartbeats, until the master closes the connection
        except ConnectionError:
            pass
        finally:
            beating.cancel()
            writer.close()
        assert 0.5 <= loop.time() - t0 < 3


@pytest.mark.parametrize("allow", [False, True])
async def test_advertise_host_must_be_the_connections_own_address(allow):
    """Finding: "the master trusts Hello.advertise_host, so a hostile joiner can point other
    peers' traffic at any host and port"."""
    async with pccl.Master("127.0.0.1", 0, allow_any_advertise_host=allow) as mst:
        c = pccl.Communicator(mst.address, advertise_host="127.0.0.2", **FAST)
        try:
            if allow:
                await c.connect(attempts=1)
                assert testing.control_plane(c).membership.ring[0].host == "127.0.0.2"
            else:
                with pytest.raises(pccl.MasterConnectionError, match="advertise_host"):
                    await c.connect(attempts=1)
        finally:
            await c.close()
        ok = await join_peers(mst, 1, advertise_host="127.0.0.1")  # its own address is fine
        await ok[0].close()


async def test_a_client_that_does_not_read_is_closed_before_the_master_grows(master):
    """Found by the socket fuzz's probe: a joiner that sends WithdrawVotes and never reads
    made the master queue every VoteWithdrawn (559 MiB in a minute). Now a connection with
    more than 1 MiB waiting to be sent is closed."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fill up sooner
    sock.connect(("127.0.0.1", master.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    await greet(reader, writer, auth.ROLE_MASTER, b"", 0, 0)
    writer.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 1))))
    batch = frame(m.encode(m.WithdrawVote("pending"))) * 10_000
    sent = 0
    with pytest.raises(ConnectionError):
        while sent < 150:  # 1.5 M frames: far more than the kernel buffers and the cap hold
            writer.write(batch)
            await asyncio.wait_for(writer.drain(), 10)
            sent += 1
    assert sent < 150
    assert master.state.accepted() == []  # and its peer record is gone
    writer.close()


def _hello(**kw: object) -> bytes:
    rejoin = kw.pop("rejoin", None)
    return frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 40000, rejoin=rejoin,
                                  **kw)))  # type: ignore[arg-type]


async def test_a_hello_claiming_an_id_past_63_bits_is_refused_and_others_still_join(master):
    """Finding: "one Hello(rejoin.ring=[2**64 - 1]) poisons the next id: every later peer is
    allocated 2**64, encode(Welcome) raises OverflowError and no peer can join that master
    again". Ids, terms and ring entries are bounded at decode: the frame is refused, the
    connection closed; peers still join, with ids that fit."""
    reader, writer = await raw_master(master.port)
    try:
        writer.write(_hello(rejoin=m.Rejoin(5, True, 1, 3, [5, 2**64 - 1], 0, 0)))
        assert await closed(reader)
    finally:
        writer.close()
    comms = await join_peers(master, 2)
    try:
        assert all(0 < c.peer_id < 2**63 for c in comms)
        await reduce_ok(comms)
    finally:
        await asyncio.gather(*(c.close() for c in comms))


async def test_a_members_higher_term_does_not_end_the_others_sessions(master):
    """Finding: "one Hello(term=T+1) makes the master step down, end every member's session
    and welcome the sender as the only member of a new run". A peer's word is no evidence of
    a newer master: the members keep their sessions and go on; the sender is refused (the
    master keeps its term: one taken on a peer's word could be 2**63 - 1)."""
    comms = await join_peers(master, 2)
    try:
        await reduce_ok(comms)  # the run is past its first moments
        reader, writer = await raw_master(master.port)
        writer.write(_hello(run_id=master.state.run_id, term=master.state.term + 1))
        term = master.state.term
        refused = m.decode_master_to_peer(await read_frame(reader, 1 << 16))
        assert isinstance(refused, m.Rejected) and "higher term" in refused.reason
        assert master.state.accepted() == sorted(c.peer_id for c in comms)
        assert master.state.term == term
        await reduce_ok(comms)  # nobody was superseded: the same group goes on
        writer.close()
    finally:
        await asyncio.gather(*(c.close() for c in comms))


async def test_a_member_with_another_element_count_is_kicked_and_the_others_go_on(master):
    """Finding: "a member with another element count (4,097 where the others use 4,096)
    makes every honest collective fail with InvalidUsageError, forever; it is never
    removed". The master kicks it (the reason in its error) and the others' all-reduce
    completes on the ring without it, exact."""
    a, b, c = await join_peers(master, 3)
    try:
        xs = [np.full(4096, 1.0, np.float32), np.full(4096, 2.0, np.float32),
              np.full(4097, 5.0, np.float32)]
        got = await asyncio.gather(*(p.all_reduce(x) for p, x in zip((a, b, c), xs)),
                                   return_exceptions=True)
        assert isinstance(got[2], pccl.KickedError), got
        assert "disagrees with every other member's" in str(got[2])
        assert [info.world_size for info in got[:2]] == [2, 2], got  # type: ignore[union-attr]
        assert all((x == 3.0).all() for x in xs[:2])
        assert master.state.accepted() == sorted([a.peer_id, b.peer_id])
        await reduce_ok([a, b])
    finally:
        await asyncio.gather(*(p.close() for p in (a, b, c)), return_exceptions=True)


async def test_a_member_that_votes_but_sends_no_data_is_kicked_on_the_first_stall(master):
    """Finding: "a member that votes but sends no data aborts every collective after
    data_timeout; the master knows the suspect and never removes it". Its successor, which
    got nothing of the attempt within the data timeout, names it; the master kicks it and
    the others' retry completes without it, within data_timeout + 2 s."""
    a, b, c = await join_peers(master, 3, data_timeout=1.0)
    try:
        async def never(peer_id: int) -> object:
            await asyncio.Event().wait()  # its run task never gets a link: it sends nothing
            raise AssertionError

        testing.data_plane(c).link = never  # type: ignore[method-assign]
        xs = [np.full(1 << 16, i + 1.0, np.float32) for i in range(3)]
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def honest(p: pccl.Communicator, x: np.ndarray) -> pccl.ReduceInfo:
            while True:
                try:
                    return await p.all_reduce(x)
                except pccl.PeerLostError:
                    continue  # aborted by the kick: retried on the survivors

        got = await asyncio.gather(honest(a, xs[0]), honest(b, xs[1]), c.all_reduce(xs[2]),
                                   return_exceptions=True)
        took = loop.time() - t0
        # (its own call may have been aborted before the kick came)
        assert isinstance(got[2], (pccl.KickedError, pccl.PeerLostError)), got
        assert [info.world_size for info in got[:2]] == [2, 2], got  # type: ignore[union-attr]
        assert all((x == 3.0).all() for x in xs[:2])
        assert took < 1.0 + 2.0, took
        assert master.state.accepted() == sorted([a.peer_id, b.peer_id])
        with pytest.raises(pccl.KickedError, match="sent no data of collective tag 0"):
            await c.all_reduce(xs[2])
    finally:
        await asyncio.gather(*(p.close() for p in (a, b, c)), return_exceptions=True)
