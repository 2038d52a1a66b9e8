"""One rank of the gloo baseline of ``bench/allreduce.py --compare gloo`` (run as a subprocess).

    python bench/_gloo.py RANK WORLD STORE_PORT WARMUP PLAN

PLAN is ``nbytes:iters[,nbytes:iters...]``. The rank joins the process group through the
TCPStore the bench process serves on 127.0.0.1:STORE_PORT, then for each size all-reduces a
float32 tensor (SUM, in place) WARMUP + iters times: refill the input, ``dist.barrier()``
(untimed, so every rank starts the collective together), ``time.perf_counter()`` around
``dist.all_reduce``, check the whole result exactly. Prints one JSON line per size,
``{"nbytes": n, "times": [...]}`` (timed iterations only); a wrong result exits with status 3
and a message on stderr.

One compute thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``): the machine this was
written on has 2 cores and runs up to 4 ranks, so intra-op threads would only fight over them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

from _common import check_result, input_pattern


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads its OpenMP runtime
    import torch
    import torch.distributed as dist

    rank, world, port, warmup = (int(a) for a in sys.argv[1:5])
    plan = [tuple(int(v) for v in item.split(":")) for item in sys.argv[5].split(",")]
    torch.set_num_threads(1)
    timeout = timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    dist.barrier()
    for nbytes, iters in plan:
        base = input_pattern(nbytes // 4)
        expected = base * world
        x = torch.empty(base.size, dtype=torch.float32)
        xn = x.numpy()  # shares memory with x
        times = []
        for i in range(warmup + iters):
            x.copy_(torch.from_numpy(base))
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            dt = time.perf_counter() - t0
            err = check_result(xn, expected, f"gloo rank {rank}/{world}, {nbytes} B, iteration {i}")
            if err:
                print(err, file=sys.stderr, flush=True)
                sys.exit(3)
            if i >= warmup:
                times.append(dt)
        print(json.dumps({"nbytes": nbytes, "times": times}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
