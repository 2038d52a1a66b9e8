"""Paired A/B runs of the P-peer loopback all-reduce: which of two code versions is faster?

    python bench/paired.py --variant base=/tmp/base --variant new=. [--variant gloo]
                           [--peers 3] [--mib 64] [--rounds 6] [--seconds 3] [--placement in]

Each variant is ``NAME=PATH`` (a checkout of pccl_aio with its extension built, put first on
PYTHONPATH; ``NAME=PATH:SEGMENT_BYTES`` also overrides the pipeline segment size) or ``gloo``
(torch.distributed, as in ``allreduce.py --compare gloo``). A round runs every variant once,
in order, each for ``--seconds`` of back-to-back all-reduces in fresh processes (a barrier and a
stop vote between iterations, untimed); a variant's figure for the round is the slowest peer's
mean time. The table gives each variant's median over rounds and the median of its per-round
ratio to the first variant.

Why paired: on the small shared VMs this project is measured on, the speed of the whole
machine drifts by 20-30 % within minutes, so two variants measured minutes apart cannot be
compared; within a round they run seconds apart and the ratio cancels most of the drift.
Results are not checked here (``allreduce.py`` does that); this is for deciding between code
versions. Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


# ---- one peer / one gloo rank (subprocess) -------------------------------------------------
async def _pccl_peer(addr: str, world: int, seconds: float, nbytes: int, out: bool) -> None:
    import numpy as np
    from _common import join_world

    import pccl_aio as pccl

    if os.environ.get("PCCL_BENCH_SEGMENT"):
        import importlib

        for name in ("pccl_aio._peer.data.paths.ring",  # one data path per kind
                     "pccl_aio._peer.data.collective",  # _peer/ by concern, before the paths
                     "pccl_aio._peer.collective", "pccl_aio._collective"):  # older checkouts
            try:
                _collective = importlib.import_module(name)
                break
            except ImportError:
                continue
        _collective.SEGMENT_BYTES = int(os.environ["PCCL_BENCH_SEGMENT"])
    async with pccl.Communicator(addr) as comm:
        await join_world(comm, world)
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x) if out else x
        sync, stop = np.zeros(1, np.float32), np.zeros(1, np.float32)
        end, n, total = time.monotonic() + seconds, 0, 0.0
        while True:
            np.copyto(x, 1.0)
            await comm.all_reduce(sync, tag=1)
            stop[0] = time.monotonic() > end
            await comm.all_reduce(stop, tag=2, op=pccl.ReduceOp.MAX)
            if stop[0]:
                break
            t0 = time.perf_counter()
            await comm.all_reduce(x, y, tag=0)
            total += time.perf_counter() - t0
            n += 1
    print(json.dumps({"mean_s": total / max(n, 1), "iters": n}), flush=True)


def _gloo_rank(rank: int, world: int, port: int, seconds: float, nbytes: int) -> None:
    from _common import init_gloo_rank

    torch = init_gloo_rank(rank, world, port)
    dist = torch.distributed
    x = torch.ones(nbytes // 4)
    end, n, total = time.monotonic() + seconds, 0, 0.0
    while True:
        x.fill_(1.0)
        dist.barrier()
        stop = torch.tensor([float(time.monotonic() > end)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        t0 = time.perf_counter()
        dist.all_reduce(x)
        total += time.perf_counter() - t0
        n += 1
    dist.destroy_process_group()
    print(json.dumps({"mean_s": total / max(n, 1), "iters": n}), flush=True)


# ---- the driver ----------------------------------------------------------------------------
def _env(path: str | None, segment: str | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(path).resolve()), str(HERE)])
    if segment:
        env["PCCL_BENCH_SEGMENT"] = segment
    return env


def _slowest(procs: list[subprocess.Popen[str]], timeout: float) -> float:
    means = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"FAILED: a process exited with {p.returncode}:\n{err[-2000:]}")
        means.append(json.loads(out.strip().splitlines()[-1])["mean_s"])
    return max(means)


def _run_variant(spec: str, args: argparse.Namespace) -> float:
    nbytes, world, secs = int(args.mib * 2**20) // 4 * 4, args.peers, args.seconds
    me = [sys.executable, str(Path(__file__).resolve())]
    if spec == "gloo":
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen([*me, "--gloo-rank", str(r), str(world), str(port), str(secs),
                                   str(nbytes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=_env(None, None)) for r in range(world)]
        return _slowest(procs, secs + 120)
    path, _, segment = spec.partition("=")[2].partition(":")
    code = (f"import pccl_aio, paired; pccl_aio.run(paired.main_master({world}, {secs!r}, "
            f"{nbytes}, {args.placement == 'out'!r}))")
    master = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env(path, segment))
    out, err = master.communicate(timeout=secs + 120)
    if master.returncode != 0:
        raise SystemExit(f"FAILED: variant {spec}:\n{err[-2000:]}")
    return float(out.strip().splitlines()[-1])


async def main_master(world: int, secs: float, nbytes: int, out: bool) -> None:
    """Serve a master and run ``world`` peer processes of the pccl_aio on PYTHONPATH."""
    import pccl_aio as pccl

    async with pccl.Master("127.0.0.1", 0) as master:
        procs = [subprocess.Popen(
            [sys.executable, str(HERE / "paired.py"), "--pccl-peer", master.address, str(world),
             str(secs), str(nbytes), str(int(out))], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=dict(os.environ)) for _ in range(world)]
        slowest = await asyncio.to_thread(_slowest, procs, secs + 120)
    print(slowest, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=PATH[:SEGMENT_BYTES] or gloo; the first is the reference")
    ap.add_argument("--peers", type=int, default=3)
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--placement", choices=["in", "out"], default="in")
    ap.add_argument("--pccl-peer", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--gloo-rank", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pccl_peer:
        addr, w, s, n, o = args.pccl_peer
        import pccl_aio  # the checkout's, from PYTHONPATH

        pccl_aio.run(_pccl_peer(addr, int(w), float(s), int(n), o == "1"))  # uvloop, as in use
        return
    if args.gloo_rank:
        r, w, port, s, n = args.gloo_rank
        _gloo_rank(int(r), int(w), int(port), float(s), int(n))
        return
    if len(args.variant) < 2:
        raise SystemExit("give at least two --variant")
    for v in args.variant:
        if v != "gloo" and "=" not in v:
            raise SystemExit(f"bad variant {v!r}: NAME=PATH[:SEGMENT_BYTES] or gloo")
    names = [v.split("=")[0] for v in args.variant]
    rows: list[list[float]] = []
    for rnd in range(args.rounds):
        rows.append([_run_variant(v, args) for v in args.variant])
        print(f"round {rnd + 1}/{args.rounds}: "
              + "  ".join(f"{n} {t * 1e3:.1f} ms" for n, t in zip(names, rows[-1])), flush=True)
    print(f"\nP={args.peers} {args.mib:g} MiB float32 SUM, {args.placement} place; "
          f"{args.rounds} rounds of {args.seconds:g} s per variant")
    print(f"{'variant':<16}{'median_ms':>10}{'ratio_vs_' + names[0]:>22}  per-round ratios")
    result = {}
    for j, name in enumerate(names):
        col = [r[j] for r in rows]
        ratios = [r[j] / r[0] for r in rows]
        result[name] = {"median_ms": statistics.median(col) * 1e3,
                        "ratio_median": statistics.median(ratios), "ratios": ratios}
        print(f"{name:<16}{result[name]['median_ms']:>10.1f}{result[name]['ratio_median']:>22.3f}"
              f"  {' '.join(f'{x:.2f}' for x in ratios)}")
    print(json.dumps({"bench": "paired", "peers": args.peers, "mib": args.mib,
                      "placement": args.placement, "variants": args.variant, "result": result}))


if __name__ == "__main__":
    main()
