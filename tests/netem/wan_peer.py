"""A master or a peer of ``test_wan_connections.py``, run inside a network namespace.

    python wan_peer.py master HOST          # prints the master's port, serves until killed
    python wan_peer.py peer MASTER HOST K   # K: an int or auto; prints one JSON line
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np

import pccl_aio as pccl
from pccl_aio._peer import testing


async def master(host: str) -> None:
    async with pccl.Master(host, 0, heartbeat_interval=0.5, heartbeat_timeout=10.0,
                           admission_interval=0.0) as m:
        print(m.port, flush=True)
        await asyncio.Event().wait()


async def peer(addr: str, host: str, k: str) -> None:
    conns = None if k == "auto" else int(k)
    async with pccl.Communicator(addr, p2p_connections=conns, listen_host=host,
                                 heartbeat_timeout=10.0, data_timeout=30.0) as comm:
        await comm.connect(attempts=50)
        while comm.peer_group_world_size < 2:
            await comm.update_topology()
        x = np.full(1 << 18, 1.0, np.float32)
        await comm.all_reduce(x)
        assert float(x[0]) == float(x[-1]) == 2.0
        report = {"k": testing.data_plane(comm).link_connections(),
                  "rtt": [lk.rtt for lk in testing.data_plane(comm).links.values()]}
        await comm.all_reduce(x)  # a barrier: neither leaves (closing the other's link) before
        print(json.dumps(report), flush=True)  # both took their report


if __name__ == "__main__":
    if sys.argv[1] == "master":
        pccl.run(master(sys.argv[2]))
    else:
        pccl.run(peer(sys.argv[2], sys.argv[3], sys.argv[4]))
