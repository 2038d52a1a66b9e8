"""Small all-reduce latency on an emulated WAN mesh, against the ring's bound measured in the
same run.

    python bench/mesh_latency.py [--hosts 4] [--delay-ms 50] [--rate-mbit 1000] [--kib 4 256]
                                 [--iters 15]

Needs root. Brings up ``tests/netem/wan-mesh`` (every ordered pair ``--delay-ms`` one way at
``--rate-mbit``) and always takes it down. Master on host 1, one peer per host. The one-way
delay is measured first: the best of 10 TCP connects from host 2 to the master (a connect
takes one round trip), halved. The bound is a ring all-reduce's 2(P - 1) one-way delays. Rows,
each after one warm-up:

- ``reused tag``: the same tag every time, as a training loop does: from the second run on the
  collective starts on its ticket, without waiting for the master's start;
- ``fresh tags``: a never-used tag every time: each waits a master round trip to start.

Sizes up to 64 KiB take the small path: from 4 peers up in ceil(log2 P) rounds (``path``
``rounds``), and, with ``--compare-ring``, also once round the ring (``path`` ``ring``, P - 1
hops, the path below 4 peers) in the same run, alternating per size; larger ones take the ring
all-reduce (2(P - 1) hops). An all-reduce's time is the slowest peer's; the figure is the
median over iterations; ``vs_ring`` is the ring's median over this row's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import emit_json, print_table

from tests.netem.mesh import Mesh, Proc, run_master, run_peers

PROBE = """
import socket, sys, time
best = 1e9
for _ in range(10):
    s = socket.socket()
    t0 = time.perf_counter()
    s.connect((sys.argv[1], int(sys.argv[2])))
    best = min(best, time.perf_counter() - t0)
    s.close()
print(best)
"""


async def one_way(addr: str) -> float:
    """Half the best TCP connect time from host 2 to ``addr`` (seconds)."""
    host, port = addr.rsplit(":", 1)
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", Mesh.ns(2), sys.executable, "-c", PROBE, host, port,
        stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return float(out) / 2


async def reduce_time(procs: list[Proc], kib: float, iters: int, fresh: bool,
                      ring: bool = False) -> float:
    line = f"reduce {kib / 1024} {iters}" + (" fresh" if fresh else "") + (" ring" if ring
                                                                           else "")
    for p in procs:
        p.send(line)
    got = await asyncio.gather(*(p.expect("reduced", 600) for p in procs))
    return statistics.median(max(t) for t in zip(*(g["times"] for g in got)))


async def bench(a: argparse.Namespace) -> list[dict[str, object]]:
    hosts = list(range(1, a.hosts + 1))
    master, addr = await run_master()
    procs: list[Proc] = []
    try:
        procs, _ids, _ring = await run_peers(addr, hosts, a.hosts)
        d = await one_way(addr)
        bound = 2 * (a.hosts - 1) * d
        rows: list[dict[str, object]] = []
        for kib in a.kib:
            for fresh in (False, True):
                ring = None
                for via in ("ring", "rounds") if a.compare_ring and kib <= 64 else ("rounds",):
                    t = await reduce_time(procs, kib, a.iters, fresh, via == "ring")
                    ring = t if via == "ring" else ring
                    rows.append({"P": a.hosts, "size_KiB": kib,
                                 "tags": "fresh tags" if fresh else "reused tag",
                                 "path": via if kib <= 64 else "ring all-reduce",
                                 "one_way_ms": round(d * 1e3, 2),
                                 "bound_ms": round(bound * 1e3, 1),
                                 "median_ms": round(t * 1e3, 1), "vs_bound": round(t / bound, 3),
                                 "vs_ring": round(ring / t, 2) if ring else ""})
        return rows
    finally:
        for p in procs:
            p.send("leave")
        master.send("leave")
        for p in [*procs, master]:
            await p.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--delay-ms", type=float, default=50.0)
    p.add_argument("--rate-mbit", type=float, default=1000.0)
    p.add_argument("--kib", type=float, nargs="+", default=[4.0, 256.0])
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--compare-ring", action="store_true",
                   help="small sizes also round the ring, in the same run")
    a = p.parse_args()
    mesh = Mesh(a.hosts, a.delay_ms, a.rate_mbit)
    t0 = time.perf_counter()
    mesh.up()
    try:
        rows = asyncio.run(bench(a))
    finally:
        mesh.down()
    print(f"# small all-reduce latency on wan-mesh: {a.hosts} hosts, {a.delay_ms:g} ms one way, "
          f"{a.rate_mbit:g} Mbit/s; master on host 1; bound = 2(P-1) x measured one-way delay")
    print_table(rows, ["P", "size_KiB", "tags", "path", "one_way_ms", "bound_ms", "median_ms",
                       "vs_bound", "vs_ring"])
    emit_json("mesh_latency", rows, hosts=a.hosts, delay_ms=a.delay_ms, rate_mbit=a.rate_mbit)
    print(f"# {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
