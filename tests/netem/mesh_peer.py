"""A master or a peer inside a wan-mesh namespace, driven line by line on stdin; one JSON
event per line on stdout (``tests/netem`` and ``bench/topology.py``).

    python mesh_peer.py master HOST            -> {"event": "up", "port": P}
        stdin "links"                          -> {"event": "links",
                                                   "links": [[src, dst, bps, lat]...]}
    python mesh_peer.py peer MASTER HOST WORLD -> {"event": "joined", "id": I, "ring": [...]}
        (connects, then votes update_topology until the run has WORLD peers)
        stdin "admit N"                        -> {"event": "admitted", "ring": [...]}
        (waits until a joiner is pending, then votes until the run has N peers)
        stdin "reduce MIB ITERS [fresh] [ring]" -> {"event": "reduced", "times": [...]} (one
                                                  warm-up; tag 0, or with "fresh" a new tag
                                                  each time; "ring": small buffers round the
                                                  ring, not in log2 P rounds: every peer of
                                                  the run must be sent the same line)
        stdin "optimize"                       -> {"event": "optimized", "ring": [...],
                                                   "measured": M, "bottleneck_bps": B,
                                                   "membership": [...]}
        stdin "leave"                          -> {"event": "left"}, then exits
Any failure prints {"event": "error", "error": "..."} and exits 1.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import numpy as np

import pccl_aio as pccl
from pccl_aio._peer import testing
from pccl_aio._peer.data.core import bruck

LOGP_MIN_WORLD = bruck.LOGP_MIN_WORLD


def emit(event: str, **kw: object) -> None:
    print(json.dumps({"event": event, **kw}), flush=True)


async def command() -> list[str]:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return line.split() or ["leave"]  # EOF: the driver is gone


def ring(comm: pccl.Communicator) -> list[int]:
    ms = testing.control_plane(comm).membership
    return [p.peer_id for p in ms.ring] if ms else []


async def admit(comm: pccl.Communicator, world: int) -> None:
    while comm.world_size < world:  # every member loops alike: one joint vote per pass
        await comm.update_topology(timeout=60)


async def master(host: str) -> None:
    async with pccl.Master(host, 0, heartbeat_timeout=10.0) as m:
        emit("up", port=m.port)
        while (await command())[0] != "leave":
            links = [[a, b, bps, lat] for (a, b), (bps, lat) in sorted(m.state.links().items())]
            emit("links", links=links, ring=m.state.ring(0))


async def peer(addr: str, host: str, world: int) -> None:
    async with pccl.Communicator(addr, listen_host=host, data_timeout=60.0,
                                 heartbeat_timeout=10.0) as comm:
        await comm.connect(attempts=50, timeout=120)
        await admit(comm, world)
        emit("joined", id=comm.peer_id, ring=ring(comm))
        fresh_tags = 1000  # the next never-used tag (a tag's first run has no ticket)
        while True:
            cmd = await command()
            if cmd[0] == "admit":  # a joiner is on its way: wait until it registered
                while not await comm.are_peers_pending(timeout=60):
                    pass
                await admit(comm, int(cmd[1]))
                emit("admitted", ring=ring(comm))
            elif cmd[0] == "reduce":  # "reduce MIB ITERS [fresh] [ring]"
                x = np.empty(int(float(cmd[1]) * 2**20) // 4, np.float32)
                # the choice every peer makes alike (core/bruck.py), moved for the comparison
                bruck.LOGP_MIN_WORLD = 1 << 30 if "ring" in cmd else LOGP_MIN_WORLD
                times = []
                for i in range(int(cmd[2]) + 1):
                    x.fill(1.0)
                    tag = fresh_tags + i if "fresh" in cmd[3:] else 0  # fresh: no ticket
                    t0 = time.perf_counter()
                    await comm.all_reduce(x, tag=tag, timeout=120)
                    times.append(time.perf_counter() - t0)
                    assert float(x[0]) == float(x[-1]) == comm.peer_group_world_size, x[:4]
                emit("reduced", times=times[1:])
                fresh_tags += len(times)
            elif cmd[0] == "optimize":
                info = await comm.optimize_topology(timeout=60)
                emit("optimized", ring=list(info.ring), measured=info.measured,
                     bottleneck_bps=info.bottleneck_bps, membership=ring(comm))
            else:
                emit("left")
                return


def main() -> None:
    try:
        if sys.argv[1] == "master":
            pccl.run(master(sys.argv[2]))
        else:
            pccl.run(peer(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    except Exception as exc:
        emit("error", error=repr(exc))
        sys.exit(1)


if __name__ == "__main__":
    main()
