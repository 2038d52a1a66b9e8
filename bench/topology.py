"""optimize_topology() on an emulated WAN mesh: the measured matrix, the join-order ring, the
optimized ring and the all-reduce time on each (the join-order ring is the baseline).

    python bench/topology.py [--hosts 4] [--delay-ms 5] [--rate-mbit 500] [--slow-mbit 50]
                             [--mib 8] [--iters 3]

Needs root. Brings up ``tests/netem/wan-mesh`` (the vendored ``../shared/tools/wan-mesh``:
``--hosts`` namespaces, every ordered pair ``--delay-ms`` one way at ``--rate-mbit``) and
always takes it down. Master on host 1, one peer per host. Once the run has all peers, every
other link of the join-order ring (ring[0]<->ring[1], ring[2]<->ring[3], ...) is set to
``--slow-mbit`` both ways, so that ring crosses slow links while rings of fast links exist.
Then: ``--iters`` timed float32 SUM all-reduces of ``--mib`` MiB (after one warm-up) on the
join-order ring, ``optimize_topology()`` (timed), the same all-reduces on the new ring. An
all-reduce's time is the slowest peer's; the figure is the median over iterations.
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


async def command(procs: list[Proc], line: str, event: str) -> list[dict]:
    for p in procs:
        p.send(line)
    return list(await asyncio.gather(*(p.expect(event, 300) for p in procs)))


async def reduce_time(procs: list[Proc], mib: float, iters: int) -> float:
    got = await command(procs, f"reduce {mib} {iters}", "reduced")
    return statistics.median(max(t) for t in zip(*(g["times"] for g in got)))


def slowest(ring: list[int], bps: dict[tuple[int, int], float]) -> float:
    return min(bps[(a, b)] for a, b in zip(ring, ring[1:] + ring[:1]))


async def bench(a: argparse.Namespace, mesh: Mesh) -> None:
    hosts = list(range(1, a.hosts + 1))
    master, addr = await run_master()
    procs: list[Proc] = []
    try:
        procs, ids, ring = await run_peers(addr, hosts, a.hosts)
        host = dict(zip(ids, hosts))
        slow = [(ring[k], ring[k + 1]) for k in range(0, len(ring) - 1, 2)]
        for x, y in slow:
            mesh.set(host[x], host[y], f"rate={a.slow_mbit:g}")
        before = await reduce_time(procs, a.mib, a.iters)
        t0 = time.perf_counter()
        got = await command(procs, "optimize", "optimized")
        took = time.perf_counter() - t0
        new = got[0]["ring"]
        assert all(g["ring"] == new for g in got), got
        after = await reduce_time(procs, a.mib, a.iters)
        master.send("links")
        links = (await master.expect("links"))["links"]
    finally:
        for p in [*procs, master]:
            await p.stop()
    bps = {(s, d): b for s, d, b, _ in links}
    lat = {(s, d): t for s, d, _, t in links}
    print(f"measured links ({len(links)} ordered pairs, Mbit/s / one-way ms; peer id@host); "
          f"slow pairs set to {a.slow_mbit:g} Mbit/s: "
          + ", ".join(f"{x}<->{y}" for x, y in slow))
    cols = ["from \\ to"] + [f"{d}@{host[d]}" for d in ids]
    print_table([{"from \\ to": f"{s}@{host[s]}",
                  **{f"{d}@{host[d]}": "-" if s == d else
                     f"{bps[(s, d)] / 1e6:.0f} / {lat[(s, d)] * 1e3:.1f}" for d in ids}}
                 for s in ids], cols)
    rows = [{"ring": "join order", "peers": " ".join(map(str, ring)),
             "slowest_mbit": slowest(ring, bps) / 1e6, "allreduce_s": before, "speedup": 1.0},
            {"ring": "optimized", "peers": " ".join(map(str, new)),
             "slowest_mbit": slowest(new, bps) / 1e6, "allreduce_s": after,
             "speedup": before / after}]
    print(f"{a.mib:g} MiB float32 SUM all-reduce, {a.hosts} peers, median of {a.iters}; "
          f"optimize_topology() took {took:.2f} s and measured {got[0]['measured']} pairs")
    print_table(rows, ["ring", "peers", "slowest_mbit", "allreduce_s", "speedup"],
                {"slowest_mbit": ".0f", "speedup": ".2f"})
    emit_json("topology", rows, hosts=a.hosts, delay_ms=a.delay_ms, rate_mbit=a.rate_mbit,
              slow_mbit=a.slow_mbit, mib=a.mib, iters=a.iters, optimize_s=took,
              measured=got[0]["measured"],
              links=[[s, d, b, t] for (s, d), b in sorted(bps.items()) for t in [lat[(s, d)]]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--delay-ms", type=float, default=5)
    ap.add_argument("--rate-mbit", type=float, default=500)
    ap.add_argument("--slow-mbit", type=float, default=50)
    ap.add_argument("--mib", type=float, default=8)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()
    if a.hosts < 4:
        ap.error("--hosts must be at least 4 (a ring avoiding the slow links must exist)")
    mesh = Mesh(a.hosts, a.delay_ms, a.rate_mbit)
    try:
        mesh.up()
        asyncio.run(bench(a, mesh))
    finally:
        mesh.down()


if __name__ == "__main__":
    main()
