"""One rank of the gloo baseline of ``bench/collectives.py`` (run as a subprocess).

    python bench/_gloo_collectives.py RANK WORLD STORE_PORT WARMUP PLAN

PLAN is ``kind:nbytes:iters[,...]`` (kind: broadcast, all_gather, reduce_scatter, barrier;
nbytes per rank). The rank joins the process group through the TCPStore the bench process
serves on 127.0.0.1:STORE_PORT. For a data kind it runs WARMUP + iters iterations of: refill
the input and reset the output (untimed, ``_common.CollectiveCase``), ``dist.barrier()``
(untimed, so every rank starts together), ``time.perf_counter()`` around the one collective,
then an exact check of the whole result. The calls: ``dist.broadcast(t, src=i mod P)``,
``dist.all_gather_single(out, inp)`` and ``dist.reduce_scatter_single(out, inp)`` (SUM), the
names torch 2.13 gives ``all_gather_into_tensor`` / ``reduce_scatter_tensor``, which are
deprecated aliases of them there (older torch: those names). For ``barrier`` it times
``dist.barrier()`` alone, back to back (the previous barrier lines the ranks up), after
``BARRIER_WARMUP`` untimed ones. Prints one JSON line per case,
``{"kind": k, "nbytes": n, "times": [...]}`` (timed iterations only); a wrong result exits with
status 3 and a message on stderr. One compute thread, as ``bench/_gloo.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from _common import CollectiveCase, parse_collective_plan

BARRIER_WARMUP = 20


def _ops(dist: Any) -> dict[str, Callable[[Any, Any, int], None]]:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return {
        "broadcast": lambda src, dst, root: dist.broadcast(src, src=root),
        "all_gather": lambda src, dst, root: gather(dst, src),
        "reduce_scatter": lambda src, dst, root: scatter(dst, src, op=dist.ReduceOp.SUM),
    }


def _time_case(dist: Any, torch: Any, kind: str, nbytes: int, warmup: int, iters: int
               ) -> list[float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    case = CollectiveCase(kind, rank, world, nbytes // 4)
    src, dst = torch.from_numpy(case.src), torch.from_numpy(case.dst)  # share the memory
    op = _ops(dist)[kind]
    times = []
    for i in range(warmup + iters):
        root = case.refill(i)
        dist.barrier()
        t0 = time.perf_counter()
        op(src, dst, root)
        dt = time.perf_counter() - t0
        err = case.check(i, f"gloo rank {rank}/{world}, {nbytes} B, iteration {i}")
        if err:
            print(err, file=sys.stderr, flush=True)
            sys.exit(3)
        if i >= warmup:
            times.append(dt)
    return times


def _time_barrier(dist: Any, iters: int) -> list[float]:
    times = []
    for i in range(BARRIER_WARMUP + iters):
        t0 = time.perf_counter()
        dist.barrier()
        if i >= BARRIER_WARMUP:
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads its OpenMP runtime
    import torch
    import torch.distributed as dist

    rank, world, port, warmup = (int(a) for a in sys.argv[1:5])
    plan = parse_collective_plan(sys.argv[5])
    torch.set_num_threads(1)
    timeout = timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    dist.barrier()
    for kind, nbytes, iters in plan:
        times = (_time_barrier(dist, iters) if kind == "barrier"
                 else _time_case(dist, torch, kind, nbytes, warmup, iters))
        print(json.dumps({"kind": kind, "nbytes": nbytes, "times": times}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
