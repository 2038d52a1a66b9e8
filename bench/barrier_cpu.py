"""CPU cost of a barrier: P peers and a master in one event loop, against a joint vote.

    python bench/barrier_cpu.py [--peers 2 3] [--iters 1000] [--rounds 3]

With every party in one loop on one core, wall time per operation is the CPU the whole run
spends on it (peers and master, wire encoding and the loop included), without the process
wake-ups that dominate the latency across processes (``bench/collectives.py`` measures that
one against gloo). The baseline, in the same run and loop: ``are_peers_pending()``, a joint vote
(one master round trip, the cheapest call every peer makes together). Rounds alternate the
two; the table gives the median over rounds of microseconds per call and barrier / vote; a
JSON line follows.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import emit_json, median, print_table

import pccl_aio as pccl
from tests.helpers import SECRET, join_peers


async def _time(call, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        await call()
    return (time.perf_counter() - t0) / iters * 1e6


async def measure(peers: int, iters: int, rounds: int) -> dict[str, float]:
    async with pccl.Master("127.0.0.1", 0, admission_interval=0.0, secret=SECRET) as master:
        comms = await join_peers(master, peers, secret=SECRET)
        try:
            async def barrier() -> None:
                await asyncio.gather(*(c.barrier() for c in comms))

            async def vote() -> None:
                await asyncio.gather(*(c.are_peers_pending() for c in comms))

            await _time(barrier, 50)  # warm-up: connections, tickets
            await _time(vote, 50)
            times: dict[str, list[float]] = {"barrier": [], "vote": []}
            for r in range(rounds):
                order = [("barrier", barrier), ("vote", vote)]
                for name, call in order if r % 2 == 0 else order[::-1]:
                    times[name].append(await _time(call, iters))
        finally:
            await asyncio.gather(*(c.close() for c in comms))
    b, v = median(times["barrier"]), median(times["vote"])
    return {"P": peers, "barrier_us": b, "vote_us": v, "barrier_vs_vote": b / v}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = [await measure(p, args.iters, args.rounds) for p in args.peers]
    print_table(rows, ["P", "barrier_us", "vote_us", "barrier_vs_vote"])
    emit_json("barrier_cpu", rows)


if __name__ == "__main__":
    pccl.run(main())
