"""Issue 45: stalled HTTP clients do not lock the master's status page. A master process
(``python -m pccl_aio.master --status-port 0``) and a process of 200 stalled connections from
20 addresses (``staller.py``: each trickles its head and reconnects the moment it is closed);
a fresh client is answered within 1 s throughout, across several of the stallers' reconnects.
The ``--http-*`` options set the limits (a second master with small ones)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.process.procs import HERE, Proc, spawn
from tests.process.test_observability import MasterCli
from tests.process.test_security_cli import cli_master

pytestmark = pytest.mark.timeout(60)

ADDRESSES, PER_ADDRESS = 20, 10  # 200 stalled connections
HEAD_TIMEOUT = 2.0  # the master's default: the stallers it holds are closed after 2 s
SECONDS = 5.0  # fresh requests are made this long, over two reconnects of the stallers


async def cli_status_page(procs: list[Proc], *args: str) -> tuple[MasterCli, int]:
    """A ``python -m pccl_aio.master`` process with a status page (and ``args``), and the
    page's port."""
    master, _ = await cli_master(procs, "--status-port", "0", *args)
    port = int((await master.wait(r"status page on http://127\.0\.0\.1:(\d+)/")).group(1))
    return master, port


async def get(port: int, source: str = "127.0.0.1") -> bytes:
    """``GET /status.json`` from ``source``: the whole answer (b"": closed unanswered, or
    reset: closed with the request unread)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(b"GET /status.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def test_200_stalled_connections_from_20_addresses_do_not_lock_the_page(procs):
    master, port = await cli_status_page(procs)  # the default limits
    stallers = await spawn("stallers", str(HERE / "staller.py"), str(port), str(ADDRESSES),
                           str(PER_ADDRESS), stdin=True)
    procs.append(stallers)
    assert await stallers.line(30) == "ready"
    loop = asyncio.get_running_loop()
    waits: list[float] = []
    t_end = loop.time() + SECONDS
    while loop.time() < t_end:
        t0 = loop.time()
        answer = await get(port)
        waits.append(loop.time() - t0)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), (len(waits), answer[:100])
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["world_size"] == 0
        await asyncio.sleep(0.1)  # the next fresh client a little later
    assert stallers.proc.stdin is not None
    stallers.proc.stdin.close()
    stats = json.loads(await stallers.line(30))
    assert max(waits) < 1.0 and len(waits) >= 20, waits
    # the stallers kept at it: the master held some of them up to the head's deadline, none
    # past it (from its arrival: the trickled bytes do not extend it), and they reconnected
    assert HEAD_TIMEOUT - 0.2 < stats["longest"] < HEAD_TIMEOUT + 0.5, stats
    assert stats["opened"] >= 3 * ADDRESSES * PER_ADDRESS, stats
    print(f"{len(waits)} fresh requests answered in {min(waits):.4f}-{max(waits):.4f} s; "
          f"stallers: {stats}")
    master.close()


async def test_the_master_options_set_the_http_limits(procs):
    """``--http-max-clients 3 --http-per-address 2 --http-head-timeout 0.5``: a third
    connection from one address is closed at once; with 3 held, a fresh address takes the
    busiest address's oldest slot and is answered; the rest are closed at 0.5 s."""
    master, port = await cli_status_page(procs, "--http-max-clients", "3",
                                         "--http-per-address", "2", "--http-head-timeout", "0.5")
    loop = asyncio.get_running_loop()
    held = []
    for source in ("127.0.0.2", "127.0.0.2", "127.0.0.3"):
        held.append(await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)))
        held[-1][1].write(b"GET / HTTP/1.1\r\n")
    t0 = loop.time()
    assert await get(port, "127.0.0.2") == b""  # its address's third: shed
    assert (await get(port, "127.0.0.4")).startswith(b"HTTP/1.1 200 OK\r\n")
    assert await asyncio.wait_for(held[0][0].read(), 5) == b""  # evicted for it
    for reader, _ in held[1:]:  # the head's deadline
        assert await asyncio.wait_for(reader.read(), 5) == b""
    assert 0.3 < loop.time() - t0 < 1.5
    for _, writer in held:
        writer.close()
    master.close()
