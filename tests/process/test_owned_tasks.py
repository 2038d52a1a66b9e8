"""Every task the library starts is owned and awaited: none is left after ``close()``,
also after a SIGKILLed neighbour and after a cancelled call."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import numpy as np
import pytest

import pccl_aio as pccl
from tests.helpers import FAST
from tests.process.procs import HERE, spawn

PKG = str(Path(pccl.__file__).parent)


def library_tasks() -> list[asyncio.Task[object]]:
    """Pending tasks whose coroutine is pccl_aio code."""
    out = []
    for t in asyncio.all_tasks():
        coro = t.get_coro()
        code = getattr(coro, "cr_code", None)
        if not t.done() and code is not None and code.co_filename.startswith(PKG):
            out.append(t)
    return out


@pytest.mark.timeout(30)
async def test_no_library_task_survives_close_after_a_sigkill_and_a_cancel(procs):
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=2.0) as master:
        comm = pccl.Communicator(master.address, **FAST)
        await comm.connect()
        other = await spawn("other", str(HERE / "reduce_forever.py"), master.address,
                            str(1 << 22))
        procs.append(other)
        while not await comm.are_peers_pending():  # a joint vote: the newcomer registered
            pass
        await comm.update_topology()
        assert await other.line() == "joined"
        x = np.ones(1 << 22, np.float32)
        await comm.all_reduce(x)  # a normal one first: links, receivers, run tasks exist
        # A cancelled call: the handle is cancelled while its data flows.
        handle = comm.all_reduce_async(x)
        assert await handle.started()
        assert handle.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handle
        assert (x == 2).all()  # restored to the last result
        # A SIGKILLed neighbour in the middle of a collective.
        handle = comm.all_reduce_async(x)
        assert await handle.started()
        other.signal(signal.SIGKILL)
        with pytest.raises(pccl.PeerLostError):
            await handle
        assert library_tasks() != []  # the master session is still running
        await comm.close()
        assert library_tasks() != []  # the master's own tasks
    assert library_tasks() == []
