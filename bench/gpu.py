"""CUDA tensors through pccl_aio: correctness and the cost of staging them through host memory.

    python bench/gpu.py [--peers 2] [--mib 1 16 64] [--iters 10] [--kinds all_reduce ...]

A master and ``--peers`` communicators in this process (one event loop), all on GPU 0. First a
``SharedState`` and ``Buckets`` of CUDA tensors are checked (a sync from the highest revision,
bucketed sums). Then for every size and kind (all-reduce SUM in place, broadcast, all-gather,
reduce-scatter) the same inputs run once as CPU tensors and once as CUDA tensors: every peer's
CUDA result, copied back, must be bit-identical to the others' and to the CPU run's (a
difference fails the bench). Each path is timed (``--iters`` calls, alternated, median): the
ratio is CUDA / CPU time, the staging overhead (device-to-host and host-to-device copies
through pinned buffers on a side stream). Last, the ``torch.distributed`` backend: ``--peers``
processes of ``tests/process/torch_pg_peer.py`` on the default pccl_aio group, once with CPU
tensors and once with CUDA tensors and a CUDA DDP model: every ``dist.*`` collective's bytes
must equal the CPU run's, and DDP's parameters must be bit-identical across the processes.
Without a GPU it says so and exits 0, having measured nothing. Table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import emit_json, median, print_table

import pccl_aio as pccl

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter"]


def inputs(kind: str, n: int, world: int, rank: int, device: str) -> tuple:
    import torch

    g = torch.Generator().manual_seed(rank)
    x = torch.randint(-8, 8, (n * (world if kind == "reduce_scatter" else 1),),
                      generator=g).float().to(device)
    out = None
    if kind == "all_gather":
        out = torch.empty(world * n, device=device)
    elif kind == "reduce_scatter":
        out = torch.empty(n, device=device)
    return x, out


async def call(comm: pccl.Communicator, kind: str, x, out, tag: int):
    if kind == "all_reduce":
        await comm.all_reduce(x, tag=tag)
        return x
    if kind == "broadcast":
        await comm.broadcast(x, root=0, tag=tag)
        return x
    if kind == "all_gather":
        await comm.all_gather(x, out, tag=tag)
        return out
    await comm.reduce_scatter(x, out, tag=tag)
    return out


async def once(comms: list[pccl.Communicator], kind: str, n: int, device: str) -> list[bytes]:
    world = len(comms)
    args = [inputs(kind, n, world, c.rank, device) for c in comms]
    res = await asyncio.gather(*(call(c, kind, x, o, 1) for c, (x, o) in zip(comms, args)))
    return [r.cpu().numpy().tobytes() for r in res]


async def timed(comms: list[pccl.Communicator], kind: str, n: int, device: str) -> float:
    import torch

    world = len(comms)
    args = [inputs(kind, n, world, c.rank, device) for c in comms]
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    await asyncio.gather(*(call(c, kind, x, o, 2) for c, (x, o) in zip(comms, args)))
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


async def state_and_buckets(comms: list[pccl.Communicator]) -> None:
    """A ``SharedState`` of CUDA tensors synced from rank 0 (the highest revision) and
    ``Buckets`` of CUDA gradients all-reduced: every peer's tensors as expected, or exit."""
    import torch

    world = len(comms)
    ws = [torch.full((1 << 18,), float(c.rank), device="cuda") for c in comms]
    states = [pccl.SharedState({"w": w}, revision=3 if c.rank == 0 else 0)
              for c, w in zip(comms, ws)]
    await asyncio.gather(*(c.sync_shared_state(s) for c, s in zip(comms, states)))
    if not all(bool((w == 0).all()) for w in ws):
        raise SystemExit("SharedState of CUDA tensors: a peer did not receive rank 0's")
    gs = [[torch.full((1000,), float(c.rank + 1), device="cuda"),
           torch.full((3, 5), 1.0, device="cuda")] for c in comms]
    buckets = [pccl.Buckets(g, bucket_cap_mb=0.001) for g in gs]
    await asyncio.gather(*(b.all_reduce(c) for b, c in zip(buckets, comms)))
    total = world * (world + 1) / 2
    if not all(bool((g[0] == total).all() and (g[1] == world).all()) for g in gs):
        raise SystemExit("Buckets of CUDA tensors: wrong sums")


async def torch_backend(world: int) -> dict[str, bool]:
    """The ``torch.distributed`` group on CPU, then on CUDA tensors, ``world`` processes each:
    the collectives' digests must be equal across the two runs, DDP's across the processes."""
    runs: dict[str, list[dict]] = {}
    for dev in ("cpu", "cuda"):
        async with pccl.Master("127.0.0.1", 0, admission_interval=0.0) as master:
            ps = [await asyncio.create_subprocess_exec(
                sys.executable, str(ROOT / "tests/process/torch_pg_peer.py"), "pccl_aio",
                master.address, str(world), f"--device={dev}", stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE) for _ in range(world)]
            outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in ps)), 300)
        if any(p.returncode for p in ps):
            for o in outs:
                print(o[1].decode()[-3000:], file=sys.stderr)
            raise SystemExit(f"torch.distributed on {dev}: a process failed")
        runs[dev] = sorted((json.loads(o[0].decode().splitlines()[-1]) for o in outs),
                           key=lambda r: r["rank"])
    for c, g in zip(runs["cpu"], runs["cuda"]):
        for key in c:
            if key not in ("device", "ddp") and c[key] != g[key]:
                raise SystemExit(f"torch.distributed {key}: CUDA bytes differ from CPU's")
    if len({r["ddp"] for r in runs["cuda"]}) != 1:
        raise SystemExit("DDP on CUDA: parameters differ across processes")
    return {"collectives_equal_cpu": True, "ddp_identical": True,
            "ddp_cuda_equals_cpu": runs["cpu"][0]["ddp"] == runs["cuda"][0]["ddp"]}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--mib", type=float, nargs="+", default=[1, 16, 64])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=KINDS)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no GPU present (torch.cuda.is_available() is False): nothing measured")
        emit_json("gpu", [], gpu=None)
        return
    from tests.helpers import join_peers

    rows = []
    async with pccl.Master("127.0.0.1", 0, admission_interval=0.0) as master:
        comms = sorted(await join_peers(master, a.peers), key=lambda c: c.rank)
        try:
            await state_and_buckets(comms)
            for mib in a.mib:
                n = int(mib * (1 << 20)) // 4
                for kind in a.kinds:
                    cpu, gpu = await once(comms, kind, n, "cpu"), await once(comms, kind, n,
                                                                             "cuda")
                    if len(set(gpu)) > (1 if kind != "reduce_scatter" else a.peers) or \
                            gpu != cpu:
                        raise SystemExit(f"{kind} {mib} MiB: CUDA results differ")
                    times: dict[str, list[float]] = {"cpu": [], "cuda": []}
                    for i in range(a.iters):
                        for dev in (("cpu", "cuda") if i % 2 == 0 else ("cuda", "cpu")):
                            times[dev].append(await timed(comms, kind, n, dev))
                    c, g = median(times["cpu"]), median(times["cuda"])
                    rows.append({"kind": kind, "MiB": mib, "cpu_ms": c * 1e3, "cuda_ms": g * 1e3,
                                 "cuda_vs_cpu": g / c, "identical": True})
        finally:
            await asyncio.gather(*(c.close() for c in comms))
    backend = await torch_backend(a.peers)
    print(f"# {torch.cuda.get_device_name(0)}, {a.peers} peers in one process; SharedState "
          "and Buckets of CUDA tensors: correct")
    print_table(rows, ["kind", "MiB", "cpu_ms", "cuda_ms", "cuda_vs_cpu", "identical"])
    print(f"# torch.distributed on the pccl_aio group, {a.peers} processes: {backend}")
    emit_json("gpu", rows, gpu=torch.cuda.get_device_name(0), torch_backend=backend)


if __name__ == "__main__":
    pccl.run(main())
