"""DDP step time on the pccl_aio process group against gloo, same model, alternated in one run.

    python bench/torch_backend.py [--peers 2 3] [--steps 30] [--warmup 5] [--rounds 3]
                                  [--width 1024] [--hook]

For each P and round, P replica processes train ``DistributedDataParallel`` on a 3-layer MLP
(``--width`` hidden units: 2 x width^2 + ... parameters, 8 MiB of float32 gradients at 1024)
on the default group: gloo (joined through a TCPStore this process serves) or pccl_aio
(``pccl_aio.torch.init_process_group`` against a master in this process; ``--hook``: with
``ddp_comm_hook``, else DDP's own all-reduce). A step is zero_grad, forward, backward (the
bucket all-reduces overlap it), optimizer step; its time is the slowest replica's,
``perf_counter`` around it after ``--warmup`` steps. Rounds alternate which backend goes
first; the steps of all rounds are pooled. Every replica ends with the digest of its
parameters, which must agree within a run (they are identical by construction). The table
gives the median step time of each backend and pccl_aio / gloo; a JSON line follows.
One compute thread per replica (``OMP_NUM_THREADS=1``): the reference machine has 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit_json, median, print_table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def replica(backend: str, addr: str, world: int, rank: int, steps: int, warmup: int,
            width: int, hook: bool) -> None:
    """One replica (a subprocess): prints one JSON line of step times and the digest."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    group = None
    if backend == "pccl_aio":
        import pccl_aio.torch as pt

        group = pt.init_process_group(addr, min_peers=world)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=rank,
                                world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 16))
    net = torch.nn.parallel.DistributedDataParallel(model)
    state = None
    if hook and group is not None:
        state = pt.HookState(group)
        net.register_comm_hook(state, pt.ddp_comm_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(dist.get_rank())
    times = []
    cpu0 = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            cpu0 = time.process_time()
        x = torch.randn(32, 256, generator=data)
        t0 = time.perf_counter()
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        if state is not None and state.failed:
            raise SystemExit(f"step {i} failed: {state.error}")
        opt.step()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    cpu = (time.process_time() - cpu0) / steps  # every thread of the replica, per step
    print(json.dumps({"times": times, "cpu": cpu, "digest": digest}), flush=True)
    dist.destroy_process_group()
    if group is not None:
        group.comm.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, __file__, "--replica", *args],
                            stdout=subprocess.PIPE, text=True, env=env)


async def run(backend: str, world: int, a: argparse.Namespace) -> list[dict[str, object]]:
    """One round of ``backend`` with ``world`` replicas: each replica's JSON result."""
    common = [str(a.steps), str(a.warmup), str(a.width), str(int(a.hook))]

    async def collect(procs: list[subprocess.Popen[str]]) -> list[dict[str, object]]:
        outs = await asyncio.gather(*(asyncio.to_thread(p.communicate, timeout=600)
                                      for p in procs))
        if any(p.returncode for p in procs):
            raise SystemExit(f"{backend} replica failed: {[p.returncode for p in procs]}")
        return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]

    if backend == "gloo":
        addr = f"127.0.0.1:{_free_port()}"
        return await collect([_spawn([backend, addr, str(world), str(r), *common])
                              for r in range(world)])
    import pccl_aio as pccl

    async with pccl.Master("127.0.0.1", 0, admission_interval=0.0) as master:
        return await collect([_spawn([backend, master.address, str(world), "0", *common])
                              for _ in range(world)])


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--hook", action="store_true", help="pccl_aio with ddp_comm_hook")
    a = ap.parse_args()
    rows = []
    for world in a.peers:
        steps: dict[str, list[float]] = {"gloo": [], "pccl_aio": []}
        cpu: dict[str, list[float]] = {"gloo": [], "pccl_aio": []}
        for r in range(a.rounds):
            order = ["gloo", "pccl_aio"] if (r + world) % 2 == 0 else ["pccl_aio", "gloo"]
            for backend in order:
                res = await run(backend, world, a)
                if len({x["digest"] for x in res}) != 1:
                    raise SystemExit(f"{backend}: the replicas' parameters differ")
                per_step = zip(*(x["times"] for x in res))  # type: ignore[misc]
                steps[backend] += [max(t) for t in per_step]
                cpu[backend] += [float(x["cpu"]) for x in res]  # type: ignore[arg-type]
        g, p = median(steps["gloo"]), median(steps["pccl_aio"])
        rows.append({"P": world, "steps": len(steps["gloo"]), "gloo_ms": g * 1e3,
                     "pccl_aio_ms": p * 1e3, "pccl_vs_gloo": p / g,
                     "gloo_cpu_ms": median(cpu["gloo"]) * 1e3,
                     "pccl_aio_cpu_ms": median(cpu["pccl_aio"]) * 1e3})
    print(f"# DDP step time, MLP width {a.width}, hook={a.hook}")
    print_table(rows, ["P", "steps", "gloo_ms", "pccl_aio_ms", "pccl_vs_gloo", "gloo_cpu_ms",
                       "pccl_aio_cpu_ms"])
    print("target: pccl_vs_gloo <= 1.1: " + ", ".join(
        f"P={r['P']} {'ok' if r['pccl_vs_gloo'] <= 1.1 else 'MISS'}" for r in rows))
    emit_json("torch_backend", rows, width=a.width, hook=a.hook)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--replica"]:
        b, addr, world, rank, steps, warmup, width, hook = sys.argv[2:10]
        replica(b, addr, int(world), int(rank), int(steps), int(warmup), int(width),
                hook == "1")
    else:
        import pccl_aio

        pccl_aio.run(main())  # the master on uvloop, as ``python -m pccl_aio.master`` runs it
