"""Cost of quantization on loopback: uint8 and uint4 MIN_MAX against unquantized, same run.

    python bench/quantized.py [--peers 2] [--mib 64] [--iters 10] [--conns 4]

P peer processes; each iteration all-reduces the same float32 buffer once unquantized, once
with ``Quantization(algo=MIN_MAX, dtype="uint8")`` and once with ``dtype="uint4"`` (the
order rotates), the slowest peer's time counts; each figure is median(quantized) /
median(unquantized) (target <= 1.5: on loopback the link is not the bottleneck, so this
measures the kernels' overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _common import join_world

import pccl_aio as pccl

HERE = Path(__file__).resolve().parent
KINDS = ("none", "uint8", "uint4")


async def _peer(addr: str, world: int, mib: int, iters: int, conns: int) -> None:
    quants = {kind: pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype=kind)
              for kind in KINDS[1:]}
    async with pccl.Communicator(addr, p2p_connections=conns) as comm:
        await join_world(comm, world)
        base = np.random.default_rng(comm.peer_id).random(mib * 2**20 // 4, dtype=np.float32)
        x = np.empty_like(base)
        sync = np.zeros(1, np.float32)
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for i in range(iters + 2):
            order = KINDS[i % 3:] + KINDS[:i % 3]
            for kind in order:
                np.copyto(x, base)
                await comm.all_reduce(sync, tag=1)  # untimed barrier
                t0 = time.perf_counter()
                await comm.all_reduce(x, tag=0, quantization=quants.get(kind))
                if i >= 2:
                    times[kind].append(time.perf_counter() - t0)
        print(json.dumps(times), flush=True)


async def _run(world: int, mib: int, iters: int, conns: int) -> dict[str, list[float]]:
    async with pccl.Master("127.0.0.1", 0) as master:
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--peer", master.address, str(world), str(mib),
            str(iters), str(conns), stdout=asyncio.subprocess.PIPE, env=env)
            for _ in range(world)]
        outs = [json.loads((await p.communicate())[0]) for p in procs]
    return {k: [max(ts) for ts in zip(*(o[k] for o in outs))] for k in KINDS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--peer", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        addr, w, mib, it, k = a.peer
        pccl.run(_peer(addr, int(w), int(mib), int(it), int(k)))
        return
    t = pccl.run(_run(a.peers, a.mib, a.iters, a.conns))
    med = {k: statistics.median(v) for k, v in t.items()}
    ratios = {k: med[k] / med["none"] for k in KINDS[1:]}
    print(f"P={a.peers} {a.mib} MiB float32 K={a.conns}, medians of {a.iters}:")
    print(f"{'quantization':<14}{'median ms':>10}{'/ unquantized':>15}")
    print(f"{'none':<14}{med['none'] * 1e3:>10.1f}{1.0:>15.2f}")
    for k, r in ratios.items():
        print(f"{k + ' MIN_MAX':<14}{med[k] * 1e3:>10.1f}{r:>15.2f}  "
              f"(target <= 1.5) {'ok' if r <= 1.5 else 'MISS'}")
    print(json.dumps({"bench": "quantized", "peers": a.peers, "mib": a.mib,
                      "median_s": med, "ratio": ratios["uint8"], "ratios": ratios,
                      "times": t}))


if __name__ == "__main__":
    main()
