"""Run a master in its own process and print its port (for tests that kill the master).

Usage: python masterproc.py [HEARTBEAT_TIMEOUT [PORT [RECOVERY_GRACE]]]  (PORT 0: the OS's
choice, the default; a restarted master is given the port its predecessor printed). The run
secret comes from the environment as for any master; ``$MASTER_SECRET`` is the master secret,
``$VOTE_TIMEOUT`` its vote timeout (seconds).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import pccl_aio as pccl


async def main() -> None:
    args = sys.argv[1:]
    timeout = float(args[0]) if args else 2.0
    port = int(args[1]) if len(args) > 1 else 0
    grace = float(args[2]) if len(args) > 2 else None
    async with pccl.Master("127.0.0.1", port, heartbeat_interval=0.2, heartbeat_timeout=timeout,
                           recovery_grace=grace,
                           master_secret=os.environ.get("MASTER_SECRET"),
                           vote_timeout=float(os.environ.get("VOTE_TIMEOUT", "600"))) as m:
        print(m.port, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    if os.environ.get("PCCL_TEST_LOG"):  # e.g. INFO: the library's log, timed, on stderr
        logging.basicConfig(level=os.environ["PCCL_TEST_LOG"].upper(),
                            format="%(created).3f %(name)s %(message)s")
    pccl.run(main())
