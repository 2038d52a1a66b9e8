"""A peer process that joins a run of PEERS, reduces once with them and leaves, as all of
them do at once: ``python goodbye_peer.py HOST:PORT PEERS`` (``tests/process/test_goodbye.py``)."""

from __future__ import annotations

import sys

import numpy as np

import pccl_aio as pccl


async def main(master: str, peers: int) -> None:
    async with pccl.Communicator(master, heartbeat_interval=0.2) as comm:
        await comm.connect()
        await comm.wait_for_peers(peers, timeout=60)  # then all leave at once
        x = np.ones(1024, np.float32)
        await comm.all_reduce(x)
        print("leaving", flush=True)


if __name__ == "__main__":
    pccl.run(main(sys.argv[1], int(sys.argv[2])))
