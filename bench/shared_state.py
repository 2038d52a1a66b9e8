"""Shared-state transfer to a joiner and hashing speed, as ratios to baselines of the same run.

    python bench/shared_state.py [--mib 256] [--repeat 3]

(1) A master and two peer processes: the veteran holds a ``--mib`` MiB float32 state at
revision 1; the joiner starts from zeros at revision 0 and syncs, receiving everything. The
time of that sync (median over ``--repeat`` fresh runs) gives the transfer throughput, shown
against single-stream loopback TCP measured first. (2) xxh3-128 hashing GB/s against
``np.copyto`` bandwidth on the same buffer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
from _common import emit_json, join_world, median, print_table, tcp_loopback_gbps

import pccl_aio as pccl
from pccl_aio._peer.state.core.shared_state import hash_bytes


async def _peer(addr: str, role: str, mib: int) -> None:
    n = mib * 2**20 // 4
    arr = np.empty(n, np.float32)
    arr.fill(1.5 if role == "veteran" else 0.0)  # touched, as a model's tensors would be
    state = pccl.SharedState({"w": arr}, revision=1 if role == "veteran" else 0)
    async with pccl.Communicator(addr) as comm:
        await join_world(comm, 2)
        t0 = time.perf_counter()
        info = await comm.sync_shared_state(state)
        dt = time.perf_counter() - t0
        ok = bool(arr[0] == 1.5 and arr[-1] == 1.5)
        print(json.dumps({"role": role, "seconds": dt, "rx": info.rx_bytes, "tx": info.tx_bytes,
                          "ok": ok}), flush=True)


async def _one_transfer(mib: int) -> float:
    async with pccl.Master("127.0.0.1", 0) as master:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
        procs = []
        for role in ("veteran", "joiner"):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--peer", master.address, role, str(mib),
                stdout=asyncio.subprocess.PIPE, env=env))
        outs = [json.loads((await p.communicate())[0].decode().splitlines()[-1]) for p in procs]
        joiner = outs[1]
        if not joiner["ok"] or joiner["rx"] != mib * 2**20:
            raise SystemExit(f"bad transfer: {joiner}")
        return float(joiner["seconds"])


def _hash_vs_copy(mib: int, repeat: int) -> tuple[float, float]:
    a = np.ones(mib * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    view = memoryview(a).cast("B")
    th, tc = [], []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        hash_bytes(view)
        th.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        np.copyto(b, a)
        tc.append(time.perf_counter() - t0)
    nbytes = a.nbytes
    return nbytes / min(th[1:]) / 1e9, nbytes / min(tc[1:]) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        pccl.run(_peer(args.peer[0], args.peer[1], int(args.peer[2])))
        return
    tcp1 = tcp_loopback_gbps(1)
    times = [pccl.run(_one_transfer(args.mib)) for _ in range(args.repeat)]
    gbps = args.mib * 2**20 / median(times) / 1e9
    hash_gbps, copy_gbps = _hash_vs_copy(args.mib, args.repeat)
    rows = [
        {"what": f"sync {args.mib} MiB to a joiner", "GBps": gbps, "baseline": "tcp 1 stream",
         "baseline_GBps": tcp1, "ratio": gbps / tcp1, "target": ">= 0.5"},
        {"what": f"xxh3-128 of {args.mib} MiB", "GBps": hash_gbps, "baseline": "np.copyto",
         "baseline_GBps": copy_gbps, "ratio": hash_gbps / copy_gbps, "target": "-"},
    ]
    print_table(rows, list(rows[0]))
    emit_json("shared_state", rows, transfer_seconds=times)


if __name__ == "__main__":
    main()
