"""Issue 17: only the run's members get in. Run secret, pair keys, TLS, and the listeners'
gate, each against a real master and real peers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import ssl

import numpy as np
import pytest
import trustme

import pccl_aio as pccl
from pccl_aio._net.handshake import HandshakeError, greet
from pccl_aio._peer import testing
from pccl_aio._wire import auth
from tests.helpers import FAST, OTHER_SECRET, SECRET, join_peers, raw_master


@pytest.fixture
async def secret_master():
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                           secret=SECRET) as m:
        yield m


async def _exact(comms: list[pccl.Communicator], n: int = 4096) -> None:
    """One SUM all-reduce on every peer; every result is the exact expected sum."""
    xs = [np.arange(n, dtype=np.float32) * (i + 1) for i in range(len(comms))]
    outs = [np.empty_like(x) for x in xs]
    await asyncio.gather(*(c.all_reduce(x, o) for c, x, o in zip(comms, xs, outs)))
    want = np.arange(n, dtype=np.float32) * sum(range(1, len(comms) + 1))
    for o in outs:
        np.testing.assert_array_equal(o, want)


async def _attempt(port: int, role: int, key: bytes, client: int, server: int) -> int:
    """An attacker's handshake with ``key``, proof sent whatever the server proved: the
    status of the server's refusal or verdict. Returns once the server closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        opening = auth.open_message(role, client, server)
        writer.write(opening)
        status, nonce = auth.parse_challenge(await reader.readexactly(auth.CHALLENGE.size))
        if status == auth.OK:
            writer.write(auth.proof(key, opening, nonce))
            status, _ = auth.check_verdict(key, opening, nonce,
                                           await reader.readexactly(auth.VERDICT.size))
        if status != auth.OK:
            assert await asyncio.wait_for(reader.read(), 2) == b""  # and closed
        return status
    finally:
        writer.close()


async def test_members_with_the_secret_reduce_exactly_and_sync(secret_master):
    comms = await join_peers(secret_master, 3, secret=SECRET)
    try:
        await _exact(comms)
        ws = [np.full(1000, float(i), np.float32) for i in range(3)]
        states = [pccl.SharedState({"w": w}, revision=1 if i == 0 else 0)
                  for i, w in enumerate(ws)]
        infos = await asyncio.gather(*(c.sync_shared_state(s) for c, s in zip(comms, states)))
        assert [i.revision for i in infos] == [1, 1, 1]
        for w in ws:
            np.testing.assert_array_equal(w, np.zeros(1000, np.float32))
    finally:
        await asyncio.gather(*(c.close() for c in comms))


@pytest.mark.parametrize("secret", [None, OTHER_SECRET])
async def test_a_peer_without_the_secret_cannot_join(secret_master, secret):
    comms = await join_peers(secret_master, 2, secret=SECRET)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with pccl.Communicator(secret_master.address, secret=secret or b"", **FAST) as rogue:
            with pytest.raises(pccl.AuthenticationError, match="refused"):
                await rogue.connect(attempts=1)
        assert loop.time() - t0 < 1.0
        assert secret_master.gate.stats["refused"] == 1
        assert secret_master.state.accepted() == [c.peer_id for c in comms]
        await _exact(comms)
    finally:
        await asyncio.gather(*(c.close() for c in comms))


@pytest.mark.parametrize(("secret", "told", "logged"), [
    (None, "the master requires a run secret and this peer has none",
     "the peer has no run secret (this master requires one)"),
    (OTHER_SECRET, "the run secrets differ",
     "the peer's run secret differs from this master's (or a replayed handshake)"),
])
async def test_a_refused_peer_is_told_what_to_fix_and_the_master_logs_which(
        secret_master, caplog, secret, told, logged):
    caplog.set_level(logging.WARNING, "pccl_aio.security")
    async with pccl.Communicator(secret_master.address, secret=secret or b"", **FAST) as rogue:
        with pytest.raises(pccl.AuthenticationError) as err:
            await rogue.connect(attempts=1)
    text = str(err.value)
    assert told in text, text
    for how in ("Communicator(secret=...)", "$PCCL_AIO_SECRET_FILE", "$PCCL_AIO_SECRET"):
        assert how in text, text
    assert SECRET not in text and (secret is None or secret not in text)
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].endswith(logged), refusals
    assert SECRET not in caplog.text and (secret is None or secret not in caplog.text)
    assert secret_master.gate.stats["refused"] == 1


async def test_a_peer_with_a_secret_is_told_the_master_runs_without_one(master, caplog):
    caplog.set_level(logging.WARNING, "pccl_aio.security")
    async with pccl.Communicator(master.address, secret=SECRET, **FAST) as c:
        with pytest.raises(pccl.AuthenticationError) as err:
            await c.connect(attempts=1)
    assert "could not prove the run secret: it runs without one and this peer has one" \
        in str(err.value), err.value
    assert "the peer has a run secret, and this master has none" in caplog.text


async def test_a_master_without_the_secret_is_refused_by_the_peer(master):
    """The peer checks the master too: a master that cannot prove the secret is an impostor."""
    async with pccl.Communicator(master.address, secret=SECRET, **FAST) as c:
        with pytest.raises(pccl.AuthenticationError, match="could not prove"):
            await c.connect(attempts=1)


async def test_a_replayed_handshake_is_refused(secret_master):
    """Record an honest client's OPEN and PROOF, replay them on a new connection: the
    master's fresh nonce makes the old proof worthless."""
    key = auth.secret_key(SECRET)
    reader, writer = await asyncio.open_connection("127.0.0.1", secret_master.port)
    opening = auth.open_message(auth.ROLE_MASTER, 0, 0)
    writer.write(opening)
    status, nonce = auth.parse_challenge(await reader.readexactly(auth.CHALLENGE.size))
    assert status == auth.OK
    proof = auth.proof(key, opening, nonce)
    writer.write(proof)
    verdict = await reader.readexactly(auth.VERDICT.size)
    assert auth.check_verdict(key, opening, nonce, verdict) == (auth.OK, "")
    writer.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", secret_master.port)
    writer.write(opening)
    status, nonce = auth.parse_challenge(await reader.readexactly(auth.CHALLENGE.size))
    assert status == auth.OK
    writer.write(proof)
    verdict = await reader.readexactly(auth.VERDICT.size)
    assert auth.check_verdict(key, opening, nonce, verdict) == (auth.REFUSED, auth.DIFFER)
    assert await asyncio.wait_for(reader.read(), 2) == b""  # closed
    writer.close()
    assert secret_master.gate.stats["refused"] == 1


async def test_outsiders_cannot_reach_data_or_state_listeners(secret_master):
    """Without a pair key, neither the data listener nor the state server answers a byte
    beyond the refusal, and the group's results stay exact."""
    comms = await join_peers(secret_master, 2, secret=SECRET)
    try:
        b = comms[1]
        for role, port in ((auth.ROLE_DATA, testing.data_plane(b).listener.port),
                           (auth.ROLE_STATE, testing.shared_state_sync(b).server.port)):
            for key in (b"", auth.secret_key(SECRET)):  # nothing, or even the run secret
                assert await _attempt(port, role, key, comms[0].peer_id, b.peer_id) == auth.REFUSED
            # a peer id that is not a member is refused before any proof
            assert await _attempt(port, role, b"", 999, b.peer_id) == auth.UNKNOWN_PEER
        assert b.gate.stats["refused"] == 6
        await _exact(comms)
    finally:
        await asyncio.gather(*(c.close() for c in comms))


async def test_a_member_cannot_pose_as_another_members_ring_neighbour(secret_master):
    """c holds pair keys with a and b, but not a's key with b: claiming to be a (b's ring
    predecessor) fails the handshake, whichever of its own keys it presents."""
    a, b, c = comms = await join_peers(secret_master, 3, secret=SECRET)
    try:
        ring = testing.control_plane(b).membership.ring
        assert [p.peer_id for p in ring] == [a.peer_id, b.peer_id, c.peer_id]
        for key in (testing.pair_key(c, b.peer_id), testing.pair_key(c, a.peer_id)):
            for role, port in ((auth.ROLE_DATA, testing.data_plane(b).listener.port),
                               (auth.ROLE_STATE, testing.shared_state_sync(b).server.port)):
                assert await _attempt(port, role, key, a.peer_id, b.peer_id) == auth.REFUSED
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", testing.data_plane(b).listener.port)
            with pytest.raises(HandshakeError, match="secrets differ"):  # the library's client
                await greet(reader, writer, auth.ROLE_DATA, key, a.peer_id, b.peer_id)
            writer.close()
        assert b.gate.stats["refused"] >= 4
        await _exact(comms)
    finally:
        await asyncio.gather(*(c.close() for c in comms))


async def test_slow_and_held_connections_do_not_stall_master_or_listener(secret_master):
    """500 connections held open (half of them stalled mid-OPEN) on the master and on a
    peer's data listener: the group keeps reducing exactly, and a new peer still joins."""
    comms = await join_peers(secret_master, 2, secret=SECRET)
    held: list[asyncio.StreamWriter] = []
    try:
        for port in (secret_master.port, testing.data_plane(comms[1]).listener.port):
            for i in range(250):
                _, w = await asyncio.open_connection("127.0.0.1", port)
                if i % 2:
                    w.write(auth.open_message(auth.ROLE_MASTER, 0, 0)[:20])  # half an OPEN
                held.append(w)
        await _exact(comms)
        comms += await join_peers_into(secret_master, comms)
        await _exact(comms)
        assert secret_master.gate.stats["evicted"] >= 250 - secret_master.gate.max_pending
    finally:
        for w in held:
            w.close()
        await asyncio.gather(*(c.close() for c in comms))


async def join_peers_into(master: pccl.Master, accepted: list[pccl.Communicator]
                          ) -> list[pccl.Communicator]:
    from tests.helpers import admit

    joiner = pccl.Communicator(master.address, secret=SECRET, **FAST)
    await admit(accepted, joiner)
    return [joiner]


async def test_a_half_sent_open_is_dropped_at_the_handshake_deadline():
    async with pccl.Master("127.0.0.1", 0, secret=SECRET, handshake_timeout=0.3) as m:
        reader, writer = await asyncio.open_connection("127.0.0.1", m.port)
        writer.write(b"PCH1")
        assert await asyncio.wait_for(reader.read(), 3) == b""
        writer.close()
        assert m.gate.stats["timed_out"] == 1


async def test_without_a_secret_anyone_still_joins(master):
    """A run without a secret behaves as before: a raw client completes the (empty-key)
    handshake and speaks the control protocol."""
    _, writer = await raw_master(master.port)
    writer.close()
    assert master.gate.stats == {"accepted": 1, "refused": 0, "timed_out": 0, "evicted": 0}


# ---- TLS -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _contexts(ca: trustme.CA) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    for ctx in (server, client):
        cert.configure_cert(ctx)
        ca.configure_trust(ctx)
    server.verify_mode = ssl.CERT_REQUIRED  # mutual TLS
    return server, client


async def test_tls_master_and_data_plane_give_exact_results(ca):
    server, client = _contexts(ca)
    async with pccl.Master("127.0.0.1", 0, secret=SECRET, ssl=server, heartbeat_interval=0.2,
                           heartbeat_timeout=2.0) as m:
        comms = await join_peers(m, 3, secret=SECRET, ssl=client, ssl_server=server)
        try:
            for c in comms:
                assert testing.control_plane(c).writer.get_extra_info("ssl_object") is not None
            await _exact(comms, 1 << 20)
            for c in comms:  # the data links are TLS too
                for link in testing.data_plane(c).links.values():
                    assert all(s.transport.get_extra_info("ssl_object") is not None
                               for s in link.senders)
            states = [pccl.SharedState({"w": np.full(1 << 16, float(i), np.float32)},
                                       revision=1 if i == 0 else 0) for i in range(3)]
            infos = await asyncio.gather(*(c.sync_shared_state(s) for c, s in zip(comms, states)))
            assert infos[1].rx_bytes == 1 << 18 and all(i.revision == 1 for i in infos)
        finally:
            await asyncio.gather(*(c.close() for c in comms))


async def test_tls_mismatches_fail_with_a_typed_error_within_a_second(ca):
    server, client = _contexts(ca)
    other_server, other_client = _contexts(trustme.CA())  # another CA
    loop = asyncio.get_running_loop()
    cases = [  # (master's context, peer's context)
        (server, None),  # a plain peer against a TLS master
        (None, client),  # a TLS peer against a plain master
        (server, other_client),  # the peer does not trust the master's CA
        (other_server, client),
    ]
    for master_ctx, peer_ctx in cases:
        async with (pccl.Master("127.0.0.1", 0, ssl=master_ctx) as m,
                    pccl.Communicator(m.address, ssl=peer_ctx, **FAST) as c):
            t0 = loop.time()
            with pytest.raises(pccl.AuthenticationError):
                await c.connect(attempts=1)
            assert loop.time() - t0 < 1.0, (master_ctx, peer_ctx)


async def test_a_master_gone_mid_handshake_is_tried_again_and_tls_on_one_side_is_not(ca):
    """A master that hangs up mid-handshake (killed at that moment) is not taken for a
    refusal: ``connect`` tries again and joins the master started next on that port. A
    plain peer against a TLS master, which also hangs up, still fails with
    ``AuthenticationError``, after two more tries (``dial.CLOSED_RETRIES``)."""
    hung_up = asyncio.Event()

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the peer's opening: the handshake has begun
        writer.transport.abort()  # as a master SIGKILLed now would
        hung_up.set()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with pccl.Communicator(f"127.0.0.1:{port}", **FAST) as c:
        joining = asyncio.ensure_future(c.connect(attempts=30, backoff=0.05))
        await asyncio.wait_for(hung_up.wait(), 10)
        server.close()
        await server.wait_closed()
        async with pccl.Master("127.0.0.1", port):
            await asyncio.wait_for(joining, 10)
            assert c.world_size == 1
    server_ctx, _ = _contexts(ca)
    loop = asyncio.get_running_loop()
    async with (pccl.Master("127.0.0.1", 0, ssl=server_ctx) as m,
                pccl.Communicator(m.address, **FAST) as c):
        t0 = loop.time()
        with pytest.raises(pccl.AuthenticationError, match="closed the connection") as caught:
            await c.connect(attempts=10, backoff=0.05)
        assert loop.time() - t0 < 2.0
        assert type(caught.value) is pccl.AuthenticationError  # the public type, as before


def test_tls_contexts_from_files(ca, tmp_path):
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server, client = pccl.tls_contexts(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"),
                                       str(tmp_path / "ca.pem"))
    assert server.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    with pytest.raises(pccl.InvalidUsageError, match="cannot load"):
        pccl.tls_contexts(str(tmp_path / "missing.pem"), str(tmp_path / "key.pem"))


async def test_peers_with_and_without_tls_between_them_cannot_be_mixed(ca):
    """A peer whose listeners speak TLS and one whose do not could never connect: the second
    is refused at its Hello with the reason, instead of failing every collective."""
    server, client = _contexts(ca)
    async with pccl.Master("127.0.0.1", 0, ssl=server) as m:
        first = await join_peers(m, 1, ssl=client, ssl_server=server)
        try:
            async with pccl.Communicator(m.address, ssl=client, **FAST) as c:
                with pytest.raises(pccl.MasterConnectionError, match="use TLS between them"):
                    await c.connect(attempts=1)
        finally:
            await first[0].close()


async def test_a_member_holds_at_most_16_connections_to_a_state_server(secret_master):
    from pccl_aio._peer.state.transfer import MAX_PER_PEER
    from tests.helpers import closed

    a, b = comms = await join_peers(secret_master, 2, secret=SECRET)
    held = []
    try:
        port = testing.shared_state_sync(b).server.port
        for _ in range(MAX_PER_PEER):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            await greet(r, w, auth.ROLE_STATE, testing.pair_key(a, b.peer_id), a.peer_id,
                        b.peer_id)
            held.append(w)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        await greet(r, w, auth.ROLE_STATE, testing.pair_key(a, b.peer_id), a.peer_id,
                    b.peer_id)
        held.append(w)
        assert await closed(r)  # one too many
        assert testing.shared_state_sync(b).server.connections(a.peer_id) == MAX_PER_PEER
        await _exact(comms)
    finally:
        for w in held:
            w.close()
        await asyncio.gather(*(c.close() for c in comms))
