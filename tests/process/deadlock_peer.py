"""A peer that makes a mismatched call, then a correct all-reduce; one JSON line per event.

Usage: python deadlock_peer.py MASTER_ADDR INDEX WORLD SCENARIO

Scenarios (what peer INDEX calls once the WORLD peers are in):
  tags   -- all_reduce with tag INDEX (every peer a different tag)
  votes  -- peer 0 are_peers_pending(), peer 1 sync_shared_state()
  never  -- peers 0 and 1 all_reduce(tag=0), peer 2 are_peers_pending(): it never launches
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import pccl_aio as pccl


def emit(**kw: object) -> None:
    print(json.dumps({"t": time.time(), **kw}), flush=True)


async def mismatched(comm: pccl.Communicator, index: int, scenario: str) -> None:
    x = np.ones(1024, np.float32)
    if scenario == "tags":
        await comm.all_reduce(x, tag=index)
    elif scenario == "votes":
        if index == 0:
            await comm.are_peers_pending()
        else:
            await comm.sync_shared_state(pccl.SharedState({"x": x}))
    elif index < 2:
        await comm.all_reduce(x, tag=0)
    else:
        await comm.are_peers_pending()


async def main() -> None:
    addr, index, world, scenario = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    async with pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0) as comm:
        await comm.connect(attempts=20)
        while comm.world_size < world:
            await comm.update_topology()
        # a joint vote as a barrier: everyone is in and idle before the mismatched calls
        await comm.are_peers_pending()
        emit(event="calling")
        try:
            await mismatched(comm, index, scenario)
            emit(event="returned")
        except pccl.PcclError as exc:
            emit(event="failed", kind=type(exc).__name__, error=str(exc))
        x = np.full(1000, index + 1, np.float32)
        info = await comm.all_reduce(x, tag=100)  # the communicator is still usable
        emit(event="reduced", ws=info.world_size, value=float(x[0]))


if __name__ == "__main__":
    pccl.run(main())
