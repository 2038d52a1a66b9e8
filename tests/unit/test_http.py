"""``pccl_aio._net.http.HttpServer``: GET and HEAD of its routes, typed refusals of anything
else, and a closed connection for an oversized, slow or surplus client; a failing route is a
500, and the server goes on serving."""

from __future__ import annotations

import asyncio

import pytest

from pccl_aio._net.http import HttpServer, Limits, client_key, request_host

pytestmark = pytest.mark.timeout(30)


def boom() -> tuple[str, bytes]:
    raise RuntimeError("a bug in a route")


@pytest.fixture
async def server():
    s = HttpServer({"/": lambda: ("text/html", b"<p>hi</p>"), "/boom": boom},
                   limits=Limits(max_clients=2, timeout=0.5))
    await s.start()
    yield s
    await s.close()


async def ask(s: HttpServer, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    writer.write(raw)
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


async def test_get_head_and_refusals(server):
    ok = await ask(server, b"GET /?refresh=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n") and ok.endswith(b"\r\n\r\n<p>hi</p>")
    assert b"Content-Length: 9\r\n" in ok and b"Content-Type: text/html\r\n" in ok
    head = await ask(server, b"HEAD / HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
    assert b"Content-Length: 9\r\n" in head
    assert (await ask(server, b"GET /nope HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
    post = await ask(server, b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert post.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in post
    assert (await ask(server, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
    assert (await ask(server, b"GET / SPDY/3\r\n\r\n")).startswith(b"HTTP/1.1 400")


async def test_a_failing_route_is_a_500_and_the_server_goes_on(server, caplog):
    assert (await ask(server, b"GET /boom HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 500")
    assert "a bug in a route" in caplog.text
    assert (await ask(server, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200")


async def test_oversized_slow_and_surplus_clients_are_closed(server):
    assert await ask(server, b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n") == b""
    slow = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    for _, w in slow:
        w.write(b"GET / HTTP/1.1\r\n")  # and never the end of the headers
    surplus = await ask(server, b"GET / HTTP/1.1\r\n\r\n")  # beyond max_clients: shed
    for r, w in slow:  # the slow ones time out (0.5 s): closed without an answer
        assert await asyncio.wait_for(r.read(), 5) == b""
        w.close()
    assert surplus == b""
    assert (await ask(server, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200")


async def test_close_cancels_requests_being_served():
    s = HttpServer({"/": lambda: ("text/plain", b"x")}, limits=Limits(timeout=30))
    await s.start()
    r, w = await asyncio.open_connection("127.0.0.1", s.port)
    w.write(b"GET / HTTP/1.1\r\n")
    await asyncio.wait_for(s.close(), 5)  # does not wait out the slow client
    assert await asyncio.wait_for(r.read(), 5) == b""
    w.close()


async def test_a_missing_path_with_a_hint_answers_404_with_the_hint():
    s = HttpServer({"/": lambda: ("text/plain", b"x")}, missing={"/metrics": "look elsewhere"})
    await s.start()
    try:
        hinted = await ask(s, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert hinted.startswith(b"HTTP/1.1 404") and hinted.endswith(b"\r\n\r\nlook elsewhere\n")
        plain = await ask(s, b"GET /other HTTP/1.1\r\n\r\n")
        assert plain.startswith(b"HTTP/1.1 404") and plain.endswith(b"\r\n\r\nnot found\n")
    finally:
        await s.close()


@pytest.mark.parametrize(("header", "host"), [
    (b"Host: example.org:8080\r\n", b"example.org"),
    (b"host: 10.1.2.3\r\n", b"10.1.2.3"),
    (b"Host: [::1]:8080\r\n", b"[::1]"),
    (b"Host: <script>:80\r\n", b""),  # not a host: nothing
    (b"", b""),
])
async def test_a_route_reads_the_host_its_request_was_sent_to(header, host):
    s = HttpServer({"/": lambda: ("text/plain", request_host().encode() or b"-")})
    await s.start()
    try:
        answer = await ask(s, b"GET / HTTP/1.1\r\n" + header + b"\r\n")
        assert answer.endswith(b"\r\n\r\n" + (host or b"-")), answer
        assert request_host() == ""  # outside a request
    finally:
        await s.close()


async def test_stalled_clients_from_one_address_do_not_lock_the_page():
    """Finding: "32 stalled HTTP clients lock the status and metrics ports for the 10 s
    timeout". One address holds at most ``per_address`` connections, and a head must come
    within ``head_timeout``: a client from another address is answered at once, and the
    stalled ones are closed after the head timeout, not the whole timeout."""
    s = HttpServer({"/": lambda: ("text/plain", b"ok")})  # the defaults: 32, 4 per address
    await s.start()
    loop = asyncio.get_running_loop()
    try:
        stalled = [await asyncio.open_connection("127.0.0.1", s.port) for _ in range(32)]
        for _, w in stalled:
            w.write(b"GET / HTTP/1.1\r\n")  # and never the end of the head
        t0 = loop.time()
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port,
                                                       local_addr=("127.0.0.2", 0))
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 5)).endswith(b"\r\n\r\nok")
        assert loop.time() - t0 < 1.0
        writer.close()
        for r, w in stalled:  # shed at once (beyond 4), or closed at the 2 s head timeout
            assert await asyncio.wait_for(r.read(), 5) == b""
            w.close()
        assert loop.time() - t0 < 4.0
    finally:
        await s.close()


async def stall(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection from ``source`` (an address of 127/8, all of which Linux routes to lo)
    that sends the start of a request head and never its end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(b"GET / HTTP/1.1\r\n")
    return reader, writer


async def test_a_new_address_takes_a_slot_of_the_busiest_when_all_are_held():
    """Issue 45: 32 stalled connections from 8 addresses held every slot, and a client from
    a ninth was shed until they timed out (and again, if they reconnected). With every slot
    held, the newcomer takes the oldest slot of the address holding the most: it is answered
    at once, and exactly that connection is closed."""
    s = HttpServer({"/": lambda: ("text/plain", b"ok")}, limits=Limits(head_timeout=30))
    await s.start()
    loop = asyncio.get_running_loop()
    try:
        stalled = [await stall(s.port, f"127.0.0.{2 + i // 4}") for i in range(32)]
        extra = await stall(s.port, "127.0.0.2")  # the 5th of its address: shed at once
        assert await closed_within(extra[0], 5)
        for i in range(3):  # each newcomer takes the oldest slot of a busiest address
            t0 = loop.time()
            reader, writer = await asyncio.open_connection("127.0.0.1", s.port,
                                                           local_addr=("127.0.0.100", 0))
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 5)).endswith(b"\r\n\r\nok")
            assert loop.time() - t0 < 1.0
            writer.close()
            # its slot, free again, is taken by a staller from a fresh address: all held
            stalled.append(await stall(s.port, f"127.0.0.{20 + i}"))
        assert s.stats == {"shed": 1, "evicted": 3, "stalled": 0}, s.stats
        # the oldest of the busiest addresses went: 127.0.0.2's first, then (127.0.0.2
        # holding three) 127.0.0.3's first, then 127.0.0.4's; the others are still held
        gone = await asyncio.gather(*(closed_within(r, 0.3) for r, _ in stalled))
        assert [i for i, g in enumerate(gone) if g] == [0, 4, 8]
        for _, w in [*stalled, extra]:
            w.close()
    finally:
        await s.close()


async def closed_within(r: asyncio.StreamReader, seconds: float) -> bool:
    """True if the server closed the connection within ``seconds`` (False: still open)."""
    try:
        return await asyncio.wait_for(r.read(), seconds) == b""
    except ConnectionResetError:
        return True  # closed with the start of the head unread
    except TimeoutError:
        return False


async def test_the_head_deadline_is_not_extended_by_trickled_bytes():
    """A client that sends its head a byte every 50 ms is closed at the head deadline from
    its arrival (0.5 s here), not 0.5 s after its last byte."""
    s = HttpServer({"/": lambda: ("text/plain", b"ok")}, limits=Limits(head_timeout=0.5))
    await s.start()
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        t0 = loop.time()
        head = b"GET / HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 1000

        async def trickle() -> None:
            for byte in head:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)  # the client's pace, not a synchronisation

        sender = asyncio.ensure_future(trickle())
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert 0.4 < loop.time() - t0 < 1.0
        sender.cancel()
        writer.close()
        assert s.stats["stalled"] == 1
    finally:
        await s.close()


@pytest.mark.parametrize(("address", "key"), [
    ("10.1.2.3", "10.1.2.3"),
    ("::ffff:10.1.2.3", "10.1.2.3"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("?", "?"),
])
def test_a_client_counts_against_its_address_or_its_ipv6_64(address, key):
    assert client_key(address) == key


@pytest.mark.parametrize("bad", [Limits(max_clients=0), Limits(per_address=True),
                                 Limits(head_timeout=0), Limits(timeout=float("inf"))])
def test_limits_that_are_not_positive_are_refused(bad):
    with pytest.raises(ValueError, match="must be a positive"):
        HttpServer({}, limits=bad)
