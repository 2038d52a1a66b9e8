"""Peers for the kill/replace memory test (``test_churn_memory.py``).

    python churn_peer.py survivor MASTER   # a README-like loop; prints "step N" every 100 steps
    python churn_peer.py zygote MASTER     # each "fork" line on stdin forks a new peer

A zygote imports the library once and forks a peer per request (a fresh interpreter per
peer would spend a second importing): it prints "forked PID"; the child prints "reduced PID"
after its first all-reduce and runs the loop until it is killed. Everything is printed on
the zygote's stdout, one line each.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import pccl_aio as pccl


async def loop(addr: str, survivor: bool) -> None:
    async with pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0) as comm:
        await comm.connect()  # returns once admitted
        x = np.ones(4096, np.float32)
        step, first = 0, True
        while True:
            try:
                if not first and await comm.are_peers_pending():
                    await comm.update_topology()
                first = False
                await comm.all_reduce(x)
            except (pccl.PeerLostError, pccl.TooFewPeersError):
                continue  # (a killed peer: the survivors go on)
            x.fill(1.0)
            step += 1
            if step == 1 and not survivor:
                print(f"reduced {os.getpid()}", flush=True)
            if survivor and step % 100 == 0:
                print(f"step {step}", flush=True)


def zygote(addr: str) -> None:
    for line in sys.stdin:
        if line.strip() != "fork":
            continue
        pid = os.fork()
        if pid == 0:
            pccl.run(loop(addr, survivor=False))
            os._exit(0)
        print(f"forked {pid}", flush=True)


if __name__ == "__main__":
    mode, addr = sys.argv[1], sys.argv[2]
    if mode == "zygote":
        zygote(addr)
    else:
        pccl.run(loop(addr, survivor=True))
