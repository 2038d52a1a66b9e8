"""``python -m pccl_aio.master``: logs where it listens, serves, shuts down on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import numpy as np
import pytest

import pccl_aio as pccl
from tests.process.procs import HERE


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_master_cli_serves_and_stops_cleanly(sig):
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0",
        "--log-level", "INFO", stderr=asyncio.subprocess.PIPE, env=env)
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", line).group(1))
        kw = {"heartbeat_interval": 0.2}
        async with pccl.Communicator(f"127.0.0.1:{port}", **kw) as a, \
                pccl.Communicator(f"127.0.0.1:{port}", **kw) as b:
            await a.connect()
            joining = asyncio.ensure_future(b.connect())
            while not await a.are_peers_pending():
                pass
            await a.update_topology()
            await joining
            xs = [np.ones(100, np.float32), np.ones(100, np.float32)]
            await asyncio.gather(a.all_reduce(xs[0]), b.all_reduce(xs[1]))
            assert (xs[0] == 2).all()
            proc.send_signal(sig)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            with pytest.raises(pccl.MasterConnectionError):
                await a.are_peers_pending()
        rest = (await proc.stderr.read()).decode()
        assert "shutting down" in rest
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
