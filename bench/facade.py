"""What the blocking facade costs: all-reduce through ``pccl_aio.blocking`` against the async API.

    python bench/facade.py [--quick] [--json PATH] [--rounds 5] [--iters 60] [--warmup 3]
                           [--sizes 4KiB,16MiB] [--reps 25,6] [--hops 50]

Issue 18. P = 2 peer processes on 127.0.0.1; this process serves two async masters, one per
variant. Each peer process holds two communicators at once, each in its own group:

- ``async``: a ``pccl_aio.Communicator`` on an event loop of the main thread (uvloop, as
  ``pccl_aio.run`` uses), driven with ``loop.run_until_complete`` one block at a time;
- ``facade``: a ``pccl_aio.blocking.Communicator`` (its own loop in its own thread), called
  from the plain main thread while no loop runs there.

A cycle runs, for each size, one block of each variant back to back (the order alternating
from cycle to cycle, ABBA): a block is a barrier (a 1-element all-reduce, untimed) and then
``--reps`` back-to-back timed all-reduces, out of place (``all_reduce(x, out)``), float32
SUM. Both variants are timed with ``time.perf_counter`` in the main thread around the call:
``await comm.all_reduce(x, out)`` inside the loop for async, ``comm.all_reduce(x, out)``
for the facade. An op's time is the slower peer's (op i of one peer with op i of the other).
``--iters`` timed cycles after ``--warmup`` ones, in ``--rounds`` rounds of fresh processes.

``vs_async`` is the median over cycles of the per-cycle ratio facade / async of the blocks'
median op times (blocks seconds apart, so the drift of this shared VM cancels), with its
quartiles; ``overhead_us`` the median over cycles of the per-cycle difference. The raw hop:
after each cycle each peer times ``--hops`` round trips
``asyncio.run_coroutine_threadsafe(noop(), facade_loop).result()`` from the main thread (one
wake-up of the facade's loop thread and one of the main thread: what every facade call adds).

Results are checked (exact SUM of integer-valued floats). Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # this checkout's pccl_aio, then the bench helpers
import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    finish_peers,
    input_pattern,
    parse_size,
    print_table,
    size_label,
)

VARIANTS = ("async", "facade")


# ---- one peer process: an async and a facade communicator, interleaved blocks ----------------
async def _noop() -> None:
    return None


def peer(spec: dict[str, Any]) -> None:
    import pccl_aio as pccl
    from pccl_aio import blocking

    sizes, reps = spec["sizes"], spec["reps"]
    xs = [input_pattern(n // 4) for n in sizes]
    outs = [np.empty_like(x) for x in xs]
    sync = np.zeros(1, np.float32)

    # the facade first: its loop thread runs (and heartbeats) from here on
    fac = blocking.Communicator(spec["addrs"]["facade"])
    fac.connect(attempts=20)
    deadline = time.monotonic() + 180  # never wait forever for a peer that died
    while fac.world_size < 2:
        if time.monotonic() > deadline:
            raise SystemExit("facade: the other peer never joined")
        fac.update_topology()
    fac_loop = fac._runner.loop  # the facade's loop, for the raw hop

    from pccl_aio._net.loops import new_loop

    loop = new_loop()
    asyncio.set_event_loop(loop)

    async def join() -> pccl.Communicator:
        comm = pccl.Communicator(spec["addrs"]["async"])
        await comm.connect(attempts=20)
        async with asyncio.timeout(180):
            while comm.world_size < 2:
                await comm.update_topology()
        return comm

    acomm = loop.run_until_complete(join())

    async def async_block(x: np.ndarray, out: np.ndarray, n: int) -> list[float]:
        await acomm.all_reduce(sync, tag=1)  # barrier: both start together
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            await acomm.all_reduce(x, out, tag=0)
            ts.append(time.perf_counter() - t0)
        return ts

    def facade_block(x: np.ndarray, out: np.ndarray, n: int) -> list[float]:
        fac.all_reduce(sync, tag=1)
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fac.all_reduce(x, out, tag=0)
            ts.append(time.perf_counter() - t0)
        return ts

    # res[size][variant] = one list of op times per timed cycle
    res: dict[str, dict[str, list[list[float]]]] = {
        str(n): {v: [] for v in VARIANTS} for n in sizes}
    hops: list[float] = []
    try:
        for cycle in range(spec["warmup"] + spec["iters"]):
            order = VARIANTS if cycle % 2 == 0 else VARIANTS[::-1]
            for x, out, n, k in zip(xs, outs, sizes, reps):
                for v in order:
                    out.fill(0.0)
                    ts = (loop.run_until_complete(async_block(x, out, k)) if v == "async"
                          else facade_block(x, out, k))
                    if not np.array_equal(out, x * 2):
                        raise SystemExit(f"WRONG all-reduce result ({v}, {n} B, cycle {cycle})")
                    if cycle >= spec["warmup"]:
                        res[str(n)][v].append(ts)
            for _ in range(spec["hops"]):
                t0 = time.perf_counter()
                asyncio.run_coroutine_threadsafe(_noop(), fac_loop).result()
                if cycle >= spec["warmup"]:
                    hops.append(time.perf_counter() - t0)
    finally:
        loop.run_until_complete(acomm.close())
        fac.close()
        loop.close()
    # to a file: a pipe would need the parent to read both peers at once (64 KiB of buffer)
    Path(spec["out"]).write_text(json.dumps({"res": res, "hops": hops}))


def spawn_peer(spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--peer",
                             json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def collect(procs: list[subprocess.Popen[str]], files: list[Path], timeout: float
            ) -> list[dict[str, Any]]:
    """Each peer's result, from the file it wrote."""
    finish_peers(procs, timeout)
    return [json.loads(f.read_text()) for f in files]


async def one_round(spec: dict[str, Any]) -> list[dict[str, Any]]:
    import pccl_aio as pccl

    async with pccl.Master("127.0.0.1", 0) as ma, pccl.Master("127.0.0.1", 0) as mf:
        with tempfile.TemporaryDirectory(prefix="pccl-facade-") as tmp:
            files = [Path(tmp) / f"peer{i}.json" for i in range(2)]
            procs = [spawn_peer({**spec, "out": str(f),
                                 "addrs": {"async": ma.address, "facade": mf.address}})
                     for f in files]
            return await asyncio.to_thread(collect, procs, files, 600)


# ---- the driver ----------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def pair_round(outs: list[dict[str, Any]], size: int
               ) -> dict[str, list[list[float]]]:
    """Per variant, per cycle, per op: the slower peer's time."""
    return {v: [[max(ts) for ts in zip(*blocks)]
                for blocks in zip(*(o["res"][str(size)][v] for o in outs))]
            for v in VARIANTS}


def summarise(rounds: list[list[dict[str, Any]]], size: int) -> list[dict[str, Any]]:
    cycles = {v: [c for r in rounds for c in pair_round(r, size)[v]] for v in VARIANTS}
    block_med = {v: [statistics.median(c) for c in cycles[v]] for v in VARIANTS}
    ratios = [f / a for a, f in zip(block_med["async"], block_med["facade"])]
    diffs = [(f - a) * 1e6 for a, f in zip(block_med["async"], block_med["facade"])]
    rows = []
    for v in VARIANTS:
        ops = [t for c in cycles[v] for t in c]
        fac = v == "facade"
        rows.append({"size": size_label(size), "variant": v, "cycles": len(cycles[v]),
                     "ops": len(ops), "median_us": statistics.median(ops) * 1e6,
                     "p90_us": pct(ops, 0.9) * 1e6,
                     "vs_async": statistics.median(ratios) if fac else 1.0,
                     "ratio_p25": pct(ratios, 0.25) if fac else None,
                     "ratio_p75": pct(ratios, 0.75) if fac else None,
                     "overhead_us": statistics.median(diffs) if fac else None,
                     "overhead_p25_us": pct(diffs, 0.25) if fac else None,
                     "overhead_p75_us": pct(diffs, 0.75) if fac else None})
    return rows


def main() -> None:
    import pccl_aio as pccl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run (few cycles)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of fresh peer processes")
    ap.add_argument("--iters", type=int, default=60, help="timed cycles per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sizes", default="4KiB,16MiB", help="all-reduce sizes (bytes, KiB, MiB)")
    ap.add_argument("--reps", default="25,6",
                    help="back-to-back timed all-reduces per block, one per size")
    ap.add_argument("--hops", type=int, default=50, help="raw hops timed per cycle per peer")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON line here")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        return peer(json.loads(a.peer))
    if a.quick:
        a.rounds, a.iters, a.warmup, a.hops = 1, 6, 1, 20
    sizes = [parse_size(s) // 4 * 4 for s in a.sizes.split(",")]
    reps = [int(r) for r in a.reps.split(",")]
    if len(reps) != len(sizes):
        raise SystemExit("give one --reps per --sizes entry")
    spec = {"sizes": sizes, "reps": reps, "iters": a.iters, "warmup": a.warmup,
            "hops": a.hops}
    t_start, load0 = time.monotonic(), os.getloadavg()[0]
    rounds: list[list[dict[str, Any]]] = []
    for rnd in range(a.rounds):
        rounds.append(pccl.run(one_round(spec)))
        line = []
        for n in sizes:
            p = pair_round(rounds[-1], n)
            line.append(f"{size_label(n)}: " + " ".join(
                f"{v} {statistics.median(t for c in p[v] for t in c) * 1e6:.0f} us"
                for v in VARIANTS))
        print(f"round {rnd + 1}/{a.rounds}: " + "; ".join(line), flush=True)
    rows = [r for n in sizes for r in summarise(rounds, n)]
    hops = [h for r in rounds for o in r for h in o["hops"]]
    hop = {"n": len(hops), "median_us": statistics.median(hops) * 1e6,
           "p10_us": pct(hops, 0.1) * 1e6, "p90_us": pct(hops, 0.9) * 1e6}
    elapsed = time.monotonic() - t_start

    print()
    print_table(rows, ["size", "variant", "cycles", "ops", "median_us", "p90_us", "vs_async",
                       "ratio_p25", "ratio_p75", "overhead_us", "overhead_p25_us",
                       "overhead_p75_us"],
                {"median_us": ".0f", "p90_us": ".0f", "overhead_us": ".1f",
                 "overhead_p25_us": ".1f", "overhead_p75_us": ".1f"})
    print(f"raw hop (run_coroutine_threadsafe(noop(), facade loop).result() from the main "
          f"thread): median {hop['median_us']:.1f} us, p10 {hop['p10_us']:.1f}, "
          f"p90 {hop['p90_us']:.1f} (n = {hop['n']})")
    load = (load0, os.getloadavg()[0])
    print(f"({elapsed:.0f} s; load average {load[0]:.2f} at start, {load[1]:.2f} at end; "
          f"P = 2, out of place, float32 SUM; an op's time is the slower peer's; vs_async and "
          f"overhead_us = median over cycles of facade / async and facade - async of the "
          f"blocks' median op times in the same cycle, with quartiles)")
    line = json.dumps({"bench": "facade", "rows": rows, "hop": hop, "sizes": sizes,
                       "reps": reps, "rounds": a.rounds, "iters": a.iters,
                       "elapsed_s": elapsed, "loadavg_start_end": load, "quick": a.quick,
                       "cpus": os.cpu_count()})
    print(line)
    if a.json:
        Path(a.json).write_text(line + "\n")


if __name__ == "__main__":
    main()
