"""Run a master in its own process and print its port (for tests that kill the master)."""

from __future__ import annotations

import asyncio
import sys

import pccl_aio as pccl


async def main() -> None:
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.2,
                           heartbeat_timeout=float(sys.argv[1]) if len(sys.argv) > 1 else 2.0) as m:
        print(m.port, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    pccl.run(main())
