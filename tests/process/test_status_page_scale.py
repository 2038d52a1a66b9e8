"""The status page of a large run stays readable, in a real browser: with 120 peers
(connections that complete the handshake and say ``Hello``; the first votes the others in)
the peers table shows 50 rows a page, ``?page=N`` pages through them with previous/next
links, and the ring of 120 is shown by its first and last members; ``status.json`` still
lists every peer and the whole ring."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

import pccl_aio as pccl
from pccl_aio._net.credentials import run_key
from pccl_aio._net.handshake import connect
from pccl_aio._wire import auth
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import HEADER_SIZE, body_length, frame
from tests.integration.test_status import get
from tests.process.test_observability import chromium, chromium_exe, text_of

pytestmark = pytest.mark.timeout(120)

PEERS = 120


class _Client(asyncio.Protocol):
    """A registered peer: it decodes what the master sends and keeps the types."""

    def __init__(self) -> None:
        self.welcomed = asyncio.get_running_loop().create_future()
        self.updated = asyncio.get_running_loop().create_future()  # TopologyUpdated
        self.transport: asyncio.Transport | None = None
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while len(self._buf) >= HEADER_SIZE:
            end = HEADER_SIZE + body_length(self._buf[:HEADER_SIZE])
            if len(self._buf) < end:
                return
            msg = m.decode_master_to_peer(self._buf[HEADER_SIZE:end])
            self._buf = self._buf[end:]
            done = {m.Welcome: self.welcomed, m.TopologyUpdated: self.updated}.get(type(msg))
            if done is not None and not done.done():
                done.set_result(None)


async def test_the_status_page_of_120_peers_pages_them_in_a_browser(tmp_path):
    chromium_exe()  # skipped (or, under CI=true, failed) if there is none
    async with pccl.Master("127.0.0.1", 0, status_port=0, max_pending_peers=PEERS) as master:
        host, port = master.address.rsplit(":", 1)
        clients = []
        for i in range(PEERS):  # one at a time: the first is the run's first member
            c = _Client()
            await asyncio.wait_for(connect(host, int(port), None, auth.ROLE_MASTER,
                                           run_key(None), 0, 0, c), 10)
            assert c.transport is not None
            c.transport.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 20000 + i))))
            await asyncio.wait_for(c.welcomed, 10)
            clients.append(c)
        assert clients[0].transport is not None  # the only member admits the others
        clients[0].transport.write(frame(m.encode(m.VoteUpdateTopology())))
        await asyncio.wait_for(clients[0].updated, 10)
        _, body = await get(master.status_address + "status.json")
        status = json.loads(body)
        assert len(status["peers"]) == PEERS and status["world_size"] == PEERS
        (ring,) = (g["ring"] for g in status["groups"])
        assert len(ring) == PEERS
        ids = [p["id"] for p in status["peers"]]

        async def page(n: int) -> str:
            return (await chromium(f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                                   f"{master.status_address}?page={n}")).decode()

        second, last = await page(2), await page(9)
        for c in clients:
            assert c.transport is not None
            c.transport.close()

    pager = text_of(second, "peers-pager")
    assert "peers 51\u2013100 of 120 · page 2 of 3" in pager and "← previous" in pager
    assert "next →" in pager
    rows = re.findall(r"\bpeer (\d+)\b", text_of(second, "peers"))
    assert [int(r) for r in rows] == ids[50:100]
    pager = text_of(last, "peers-pager")  # a page past the end shows the last one
    assert "peers 101\u2013120 of 120 · page 3 of 3" in pager and "next →" not in pager
    assert [int(r) for r in re.findall(r"\bpeer (\d+)\b", text_of(last, "peers"))] == ids[100:]
    assert "120 members, 0 waiting" in text_of(second, "peers-title")
    shown = text_of(second, "groups")  # 20 first, the count of the rest, 3 last, the first
    names = " → ".join(f"peer {c}" for c in ring[:20])
    assert f"{names} → … 97 more … → " in shown, shown
    assert shown.count("peer ") == 20 + 3 + 1 and f"peer {ring[-1]} → peer {ring[0]}" in shown
