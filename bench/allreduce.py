"""All-reduce bus bandwidth of pccl_aio on loopback, against TCP (and gloo) measured in the same
run.

    python bench/allreduce.py [--peers 2 3 4] [--mib 1 16 64] [--conns 1 4] [--iters 10]
    python bench/allreduce.py --compare gloo [--peers 2 3 4] [--sizes 4KiB 1MiB 16MiB 64MiB]
                              [--conns 4] [--iters 10] [--warmup 3] [--rounds 3] [--json PATH]

Default mode: each configuration starts a master (in this process) and P peer processes on
127.0.0.1; every peer all-reduces a float32 buffer (SUM, in place) ``--iters`` times after
``--warmup`` warm-up iterations, checking the whole result exactly. busbw = bytes x 2(P-1)/P /
time (the NCCL convention), where an iteration's time is the slowest peer's time of that
iteration; median over iterations. The ratio column divides by single-stream loopback TCP
throughput measured first.

``--compare gloo`` measures, in one run: loopback TCP with 1 and 4 streams (the limit; before
and after the all-reduces, the mean is the baseline);
``torch.distributed.all_reduce`` (gloo, SUM, float32, in place) with P rank processes
(``bench/_gloo.py``, joined through a TCPStore this process serves on an OS-chosen port); and
pccl_aio's ``all_reduce`` with P peer processes and K = ``--conns`` connections per neighbour
(default 4), for every P and size. Both sides do the same per iteration: refill the input
(untimed), an untimed barrier (gloo: ``dist.barrier()``; pccl_aio: a 1-element all-reduce) so
the ranks start together, ``time.perf_counter()`` around the all-reduce, then an exact check of
the whole result on every rank (input 1 + (i mod 251); a wrong result fails the bench).
Timed iterations per size and round: max(iters, min(10 x iters, 256 MiB / size)), i.e. 100 for 4 KiB
and 1 MiB, 16 for 16 MiB, 10 for 64 MiB with the defaults. gloo ranks and pccl_aio peers run
with OMP_NUM_THREADS=1 (and ``torch.set_num_threads(1)``): the reference machine has 2 cores
for up to 4 ranks. Each implementation runs ``--rounds`` times per P (fresh processes each
time), alternating gloo / pccl_aio and swapping which goes first from one round and P to the
next, so that drift on the shared VM hits both alike; the timed iterations of all rounds are
pooled. The table gives median and best busbw, the median latency, pccl_aio / gloo (median
busbw; latency below 1 MiB), busbw / single-stream TCP, and the spread of the per-round medians
(slowest / fastest); JSON lines (one per row with every time, then a summary with the
acceptance checks) go to stdout and to ``--json PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
from _common import (
    check_result,
    emit_json,
    emit_json_lines,
    input_pattern,
    join_world,
    median,
    parse_size,
    print_table,
    size_label,
    tcp_loopback_gbps,
)

import pccl_aio as pccl

HERE = Path(__file__).resolve().parent
GLOO_RANK = HERE / "_gloo.py"
CONFIG_TIMEOUT = 600.0
# --placement: in place, out of place, in place with restore_on_abort=False
IMPL = {"in": "pccl_aio", "out": "pccl_aio-oop", "norestore": "pccl_aio-norestore"}
Plan = list[tuple[int, int]]  # (nbytes, timed iterations) per size


# ---- pccl_aio peer (subprocess) -----------------------------------------------------------------
async def _peer(addr: str, world: int, conns: int, warmup: int, plan: Plan,
                placement: str = "in") -> None:
    async with pccl.Communicator(addr, p2p_connections=conns) as comm:
        await join_world(comm, world)
        sync = np.zeros(1, np.float32)
        for nbytes, iters in plan:
            base = input_pattern(nbytes // 4)
            expected = base * world
            x = np.empty_like(base)
            y = np.empty_like(base) if placement == "out" else x  # "out": src x, dst y
            times = []
            info = None
            for i in range(warmup + iters):
                np.copyto(x, base)
                await comm.all_reduce(sync, tag=1)  # untimed barrier: all peers start together
                t0 = time.perf_counter()
                info = await comm.all_reduce(x, y, tag=0,
                                             restore_on_abort=placement != "norestore")
                dt = time.perf_counter() - t0
                err = check_result(y, expected,
                                   f"pccl_aio peer of {world}, {nbytes} B, iteration {i}")
                if err:
                    print(err, file=sys.stderr, flush=True)
                    raise SystemExit(3)
                if i >= warmup:
                    times.append(dt)
            print(json.dumps({"nbytes": nbytes, "times": times,
                              "tx": info.tx_bytes if info else 0}), flush=True)


# ---- process plumbing ---------------------------------------------------------------------------
def _plan_arg(plan: Plan) -> str:
    return ",".join(f"{n}:{i}" for n, i in plan)


def _parse_plan(text: str) -> Plan:
    return [(int(n), int(i)) for n, i in (item.split(":") for item in text.split(","))]


def _child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


async def _collect(procs: list[asyncio.subprocess.Process], what: str) -> list[str]:
    """stdout of every process; the first one to fail (or a timeout) kills the rest and ends the
    bench with its stderr."""
    tasks = [asyncio.ensure_future(p.communicate()) for p in procs]
    deadline = time.monotonic() + CONFIG_TIMEOUT
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, timeout=deadline - time.monotonic(),
                                               return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise SystemExit(f"FAILED: {what}: no result after {CONFIG_TIMEOUT:.0f} s")
            for t in done:
                i = tasks.index(t)
                if procs[i].returncode != 0:
                    err = t.result()[1].decode(errors="replace").strip()
                    raise SystemExit(f"FAILED: {what}, process {i} exited with status "
                                     f"{procs[i].returncode}:\n{err[-3000:]}")
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return [t.result()[0].decode() for t in tasks]


def _slowest(outs: list[str], plan: Plan) -> dict[int, list[float]]:
    """Per size: for each timed iteration, the slowest rank's time."""
    per_rank = [{r["nbytes"]: r["times"] for r in map(json.loads, out.strip().splitlines())}
                for out in outs]
    return {n: [max(ts) for ts in zip(*(r[n] for r in per_rank))] for n, _ in plan}


async def _run_pccl(world: int, conns: int, warmup: int, plan: Plan, placement: str = "in"
                    ) -> dict[int, list[float]]:
    async with pccl.Master("127.0.0.1", 0) as master:
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--peer", master.address, str(world), str(conns),
            str(warmup), _plan_arg(plan), placement, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=_child_env()) for _ in range(world)]
        outs = await _collect(procs, f"pccl_aio all-reduce, P={world}, K={conns}, {placement}")
    return _slowest(outs, plan)


async def _run_gloo(world: int, warmup: int, plan: Plan) -> dict[int, list[float]]:
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, str(GLOO_RANK), str(rank), str(world), str(store.port), str(warmup),
        _plan_arg(plan), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_child_env()) for rank in range(world)]
    outs = await _collect(procs, f"gloo all-reduce, P={world}")
    del store
    return _slowest(outs, plan)


# ---- results ------------------------------------------------------------------------------------
def _row(impl: str, world: int, k: int | None, nbytes: int, rounds: list[list[float]],
         tcp1: float) -> dict[str, Any]:
    times = [t for r in rounds for t in r]
    med, best = median(times), min(times)
    round_meds = [median(r) for r in rounds]
    algo = nbytes * 2 * (world - 1) / world / 1e9
    return {"impl": impl, "P": world, "size": size_label(nbytes), "bytes": nbytes, "K": k,
            "iters": len(times), "median_ms": med * 1e3, "best_ms": best * 1e3,
            "busbw_med": algo / med, "busbw_best": algo / best, "vs_gloo": None,
            "lat_vs_gloo": None, "vs_tcp1": algo / med / tcp1,
            "round_spread": max(round_meds) / min(round_meds),
            "round_median_ms": [round(m * 1e3, 4) for m in round_meds],
            "times_ms": [[round(t * 1e3, 4) for t in r] for r in rounds]}


def _acceptance(rows: list[dict[str, Any]], peers: list[int], conns: list[int]
                ) -> list[dict[str, Any]]:
    checks = []
    for impl, k in ((i, k) for i in sorted({r["impl"] for r in rows} - {"gloo"}) for k in conns):
        def find(world: int, label: str, k: int = k, impl: str = impl) -> dict[str, Any] | None:
            return next((r for r in rows if r["impl"] == impl and r["P"] == world
                         and r["size"] == label and r["K"] == k), None)

        for label, target in (("16MiB", 1.0), ("64MiB", 1.0), ("1MiB", 0.8)):
            for world in peers:
                r = find(world, label, k)
                if r:
                    checks.append({"impl": impl,
                                   "what": f"busbw {impl}/gloo P={world} {label} K={k}",
                                   "value": r["vs_gloo"], "target": f">= {target}",
                                   "ok": r["vs_gloo"] >= target})
        r = find(2, "64MiB", k)
        if r:
            checks.append({"impl": impl, "what": f"busbw {impl}/TCP 1 stream P=2 64MiB K={k}",
                           "value": r["vs_tcp1"], "target": ">= 0.35", "ok": r["vs_tcp1"] >= 0.35})
        r = find(2, "4KiB", k)
        if r:
            checks.append({"impl": impl, "what": f"median latency {impl}/gloo P=2 4KiB K={k}",
                           "value": r["lat_vs_gloo"], "target": "<= 1.5",
                           "ok": r["lat_vs_gloo"] <= 1.5})
    return checks


def _compare_gloo(args: argparse.Namespace) -> None:
    import torch

    t_start = time.perf_counter()
    conns = args.conns or [4]
    sizes = args.sizes
    for n in sizes:
        if n <= 0 or n % 4:
            raise SystemExit(f"size {n} B is not a positive multiple of 4 (float32)")
    plan = [(n, max(args.iters, min(10 * args.iters, (256 << 20) // n))) for n in sizes]
    print(f"# all-reduce pccl_aio vs gloo on 127.0.0.1: torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
          f"pccl_aio {pccl.__version__} (uvloop), OMP_NUM_THREADS=1 in every rank")
    tcp_start = (tcp_loopback_gbps(1, args.tcp_seconds), tcp_loopback_gbps(4, args.tcp_seconds))
    print(f"loopback TCP before: 1 stream {tcp_start[0]:.3f} GB/s, "
          f"4 streams {tcp_start[1]:.3f} GB/s", flush=True)
    # P -> (impl, K) -> size -> one list of per-iteration times per round
    all_runs: dict[int, dict[tuple[str, int | None], dict[int, list[list[float]]]]] = {}
    for idx, world in enumerate(args.peers):
        runs = all_runs.setdefault(world, {})
        for rnd in range(args.rounds):
            order = ["gloo", "pccl_aio"] if (idx + rnd) % 2 == 0 else ["pccl_aio", "gloo"]
            for impl in order:
                if impl == "gloo":
                    res = {("gloo", None): pccl.run(_run_gloo(world, args.warmup, plan))}
                else:
                    res = {(IMPL[pl], k): pccl.run(_run_pccl(world, k, args.warmup, plan, pl))
                           for pl in args.placement for k in conns}
                for key, per_size in res.items():
                    for n, times in per_size.items():
                        runs.setdefault(key, {}).setdefault(n, []).append(times)
            print(f"P={world} round {rnd + 1}/{args.rounds} ({' then '.join(order)}) done "
                  f"({time.perf_counter() - t_start:.0f} s)", flush=True)
    tcp_end = (tcp_loopback_gbps(1, args.tcp_seconds), tcp_loopback_gbps(4, args.tcp_seconds))
    print(f"loopback TCP after: 1 stream {tcp_end[0]:.3f} GB/s, 4 streams {tcp_end[1]:.3f} GB/s",
          flush=True)
    tcp1, tcp4 = (tcp_start[0] + tcp_end[0]) / 2, (tcp_start[1] + tcp_end[1]) / 2
    rows: list[dict[str, Any]] = []
    for world in args.peers:
        runs = all_runs[world]
        for n in sizes:
            g = _row("gloo", world, None, n, runs[("gloo", None)][n], tcp1)
            rows.append(g)
            for impl, k in ((IMPL[pl], k) for pl in args.placement for k in conns):
                r = _row(impl, world, k, n, runs[(impl, k)][n], tcp1)
                r["vs_gloo"] = r["busbw_med"] / g["busbw_med"]
                r["lat_vs_gloo"] = r["median_ms"] / g["median_ms"]
                rows.append(r)
    print(f"loopback TCP (mean of before and after): 1 stream {tcp1:.3f} GB/s (the vs_tcp1 "
          f"baseline), 4 streams {tcp4:.3f} GB/s")
    print()

    print("busbw = bytes x 2(P-1)/P / time in GB/s (1e9 B); time of an iteration = slowest rank's; "
          "busbw_med from the median time, busbw_best from the best; vs_gloo = pccl_aio/gloo "
          "median busbw; lat_vs_gloo = pccl_aio/gloo median latency (sizes < 1 MiB); "
          "vs_tcp1 = median busbw / single-stream TCP; iters pooled over the rounds; "
          "round_spread = slowest / fastest round median")
    table = [{**r, "K": r["K"] if r["K"] is not None else "-",
              "lat_vs_gloo": r["lat_vs_gloo"] if r["bytes"] < (1 << 20) else None}
             for r in rows]
    cols = ["impl", "P", "size", "K", "iters", "median_ms", "best_ms", "busbw_med", "busbw_best",
            "vs_gloo", "lat_vs_gloo", "vs_tcp1", "round_spread"]
    print_table(table, cols, {"median_ms": ".3f", "best_ms": ".3f", "busbw_med": ".4f",
                              "busbw_best": ".4f", "vs_gloo": ".3f", "lat_vs_gloo": ".3f",
                              "vs_tcp1": ".4f", "round_spread": ".2f"})
    checks = _acceptance(rows, args.peers, conns)
    print()
    print("acceptance (pccl_aio in place, out of place (-oop) and in place without the "
          "restore copy (-norestore) vs gloo and TCP, same run):")
    for c in checks:
        print(f"  {c['what']:<45} {c['value']:7.3f}  target {c['target']:<7} "
              f"{'ok' if c['ok'] else 'MISS'}")
    elapsed = time.perf_counter() - t_start
    for impl in (IMPL[pl] for pl in args.placement):
        mine = [c for c in checks if c["impl"] == impl]
        print(f"{impl}: {sum(c['ok'] for c in mine)}/{len(mine)} targets met")
    print(f"all results checked exactly on every rank; {elapsed:.0f} s")
    print()
    emit_json_lines("allreduce_compare_gloo", rows, args.json, tcp1_GBps=tcp1, tcp4_GBps=tcp4,
                    tcp_before_GBps=tcp_start, tcp_after_GBps=tcp_end,
                    loop="uvloop", torch=torch.__version__, cpus=os.cpu_count(),
                    warmup=args.warmup, rounds=args.rounds, conns=conns, acceptance=checks,
                    all_ok=all(c["ok"] for c in checks), elapsed_s=elapsed)


# ---- default mode -------------------------------------------------------------------------------
def _run_config(world: int, nbytes: int, iters: int, conns: int, warmup: int) -> list[float]:
    return pccl.run(_run_pccl(world, conns, warmup, [(nbytes, iters)]))[nbytes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", choices=["gloo"],
                    help="also run torch.distributed gloo on the same P and sizes")
    ap.add_argument("--peers", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--mib", type=float, nargs="+", default=[1, 16, 64],
                    help="sizes in MiB (default mode)")
    ap.add_argument("--sizes", type=parse_size, nargs="+",
                    default=[4 << 10, 1 << 20, 16 << 20, 64 << 20],
                    help="sizes for --compare: bytes or with KiB/MiB suffixes")
    ap.add_argument("--conns", type=int, nargs="+", default=None,
                    help="pccl_aio connections per neighbour (default 1 4; 4 with --compare)")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations (at least)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3,
                    help="--compare: runs of each implementation per P, alternating, pooled")
    ap.add_argument("--tcp-seconds", type=float, default=1.0)
    ap.add_argument("--json", metavar="PATH", help="also write the JSON lines to PATH")
    ap.add_argument("--placement", nargs="+", choices=list(IMPL), default=list(IMPL),
                    help="--compare: pccl_aio in place (all_reduce(x): keeps a copy of x to "
                         "restore it after an abort), out of place (all_reduce(x, y): x is "
                         "only read, nothing is copied) and/or norestore (in place with "
                         "restore_on_abort=False, no copy, like gloo, which restores nothing)"),
    ap.add_argument("--peer", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        addr, w, k, wu, plan, placement = args.peer
        pccl.run(_peer(addr, int(w), int(k), int(wu), _parse_plan(plan), placement))
        return
    if args.iters < 1 or args.warmup < 0 or args.rounds < 1:
        raise SystemExit("--iters and --rounds must be >= 1, --warmup >= 0")
    if args.compare == "gloo":
        _compare_gloo(args)
        return
    tcp1 = tcp_loopback_gbps(1, args.tcp_seconds)
    print(f"single-stream loopback TCP: {tcp1:.3f} GB/s (baseline, same run)")
    rows = []
    for world in args.peers:
        for mib in args.mib:
            for k in args.conns or [1, 4]:
                nbytes = int(mib * 2**20) // 4 * 4
                times = _run_config(world, nbytes, args.iters, k, args.warmup)
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
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps({"bench": "allreduce", "tcp1_GBps": tcp1, "loop": "uvloop",
                                "rows": rows}) + "\n")


if __name__ == "__main__":
    main()
