"""Plain PyTorch DDP under torchrun on pccl_aio: a gloo script but for the backend name.

    torchrun --nproc-per-node 3 examples/torchrun_ddp.py
    torchrun --nproc-per-node 3 examples/torchrun_ddp.py --backend gloo  # the same, on gloo

Its pccl_aio lines: ``import pccl_aio.torch`` (registers the backend) and
``dist.init_process_group("pccl_aio")`` (torchrun's ``env://``: rank 0 starts the run's
master, every rank connects and waits for the others). Then torch's own
``DistributedDataParallel`` trains a small regression model on each rank's own data, and
each rank prints ``rank R of N: step S loss L parameters DIGEST``: one digest on every rank.
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import pccl_aio.torch  # noqa: F401  (registers the "pccl_aio" backend)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="pccl_aio", help="pccl_aio (default) or gloo")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # (DDP broadcasts rank 0's parameters anyway)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    target = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    loss = torch.zeros(())
    for _ in range(args.steps):
        x = torch.randn(64, 32, generator=data)
        loss = (ddp(x) - x @ target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    print(f"rank {rank} of {world}: step {args.steps} loss {loss.item():.4f} "
          f"parameters {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
