"""Peers for the kill/replace memory script (``churn_memory.py``): the README's loop (a joint
vote, a shared-state sync and an all-reduce each step), default communicator options.

    python memory_peer.py survivor MASTER   # prints "step N" every 100 steps
    python memory_peer.py zygote MASTER     # each "fork N" line on stdin forks a new peer

A zygote imports the library once and forks a peer per request: it prints "forked PID"; the
child prints "reduced PID" after its N-th all-reduce and runs the loop until it is killed.

On each SIGUSR1 a survivor prints "snap PATH" (a reading). With ``$PCCL_TEST_TRACEMALLOC``
set to a folder it traces its allocations (``tracemalloc``, 16 frames) and PATH is a snapshot
dumped there (``PID-N.snap``; else "-"). With ``$PCCL_TEST_GARBAGE`` set it runs without the
garbage collector and, before each "snap", prints "garbage JSON": the types (the library's
with their module) and counts of the objects that reference cycles kept since the last
reading, which it then frees.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
import signal
import sys
import tracemalloc

import numpy as np

import pccl_aio as pccl

TRACE = os.environ.get("PCCL_TEST_TRACEMALLOC", "")
GARBAGE = os.environ.get("PCCL_TEST_GARBAGE", "")
ELEMS = int(os.environ.get("STATE_ELEMS", "4096"))  # float32 elements of the weights


def snapshot(count: list[int]) -> None:
    """A reading (SIGUSR1): the garbage found, and the tracemalloc snapshot, if asked for."""
    if GARBAGE:  # every cycle made since the last reading (the collector is off)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kinds = collections.Counter(_kind(o) for o in gc.garbage)
        gc.garbage.clear()
        gc.set_debug(0)
        print(f"garbage {json.dumps(kinds.most_common(25))}", flush=True)
    if not TRACE:
        print("snap -", flush=True)
        return
    count[0] += 1
    path = os.path.join(TRACE, f"{os.getpid()}-{count[0]}.snap")
    tracemalloc.take_snapshot().dump(path)
    print(f"snap {path}", flush=True)


def _kind(o: object) -> str:
    t = type(o)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__.startswith("pccl_aio") \
        else t.__qualname__


async def loop(addr: str, survivor: bool, life: int = 1) -> None:
    if survivor:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, snapshot, [0])
    weights = np.zeros(ELEMS, np.float32)
    target = np.full_like(weights, os.getpid() % 7)
    state = pccl.SharedState({"weights": weights})
    async with pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0) as comm:
        await comm.connect()
        step = 0
        while True:
            try:  # the same calls in the same order on every peer; a newcomer starts here
                if await comm.are_peers_pending():
                    await comm.update_topology()
                    continue
                if comm.peer_group_world_size < 2:
                    await comm.wait_for_peers(2)
                    continue
                await comm.sync_shared_state(state)
                grads = weights - target
                await comm.all_reduce(grads, op=pccl.ReduceOp.AVG)
            except (pccl.PeerLostError, pccl.TooFewPeersError, pccl.SharedStateError):
                continue  # (a killed peer: the survivors go on)
            weights -= np.float32(0.1) * grads
            state.revision += 1
            step += 1
            if step == life and not survivor:
                print(f"reduced {os.getpid()}", flush=True)
            if survivor and step % 100 == 0:
                print(f"step {step}", flush=True)


def zygote(addr: str) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped at once
    for line in sys.stdin:
        words = line.split()
        if words[:1] != ["fork"]:
            continue
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            pccl.run(loop(addr, survivor=False, life=int(words[1])))
            os._exit(0)
        print(f"forked {pid}", flush=True)


if __name__ == "__main__":
    mode, addr = sys.argv[1], sys.argv[2]
    if mode == "zygote":
        zygote(addr)
    else:
        if TRACE:
            tracemalloc.start(16)
        if GARBAGE:
            gc.disable()
        pccl.run(loop(addr, survivor=True))
