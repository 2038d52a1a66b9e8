"""All-reduce bus bandwidth of pccl_aio on loopback, against single-stream TCP measured in the same run.

    python bench/allreduce.py [--peers 2 3 4] [--mib 1 16 64] [--conns 1 4] [--iters 10]

Each configuration starts a master and P peer processes on 127.0.0.1; every peer all-reduces
a float32 buffer (SUM, in place) ``--iters`` times after a warm-up, checking the result.
busbw = bytes x 2(P-1)/P / time (the NCCL convention), median over iterations; the ratio
column divides by single-stream loopback TCP throughput measured first.
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
from _common import emit_json, median, print_table, tcp_loopback_gbps

import pccl_aio as pccl


async def _peer(addr: str, world: int, nbytes: int, iters: int, conns: int) -> None:
    async with pccl.Communicator(addr, p2p_connections=conns) as comm:
        await comm.connect(attempts=20)
        while comm.world_size < world:
            await comm.update_topology()
        x = np.ones(nbytes // 4, np.float32)
        times = []
        for i in range(iters + 2):
            x.fill(1.0)
            t0 = time.perf_counter()
            info = await comm.all_reduce(x, tag=0)
            dt = time.perf_counter() - t0
            if not (x[0] == world and x[-1] == world):
                raise SystemExit(f"wrong result {x[0]} {x[-1]}")
            if i >= 2:
                times.append(dt)
        print(json.dumps({"times": times, "tx": info.tx_bytes}), flush=True)


async def _run_config(world: int, nbytes: int, iters: int, conns: int) -> list[float]:
    async with pccl.Master("127.0.0.1", 0) as master:
        procs = []
        for _ in range(world):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--peer", master.address, str(world), str(nbytes),
                str(iters), str(conns), stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}))
        outs = await asyncio.gather(*(p.communicate() for p in procs))
        per_iter: list[float] = []
        for out, _ in outs:
            times = json.loads(out.decode().strip().splitlines()[-1])["times"]
            per_iter = times if not per_iter else [max(a, b) for a, b in zip(per_iter, times)]
        return per_iter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--mib", type=float, nargs="+", default=[1, 16, 64])
    ap.add_argument("--conns", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--peer", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        addr, w, nb, it, k = args.peer
        pccl.run(_peer(addr, int(w), int(nb), int(it), int(k)))
        return
    tcp1 = tcp_loopback_gbps(1)
    print(f"single-stream loopback TCP: {tcp1:.3f} GB/s (baseline, same run)")
    rows = []
    for world in args.peers:
        for mib in args.mib:
            for k in args.conns:
                nbytes = int(mib * 2**20) // 4 * 4
                times = pccl.run(_run_config(world, nbytes, args.iters, k))
                med = median(times)
                busbw = nbytes * 2 * (world - 1) / world / med / 1e9
                rows.append({"P": world, "MiB": mib, "K": k, "median_ms": med * 1e3,
                             "best_ms": min(times) * 1e3, "busbw_GBps": busbw,
                             "ratio_vs_tcp1": busbw / tcp1})
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in rows[-1].items()), flush=True)
    print()
    print_table(rows, list(rows[0]))
    emit_json("allreduce", rows, tcp1_GBps=tcp1, loop="uvloop")


if __name__ == "__main__":
    main()
