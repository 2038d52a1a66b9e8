"""A peer process that joins and all-reduces a large tensor in a loop until it is killed."""

from __future__ import annotations

import sys

import numpy as np

import pccl_aio as pccl


async def main(addr: str, count: int) -> None:
    async with pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0) as comm:
        await comm.connect()
        print("joined", flush=True)
        x = np.ones(count, np.float32)
        while True:
            try:
                await comm.all_reduce(x)
            except pccl.PeerLostError:
                pass


if __name__ == "__main__":
    pccl.run(main(sys.argv[1], int(sys.argv[2])))
