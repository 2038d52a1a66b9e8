"""A master process's memory stays bounded under partial control frames: frames above
64 KiB share one 32 MiB budget (and before ``Hello`` no frame may exceed 64 KiB). Issue 17
found 48 connections each holding a 16 MiB partial frame growing the master by 958 MiB."""

from __future__ import annotations

import asyncio
import contextlib
import struct

from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import frame
from tests.helpers import raw_master, rss
from tests.process.procs import HERE, spawn

FRAME = 16 << 20


async def _hold_partial_frame(port: int, hello: bool) -> asyncio.StreamWriter:
    """A client (no secret needed: the run has none) that announces a 16 MiB frame and sends
    all of it but its last byte."""
    _, writer = await raw_master(port)
    if hello:
        writer.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 1))))
    writer.write(struct.pack(">I", FRAME))
    chunk = bytes(1 << 20)
    with contextlib.suppress(ConnectionError):
        for i in range(16):
            writer.write(chunk if i < 15 else chunk[:-1])
            await asyncio.wait_for(writer.drain(), 10)
    return writer


async def test_48_partial_16_mib_frames_grow_the_master_by_less_than_64_mib(procs):
    master = await spawn("master", str(HERE / "masterproc.py"), "30")
    procs.append(master)
    port = int(await master.line())
    _, probe = await raw_master(port)  # warm up the master's code paths
    probe.close()
    before = rss(master.proc.pid)
    writers = [await _hold_partial_frame(port, hello=i % 2 == 1) for i in range(48)]
    grown = rss(master.proc.pid) - before
    for w in writers:
        w.close()
    assert grown < 64 << 20, f"master grew by {grown >> 20} MiB"
    # and it still serves: a fresh client completes the handshake
    _, w = await raw_master(port)
    w.close()
