"""Broadcast, all-gather, reduce-scatter and barrier of pccl_aio against torch.distributed gloo,
measured in the same run on loopback; all-gather over an emulated WAN link.

    python bench/collectives.py [--peers 2 3] [--mib 1 16 64]
                                [--kinds broadcast all_gather reduce_scatter barrier]
                                [--iters 10] [--warmup 3] [--rounds 3] [--barrier-iters 200]
                                [--conns auto] [--json PATH] [--quick]
    python bench/collectives.py --wan [--mib 64] [--iters 3] [--warmup 2] [--conns auto]
                                [--delay-ms 50] [--rate-mbit 1000] [--no-tcp] [--json PATH]

Loopback mode (the ``bench/allreduce.py --compare gloo`` set-up): for every P and round, gloo
runs with P rank processes (``bench/_gloo_collectives.py``, joined through a TCPStore this
process serves on an OS-chosen port) and pccl_aio with P peer processes and a master in this
process, ``p2p_connections`` = ``--conns`` (default: the library's automatic choice; the
connections a link actually got are the K column). Each runs ``--rounds`` times per P with
fresh processes, alternating gloo / pccl_aio and swapping which goes first from one round and P
to the next, so that drift on the shared machine hits both alike; the timed iterations of all
rounds are pooled. Every rank runs with OMP_NUM_THREADS=1.

Sizes are MiB per rank (float32): the broadcast tensor is S; all-gather takes S from every rank
and returns P x S; reduce-scatter takes P x S and returns S (chunk r of the SUM to rank r).
Both sides do the same per iteration, with the same buffers (``_common.CollectiveCase``):
refill the input and reset the output (untimed), an untimed barrier (gloo ``dist.barrier()``,
pccl_aio ``comm.barrier()``) so the ranks start together, ``time.perf_counter()`` around the one
collective, then an exact check of the whole result on every rank (a wrong result fails the
bench with a non-zero exit status). The broadcast root is rank i mod P in iteration i. gloo
calls ``dist.broadcast``, ``dist.all_gather_single`` and ``dist.reduce_scatter_single`` (what
torch 2.13 calls ``all_gather_into_tensor`` / ``reduce_scatter_tensor``: deprecated aliases);
pccl_aio ``comm.broadcast(t, root=r)``, ``comm.all_gather(src, dst)`` and
``comm.reduce_scatter(src, dst, op=SUM)``. An iteration's time is the slowest rank's. Timed
iterations per size: max(iters, min(10 x iters, 256 MiB / S)) after ``--warmup``. The barrier
is timed alone: ``--barrier-iters`` barriers back to back (each one lines the ranks up for the
next) after 20 untimed ones; its row gives the median latency.

Bus bandwidth, GB/s (1e9 B), the NCCL convention: broadcast busbw = algbw = S / t; all-gather
and reduce-scatter algbw = P x S / t, busbw = algbw x (P - 1) / P = (P - 1) x S / t. vs_gloo is
pccl_aio / gloo median busbw (barrier: median latency pccl_aio / gloo, lower is better);
vs_tcp1 divides busbw by single-stream loopback TCP (the mean of before and after). The table
gives median and best time, median busbw and the spread of the per-round medians (slowest /
fastest); JSON lines (one per row with every time, then a summary with the acceptance checks:
busbw >= 1.0 x gloo for the three data kinds at 16 and 64 MiB, barrier latency <= 1.0 x gloo
at P = 2 and 3) go to stdout and to ``--json PATH``. ``--quick``: 256 KiB and 1 MiB, 3 timed
iterations, one round, 50 barriers: a smoke run (under a minute on 2 cores).

``--wan`` (needs root): an all-gather of ``--mib`` MiB per rank (default 64) at P = 2 over
``../shared/tools/wan-link`` (100 ms RTT, 1 Gbit/s by default; brought up, and down at the
end, unless already up; ``net.ipv4.tcp_slow_start_after_idle=0`` in both namespaces, as
``bench/wan.py``), master and peer A in namespace A, peer B in namespace B, automatic
connections unless ``--conns``. Same iteration as above (untimed barrier, timed all-gather,
exact check). At P = 2 each direction carries S per all-gather, so S / t is the rate each way
(= busbw), given against the nominal link rate and raw TCP over the same link with 1 and 8
streams (``bench/wan.py``'s baseline, steady state after the first second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import (
    COLLECTIVE_KINDS,
    CollectiveCase,
    CollectivePlan,
    collective_plan_arg,
    emit_json_lines,
    finish_peers,
    join_world,
    median,
    parse_collective_plan,
    print_table,
    size_label,
    tcp_loopback_gbps,
)
from _gloo_collectives import BARRIER_WARMUP
from allreduce import _child_env, _collect

import pccl_aio as pccl

HERE = Path(__file__).resolve().parent
GLOO_RANK = HERE / "_gloo_collectives.py"
DATA_KINDS = ("broadcast", "all_gather", "reduce_scatter")
Key = tuple[str, int]  # (kind, bytes per rank)
Result = dict[Key, dict[str, Any]]  # -> {"times": slowest rank's per iteration, "k": conns}


# ---- pccl_aio peer (subprocess) -----------------------------------------------------------------
def _call(comm: pccl.Communicator, case: CollectiveCase) -> Callable[[int], Any]:
    """root -> the awaitable of one collective of ``case``'s kind on ``case``'s buffers."""
    if case.kind == "broadcast":
        return lambda root: comm.broadcast(case.src, root=root)
    if case.kind == "all_gather":
        return lambda root: comm.all_gather(case.src, case.dst)
    return lambda root: comm.reduce_scatter(case.src, case.dst, op=pccl.ReduceOp.SUM)


async def _time_case(comm: pccl.Communicator, world: int, kind: str, nbytes: int, warmup: int,
                     iters: int) -> list[float]:
    case = CollectiveCase(kind, comm.rank, world, nbytes // 4)
    call = _call(comm, case)
    times = []
    for i in range(warmup + iters):
        root = case.refill(i)
        await comm.barrier(tag=1)  # untimed: all peers start together
        t0 = time.perf_counter()
        await call(root)
        dt = time.perf_counter() - t0
        err = case.check(i, f"pccl_aio peer rank {comm.rank}/{world}, {nbytes} B, iteration {i}")
        if err:
            print(err, file=sys.stderr, flush=True)
            raise SystemExit(3)
        if i >= warmup:
            times.append(dt)
    return times


async def _time_barriers(comm: pccl.Communicator, iters: int) -> list[float]:
    times = []
    for i in range(BARRIER_WARMUP + iters):
        t0 = time.perf_counter()
        await comm.barrier()
        if i >= BARRIER_WARMUP:
            times.append(time.perf_counter() - t0)
    return times


async def _time_plan(comm: pccl.Communicator, world: int, warmup: int,
                     plan: CollectivePlan) -> None:
    """Run ``plan``, one JSON line per case; the connections of the links are read while every
    peer is still there (the last barrier keeps them)."""
    for kind, nbytes, iters in plan:
        times = await (_time_barriers(comm, iters) if kind == "barrier"
                       else _time_case(comm, world, kind, nbytes, warmup, iters))
        k = max(comm._data.link_connections().values(), default=0)
        print(json.dumps({"kind": kind, "nbytes": nbytes, "times": times, "k": k}), flush=True)
    await comm.barrier(tag=1)


async def _peer(addr: str, world: int, conns: int | None, warmup: int,
                plan: CollectivePlan) -> None:
    async with pccl.Communicator(addr, p2p_connections=conns) as comm:
        await join_world(comm, world)
        await _time_plan(comm, world, warmup, plan)


def _conns(text: str) -> int | None:
    return None if text == "auto" else int(text)


# ---- process plumbing ---------------------------------------------------------------------------
def _slowest(outs: list[str], plan: CollectivePlan) -> Result:
    """Per case: for each timed iteration the slowest rank's time; the most connections a
    rank's link got (absent for gloo)."""
    per_rank = [{(r["kind"], r["nbytes"]): r for r in map(json.loads, out.strip().splitlines())}
                for out in outs]
    res: Result = {}
    for kind, n, _ in plan:
        rs = [r[(kind, n)] for r in per_rank]
        res[(kind, n)] = {"times": [max(ts) for ts in zip(*(r["times"] for r in rs))],
                          "k": max((r["k"] for r in rs if "k" in r), default=None)}
    return res


async def _run_pccl(world: int, conns: str, warmup: int, plan: CollectivePlan) -> Result:
    async with pccl.Master("127.0.0.1", 0) as master:
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--peer", master.address, str(world), conns, str(warmup),
            collective_plan_arg(plan), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=_child_env()) for _ in range(world)]
        outs = await _collect(procs, f"pccl_aio collectives, P={world}")
    return _slowest(outs, plan)


async def _run_gloo(world: int, warmup: int, plan: CollectivePlan) -> Result:
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, str(GLOO_RANK), str(rank), str(world), str(store.port), str(warmup),
        collective_plan_arg(plan), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=_child_env()) for rank in range(world)]
    outs = await _collect(procs, f"gloo collectives, P={world}")
    del store
    return _slowest(outs, plan)


# ---- results ------------------------------------------------------------------------------------
def bus_bytes(kind: str, world: int, nbytes: int) -> int | None:
    """Bytes whose rate is busbw (NCCL): S for broadcast, (P - 1) x S for all-gather and
    reduce-scatter (algbw P x S / t times (P - 1) / P); None for barrier."""
    return {"broadcast": nbytes, "all_gather": (world - 1) * nbytes,
            "reduce_scatter": (world - 1) * nbytes}.get(kind)


def _row(impl: str, world: int, kind: str, nbytes: int, rounds: list[list[float]],
         k: int | None, tcp1: float) -> dict[str, Any]:
    times = [t for r in rounds for t in r]
    med, best = median(times), min(times)
    round_meds = [median(r) for r in rounds]
    bus = bus_bytes(kind, world, nbytes)
    busbw = None if bus is None else bus / med / 1e9
    return {"impl": impl, "P": world, "kind": kind,
            "size": "-" if kind == "barrier" else size_label(nbytes), "bytes": nbytes,
            "K": k, "iters": len(times), "median_ms": med * 1e3, "best_ms": best * 1e3,
            "busbw_med": busbw, "busbw_best": None if bus is None else bus / best / 1e9,
            "vs_gloo": None, "vs_gloo_of": "latency" if bus is None else "busbw",
            "vs_tcp1": None if busbw is None else busbw / tcp1,
            "round_spread": max(round_meds) / min(round_meds),
            "round_median_ms": [round(m * 1e3, 4) for m in round_meds],
            "times_ms": [[round(t * 1e3, 4) for t in r] for r in rounds]}


def _rows(runs: dict[int, dict[str, dict[Key, list[dict[str, Any]]]]], plan: CollectivePlan,
          tcp1: float) -> list[dict[str, Any]]:
    rows = []
    for world, by_impl in runs.items():
        for kind, n, _ in plan:
            g, p = ([r["times"] for r in by_impl[impl][(kind, n)]] for impl in ("gloo", "pccl"))
            k = max(r["k"] for r in by_impl["pccl"][(kind, n)])
            grow = _row("gloo", world, kind, n, g, None, tcp1)
            prow = _row("pccl_aio", world, kind, n, p, k, tcp1)
            prow["vs_gloo"] = (prow["median_ms"] / grow["median_ms"] if kind == "barrier"
                               else prow["busbw_med"] / grow["busbw_med"])
            rows += [grow, prow]
    return rows


def _acceptance(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = []
    for r in (r for r in rows if r["impl"] == "pccl_aio"):
        if r["kind"] in DATA_KINDS and r["size"] in ("16MiB", "64MiB"):
            what, target, ok = "busbw", ">= 1.0", r["vs_gloo"] >= 1.0
        elif r["kind"] == "barrier" and r["P"] in (2, 3):
            what, target, ok = "median latency", "<= 1.0", r["vs_gloo"] <= 1.0
        else:
            continue
        size = "" if r["kind"] == "barrier" else f" {r['size']}"
        checks.append({"what": f"{r['kind']} {what} pccl_aio/gloo P={r['P']}{size}",
                       "value": r["vs_gloo"], "target": target, "ok": ok})
    return checks


def _print_results(rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    print("busbw in GB/s (1e9 B), NCCL convention: broadcast S/t, all_gather and reduce_scatter "
          "(P-1) x S/t, S = MiB per rank; time of an iteration = slowest rank's; vs_gloo = "
          "pccl_aio/gloo median busbw (barrier: median latency, lower is better); vs_tcp1 = "
          "median busbw / single-stream loopback TCP; K = connections per link (pccl_aio); "
          "iters pooled over the rounds; round_spread = slowest / fastest round median")
    table = [{**r, "K": "-" if r["K"] is None else r["K"]} for r in rows]
    cols = ["impl", "P", "kind", "size", "K", "iters", "median_ms", "best_ms", "busbw_med",
            "vs_gloo", "vs_tcp1", "round_spread"]
    print_table(table, cols, {"median_ms": ".3f", "best_ms": ".3f", "busbw_med": ".4f",
                              "vs_gloo": ".3f", "vs_tcp1": ".4f", "round_spread": ".2f"})
    print()
    for r in (r for r in rows if r["kind"] == "barrier"):
        print(f"barrier P={r['P']} {r['impl']}: median {r['median_ms'] * 1e3:.1f} us, "
              f"best {r['best_ms'] * 1e3:.1f} us")
    print("acceptance (pccl_aio vs gloo, same run):")
    for c in checks:
        print(f"  {c['what']:<52} {c['value']:7.3f}  target {c['target']:<7} "
              f"{'ok' if c['ok'] else 'MISS'}")
    print(f"{sum(c['ok'] for c in checks)}/{len(checks)} targets met")


def _plan(args: argparse.Namespace) -> CollectivePlan:
    plan: CollectivePlan = []
    for kind in args.kinds:
        if kind == "barrier":
            plan.append(("barrier", 0, args.barrier_iters))
            continue
        for mib in args.mib:
            n = int(mib * 2**20) // 4 * 4
            if n <= 0:
                raise SystemExit(f"--mib {mib}: less than one float32")
            plan.append((kind, n, max(args.iters, min(10 * args.iters, (256 << 20) // n))))
    return plan


def _compare(args: argparse.Namespace) -> None:
    import torch

    t_start = time.perf_counter()
    plan = _plan(args)
    print(f"# collectives pccl_aio vs gloo on 127.0.0.1: torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
          f"pccl_aio {pccl.__version__} (uvloop), p2p_connections={args.conns}, "
          f"OMP_NUM_THREADS=1 in every rank", flush=True)
    tcp_start = tcp_loopback_gbps(1, args.tcp_seconds)
    print(f"loopback TCP before: 1 stream {tcp_start:.3f} GB/s", flush=True)
    runs: dict[int, dict[str, dict[Key, list[dict[str, Any]]]]] = {}
    for idx, world in enumerate(args.peers):
        by_impl = runs.setdefault(world, {"gloo": {}, "pccl": {}})
        for rnd in range(args.rounds):
            order = ["gloo", "pccl"] if (idx + rnd) % 2 == 0 else ["pccl", "gloo"]
            for impl in order:
                res = pccl.run(_run_gloo(world, args.warmup, plan) if impl == "gloo"
                               else _run_pccl(world, args.conns, args.warmup, plan))
                for key, r in res.items():
                    by_impl[impl].setdefault(key, []).append(r)
            print(f"P={world} round {rnd + 1}/{args.rounds} ({' then '.join(order)}) done "
                  f"({time.perf_counter() - t_start:.0f} s)", flush=True)
    tcp_end = tcp_loopback_gbps(1, args.tcp_seconds)
    tcp1 = (tcp_start + tcp_end) / 2
    print(f"loopback TCP after: 1 stream {tcp_end:.3f} GB/s; mean {tcp1:.3f} GB/s (the vs_tcp1 "
          f"baseline)")
    print()
    rows = _rows(runs, plan, tcp1)
    checks = _acceptance(rows)
    _print_results(rows, checks)
    elapsed = time.perf_counter() - t_start
    print(f"all results checked exactly on every rank; {elapsed:.0f} s")
    print()
    emit_json_lines("collectives_compare_gloo", rows, args.json, tcp1_GBps=tcp1,
                    tcp_before_GBps=tcp_start, tcp_after_GBps=tcp_end, loop="uvloop",
                    torch=torch.__version__, cpus=os.cpu_count(), conns=args.conns,
                    warmup=args.warmup, rounds=args.rounds, barrier_warmup=BARRIER_WARMUP,
                    quick=args.quick, acceptance=checks, all_ok=all(c["ok"] for c in checks),
                    elapsed_s=elapsed)


# ---- WAN mode -----------------------------------------------------------------------------------
async def _wan_peer(addr: str, host: str, conns: int | None, nbytes: int, iters: int,
                    warmup: int) -> None:
    async with pccl.Communicator(addr, p2p_connections=conns, listen_host=host,
                                 data_timeout=60.0) as comm:
        await join_world(comm, 2)
        await _time_plan(comm, 2, warmup, [("all_gather", nbytes, iters)])


def _ns_peer(ns: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(HERE.parent)})


def _wan_all_gather(wan: Any, conns: str, nbytes: int, iters: int, warmup: int,
                    port: int = 48300) -> dict[str, Any]:
    m = wan.ns_python(wan.NS_A, "--master", str(port))
    assert m.stdout is not None
    m.stdout.readline()
    addr = f"{wan.IP_A}:{port}"
    try:
        args = (conns, str(nbytes), str(iters), str(warmup))
        outs = finish_peers([_ns_peer(wan.NS_A, "--wan-peer", addr, wan.IP_A, *args),
                             _ns_peer(wan.NS_B, "--wan-peer", addr, wan.IP_B, *args)], 600)
    finally:
        m.terminate()
        m.wait()
    return _slowest(outs, [("all_gather", nbytes, iters)])[("all_gather", nbytes)]


def _wan(args: argparse.Namespace) -> None:
    import wan

    if os.geteuid() != 0:
        raise SystemExit("--wan needs root (network namespaces)")
    nbytes = int(args.mib[0] * 2**20) // 4 * 4
    nan = float("nan")
    with wan.link(args.delay_ms, args.rate_mbit) as brought_up:
        if not brought_up:
            print("wan-link was already up: measuring over it as it is", flush=True)
        tcp1, tcp8 = (nan, nan) if args.no_tcp else (wan.tcp_rate(1, 6.0), wan.tcp_rate(8, 6.0))
        link = args.rate_mbit * 1e6 / 8
        print(f"link {link / 1e6:.0f} MB/s nominal, RTT {2 * args.delay_ms} ms; TCP 1 stream "
              f"{tcp1 / 1e6:.1f} MB/s, 8 streams {tcp8 / 1e6:.1f} MB/s", flush=True)
        res = _wan_all_gather(wan, args.conns, nbytes, args.iters, args.warmup)
    med = median(res["times"])
    rate = nbytes / med  # bytes each way per second at P = 2 (= busbw)
    row = {"kind": "all_gather", "P": 2, "size": size_label(nbytes), "K": args.conns,
           "K_used": res["k"], "iters": len(res["times"]), "median_s": med,
           "best_s": min(res["times"]), "MBps_each_way": rate / 1e6, "vs_link": rate / link,
           "vs_tcp8": rate / tcp8, "vs_tcp1": rate / tcp1,
           "times_s": [round(t, 4) for t in res["times"]]}
    print()
    print_table([row], [c for c in row if c != "times_s"])
    print(f"all-gather of {row['size']} per rank at P=2 (each direction carries it): "
          f"{row['vs_link']:.3f} of the link rate, {row['vs_tcp8']:.3f} of 8-stream TCP; "
          f"results checked exactly on both peers")
    emit_json_lines("collectives_wan", [row], args.json, link_MBps=link / 1e6,
                    tcp1_MBps=tcp1 / 1e6, tcp8_MBps=tcp8 / 1e6, delay_ms=args.delay_ms,
                    rate_mbit=args.rate_mbit, warmup=args.warmup, slow_start_after_idle=0)


# ---- command line -------------------------------------------------------------------------------
def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--mib", type=float, nargs="+",
                    help="MiB per rank (default 1 16 64; --quick 0.25 1; --wan 64)")
    ap.add_argument("--kinds", nargs="+", choices=COLLECTIVE_KINDS, default=COLLECTIVE_KINDS)
    ap.add_argument("--iters", type=int, help="timed iterations, at least (default 10; "
                    "--quick 3; --wan 3)")
    ap.add_argument("--warmup", type=int, help="default 3; --quick 1; --wan 2")
    ap.add_argument("--rounds", type=int, help="runs of each implementation per P, "
                    "alternating, pooled (default 3; --quick 1)")
    ap.add_argument("--barrier-iters", type=int, help="timed barriers (default 200; --quick 50)")
    ap.add_argument("--conns", default="auto",
                    help="pccl_aio p2p_connections: an int, or auto (the library's choice)")
    ap.add_argument("--tcp-seconds", type=float, default=1.0)
    ap.add_argument("--json", metavar="PATH", help="also write the JSON lines to PATH")
    ap.add_argument("--quick", action="store_true", help="small sizes, few iterations")
    ap.add_argument("--wan", action="store_true", help="all-gather over the emulated WAN link")
    ap.add_argument("--delay-ms", type=int, default=50, help="--wan: one-way delay")
    ap.add_argument("--rate-mbit", type=int, default=1000, help="--wan: link rate")
    ap.add_argument("--no-tcp", action="store_true", help="--wan: skip the raw TCP baselines")
    ap.add_argument("--peer", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--wan-peer", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    mode = "wan" if args.wan else "quick" if args.quick else "full"
    defaults = {"full": ([1, 16, 64], 10, 3, 3, 200), "quick": ([0.25, 1], 3, 1, 1, 50),
                "wan": ([64], 3, 2, 1, 200)}[mode]
    for name, value in zip(("mib", "iters", "warmup", "rounds", "barrier_iters"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        args.tcp_seconds = min(args.tcp_seconds, 0.3)
    _conns(args.conns)  # a bad value fails here, not in a peer
    if args.iters < 1 or args.warmup < 0 or args.rounds < 1 or args.barrier_iters < 1:
        raise SystemExit("--iters, --rounds and --barrier-iters must be >= 1, --warmup >= 0")
    return args


def main() -> None:
    args = _args()
    if args.peer:
        addr, w, k, wu, plan = args.peer
        pccl.run(_peer(addr, int(w), _conns(k), int(wu), parse_collective_plan(plan)))
    elif args.wan_peer:
        addr, host, k, n, iters, wu = args.wan_peer
        pccl.run(_wan_peer(addr, host, _conns(k), int(n), int(iters), int(wu)))
    elif args.wan:
        _wan(args)
    else:
        _compare(args)


if __name__ == "__main__":
    main()
