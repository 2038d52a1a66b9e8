"""A DTensor run on a fixed world of 3 that loses a rank and takes its replacement: the
``DeviceMesh`` keeps working, nobody restarts.

Each rank (``init_process_group("pccl_aio")``, a 1-D ``DeviceMesh`` over the world) trains
a weight replicated over the mesh on batches sharded over it (DTensor data parallelism)::

    python examples/dtensor_replace.py /tmp/run-init 3 0 &
    python examples/dtensor_replace.py /tmp/run-init 3 1 &
    python examples/dtensor_replace.py /tmp/run-init 3 2 &
    # rank 2 is lost (kill -9); its replacement, whenever it is started:
    python examples/dtensor_replace.py /tmp/run-init 3 2 --join 1

When a step fails (a rank was lost: every survivor raises), the survivors and the
replacement exchange reconfigure handles through torch's store, reconfigure the group
(``dist._reconfigure`` on torch 2.15, ``pccl_aio.torch.reconfigure`` on any torch) and
rank 0 hands the replacement the weight and the step, which every rank does again.
``--join N`` names the reconfiguration the replacement joins (the Nth). Each rank prints
one JSON line per step. Rank 0 hosts the run's master and the store's file is shared: rank
0 is the one rank this example cannot replace.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import pccl_aio.torch

TRUE_W = torch.arange(1.0, 5.0).view(4, 1)
LR = 0.002


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch, the same on every rank (each keeps its shard)."""
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(step))
    return x, x @ TRUE_W


def local(w: torch.nn.Parameter) -> torch.Tensor:
    """This rank's tensor of the replicated weight."""
    return cast(DTensor, w.data).to_local()


def reconfigure(generation: int) -> None:
    """Join the world as it is now: handles through the store, then the reconfigure."""
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    handle = (dist._get_reconfigure_handle() if hasattr(dist, "_get_reconfigure_handle")
              else pccl_aio.torch.reconfigure_handle())
    store.set(f"handles/{generation}/{rank}", handle)
    handles = [store.get(f"handles/{generation}/{r}").decode() for r in range(world)]
    if hasattr(dist, "_reconfigure"):
        dist._reconfigure(uuid=generation, handles=handles).wait()
    else:
        pccl_aio.torch.reconfigure(generation, handles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("init_file")
    parser.add_argument("world", type=int)
    parser.add_argument("rank", type=int)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--join", type=int, default=0, help="replace a lost rank")
    args = parser.parse_args()
    options: dict[str, Any] = {}
    if args.join:  # (connect at the reconfigure, not now)
        if "enable_reconfigure" in inspect.signature(dist.init_process_group).parameters:
            options["enable_reconfigure"] = True
        else:
            os.environ["PCCL_AIO_RECONFIGURE"] = "1"
    dist.init_process_group("pccl_aio", init_method=f"file://{args.init_file}",
                            rank=args.rank, world_size=args.world, **options)
    generation, step = args.join, 0
    if args.join:
        reconfigure(generation)
    mesh = init_device_mesh("cpu", (args.world,))
    # (from_local: every rank starts from zeros, nothing sent; a replacement gets rank 0's)
    w = torch.nn.Parameter(DTensor.from_local(torch.zeros(4, 1), mesh, [Replicate()]))
    while True:
        if generation:  # (after a reconfigure: rank 0's weight and step for everyone)
            state = torch.cat([local(w).flatten(), torch.tensor([float(step)])])
            dist.broadcast(state, src=0)
            local(w).copy_(state[:-1].view(4, 1))
            step = int(state[-1])
            generation = -generation  # (done)
        if step == args.steps:
            break
        try:
            x, y = batch(step)
            xs, ys = (distribute_tensor(t, mesh, [Shard(0)]) for t in (x, y))
            loss = ((xs @ w - ys) ** 2).mean()
            torch.autograd.backward(loss)
            value = cast(DTensor, loss).full_tensor().item()
            assert isinstance(w.grad, DTensor)
            with torch.no_grad():  # (the last collective: done on every rank or on none)
                w.sub_(LR * w.grad)
        except Exception as e:  # (a rank was lost: every survivor raises)
            print(json.dumps({"event": "lost", "step": step, "error": type(e).__name__}),
                  flush=True)
            w.grad = None
            generation = abs(generation) + 1
            reconfigure(generation)
            continue
        w.grad = None
        print(json.dumps({"event": "step", "step": step, "loss": value}), flush=True)
        step += 1
    weight = cast(DTensor, w.data).full_tensor().flatten().tolist()
    print(json.dumps({"event": "done", "rank": args.rank, "weight": weight}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
