"""CPU cost of one all-reduce: user and system CPU of all ranks, pccl_aio against gloo.

    python bench/cpu_cost.py [--peers 3] [--mib 16 64] [--iters 30] [--rounds 2]
                             [--placement in out norestore] [--variant NAME=PATH ...]
                             [--json PATH]

On a machine with fewer cores than ranks (P = 3 on 2 cores), wall time follows the CPU that
all ranks burn together, so this is the figure to shrink. Each rank process runs ``--iters``
back-to-back all-reduces (float32 SUM, after 3 warm-up ones; the input is not refilled
between iterations, so nothing but the collective runs in the timed window) and reports
``getrusage`` user and system CPU over the timed loop, and its wall time. The table gives,
per all-reduce, the slowest rank's wall time and the CPU summed over the ranks (for pccl_aio
also the master's, which runs in this process), and both as ratios to gloo (in place,
``torch.distributed`` with ``OMP_NUM_THREADS=1``) measured in the same round; rounds
alternate the order. ``--variant NAME=PATH`` (repeatable) also runs the ranks of another
checkout of pccl_aio (its extension built; the master stays this one), so two versions of the
data path are compared in the same rounds. ``mem_x`` is the memory a rank's library holds
beyond the user's buffers: the growth of its peak RSS from just before the first all-reduce
(input, and output if out of place, already touched) to the end, in units of the buffer size
(the largest over ranks). Prints a table and JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit_json_lines, init_gloo_rank, join_world, median, print_table

HERE = Path(__file__).resolve().parent
WARMUP = 3
SUFFIX = {"in": "", "out": "-oop", "norestore": "-norestore"}  # --placement -> row name


def _usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


def _peak_rss() -> int:
    """Peak resident memory of this process so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _report(wall: float, u0: tuple[float, float, int], iters: int, rss0: int) -> None:
    u1 = _usage()
    print(json.dumps({"wall": wall / iters, "user": (u1[0] - u0[0]) / iters,
                      "sys": (u1[1] - u0[1]) / iters, "csw": (u1[2] - u0[2]) / iters,
                      "extra": _peak_rss() - rss0}), flush=True)


async def _pccl_rank(addr: str, world: int, iters: int, nbytes: int, placement: str) -> None:
    import numpy as np

    import pccl_aio as pccl

    async with pccl.Communicator(addr) as comm:
        await join_world(comm, world)
        x = np.ones(nbytes // 4, np.float32)
        # y touched first, so the peak below counts only the library's memory
        y = np.zeros_like(x) if placement == "out" else x
        keep = placement != "norestore"
        rss0 = _peak_rss()
        for _ in range(WARMUP):
            await comm.all_reduce(x, y, tag=0, restore_on_abort=keep)
        wall, u0 = 0.0, _usage()
        for _ in range(iters):
            t0 = time.perf_counter()
            await comm.all_reduce(x, y, tag=0, restore_on_abort=keep)
            wall += time.perf_counter() - t0
        _report(wall, u0, iters, rss0)


def _gloo_rank(rank: int, world: int, port: int, iters: int, nbytes: int) -> None:
    torch = init_gloo_rank(rank, world, port)
    dist = torch.distributed
    x = torch.ones(nbytes // 4)
    rss0 = _peak_rss()
    for _ in range(WARMUP):
        dist.all_reduce(x)
    wall, u0 = 0.0, _usage()
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        wall += time.perf_counter() - t0
    _report(wall, u0, iters, rss0)
    dist.destroy_process_group()


def _collect(procs: list[subprocess.Popen[str]]) -> list[dict[str, float]]:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"FAILED: a rank exited with {p.returncode}:\n{err[-2000:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def _env(path: Path = HERE.parent) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo"}


def _run_gloo(world: int, iters: int, nbytes: int) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--gloo-rank", str(r), str(world),
                               str(port), str(iters), str(nbytes)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env())
             for r in range(world)]
    return _summary(_collect(procs), 0.0, nbytes)


async def _run_pccl(world: int, iters: int, nbytes: int, placement: str,
                    path: Path = HERE.parent) -> dict[str, float]:
    import pccl_aio as pccl

    async with pccl.Master("127.0.0.1", 0) as master:
        u0 = _usage()
        procs = [subprocess.Popen([sys.executable, __file__, "--pccl-rank", master.address,
                                   str(world), str(iters), str(nbytes), placement],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=_env(path)) for _ in range(world)]
        outs = await asyncio.to_thread(_collect, procs)
        u1 = _usage()
    # the master's CPU over the whole run (warm-up and connection set-up included)
    return _summary(outs, (u1[0] - u0[0] + u1[1] - u0[1]) / (iters + WARMUP), nbytes)


def _summary(outs: list[dict[str, float]], master: float, nbytes: int) -> dict[str, float]:
    user, sys_ = sum(o["user"] for o in outs), sum(o["sys"] for o in outs)
    return {"wall_ms": max(o["wall"] for o in outs) * 1e3, "user_ms": user * 1e3,
            "sys_ms": sys_ * 1e3, "master_ms": master * 1e3,
            "cpu_ms": (user + sys_ + master) * 1e3,
            "csw": sum(o["csw"] for o in outs) / len(outs),
            "mem_x": max(o["extra"] for o in outs) / nbytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[3])
    ap.add_argument("--mib", type=float, nargs="+", default=[16, 64])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--placement", nargs="+", choices=list(SUFFIX), default=["in", "out"],
                    help="in place, out of place (-oop), in place with "
                         "restore_on_abort=False (-norestore)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PATH",
                    help="also run the ranks from another pccl_aio checkout")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--pccl-rank", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--gloo-rank", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pccl_rank:
        import pccl_aio as pccl

        addr, w, it, n, o = args.pccl_rank
        pccl.run(_pccl_rank(addr, int(w), int(it), int(n), o))
        return
    if args.gloo_rank:
        r, w, port, it, n = args.gloo_rank
        _gloo_rank(int(r), int(w), int(port), int(it), int(n))
        return
    if args.iters < 1 or args.rounds < 1:
        raise SystemExit("--iters and --rounds must be >= 1")
    import pccl_aio as pccl

    paths = {"pccl_aio": HERE.parent}
    for v in args.variant:
        name, sep, path = v.partition("=")
        if not sep or name in ("gloo", *paths) or not (Path(path) / "pccl_aio").is_dir():
            raise SystemExit(f"bad variant {v!r}: NAME=PATH of a checkout holding pccl_aio/")
        paths[name] = Path(path).resolve()
    runs = {name + SUFFIX[p]: (name, p) for name in paths for p in args.placement}
    impls = ["gloo", *runs]
    rows: list[dict[str, Any]] = []
    for world in args.peers:
        for mib in args.mib:
            nbytes = int(mib * 2**20) // 4 * 4
            got: dict[str, list[dict[str, float]]] = {i: [] for i in impls}
            for rnd in range(args.rounds):
                for impl in impls if rnd % 2 == 0 else impls[::-1]:
                    if impl == "gloo":
                        got[impl].append(_run_gloo(world, args.iters, nbytes))
                    else:
                        name, placement = runs[impl]
                        got[impl].append(pccl.run(_run_pccl(world, args.iters, nbytes,
                                                            placement, paths[name])))
            g_wall = median([r["wall_ms"] for r in got["gloo"]])
            g_cpu = median([r["cpu_ms"] for r in got["gloo"]])
            for impl in impls:
                rs = got[impl]
                row: dict[str, Any] = {"impl": impl, "P": world, "MiB": mib}
                for k in ("wall_ms", "user_ms", "sys_ms", "master_ms", "cpu_ms", "csw", "mem_x"):
                    row[k] = median([r[k] for r in rs])
                row["wall_vs_gloo"] = row["wall_ms"] / g_wall
                row["cpu_vs_gloo"] = row["cpu_ms"] / g_cpu
                rows.append(row)
                print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items()), flush=True)
    print()
    print(f"per all-reduce: wall = slowest rank, CPU = user + sys of all ranks (+ the master's "
          f"for pccl_aio), medians of {args.rounds} rounds of {args.iters} iterations; "
          "*_vs_gloo = ratio to gloo in the same rounds (lower is better); csw = context "
          "switches per rank and all-reduce (voluntary + involuntary); mem_x = the "
          "largest rank's growth of peak RSS over the all-reduces, in buffer sizes")
    print_table(rows, list(rows[0]), {k: ".2f" for k in rows[0] if k not in ("impl", "P")})
    emit_json_lines("cpu_cost", rows, args.json, iters=args.iters, rounds=args.rounds)


if __name__ == "__main__":
    main()
