"""The listeners' ``Gate`` over real loopback sockets: refusals counted, logged once each up
to a burst per window and then counted in one line; the oldest handshake in progress makes
room for a new connection."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pccl_aio._net.handshake import LOG_BURST, LOG_WINDOW, Gate
from pccl_aio._wire import auth
from tests.helpers import closed


async def _no_secret(opening: auth.Opening) -> bytes:
    return b""


async def _serve(gate: Gate) -> tuple[asyncio.Server, int]:
    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await gate.admit(reader, writer, _no_secret)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _garbage(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64))
    assert await closed(reader)
    writer.close()


async def test_a_flood_of_refusals_is_counted_but_logged_in_bursts(caplog: pytest.LogCaptureFixture
                                                                    ) -> None:
    gate = Gate("test gate")
    now = [1000.0]
    gate.clock = lambda: now[0]
    server, port = await _serve(gate)
    async with server:
        with caplog.at_level(logging.WARNING, logger="pccl_aio.security"):
            for _ in range(3 * LOG_BURST):
                await _garbage(port)
            lines = [r.getMessage() for r in caplog.records]
            assert gate.stats["refused"] == 3 * LOG_BURST
            assert len(lines) == LOG_BURST, lines
            assert all("refused a connection from 127.0.0.1:" in x for x in lines)
            now[0] += LOG_WINDOW
            await _garbage(port)
            lines = [r.getMessage() for r in caplog.records]
            assert f"test gate: refused {2 * LOG_BURST} more connections in 10 s" in lines
            assert len(lines) == LOG_BURST + 2


async def test_a_new_connection_evicts_the_oldest_stalled_handshake() -> None:
    gate = Gate("test gate", max_pending=2)
    server, port = await _serve(gate)
    async with server:
        stalled = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        third = await asyncio.open_connection("127.0.0.1", port)
        assert await closed(stalled[0][0])  # the oldest made room
        assert gate.stats["evicted"] == 1
        for _, w in (*stalled, third):
            w.close()
