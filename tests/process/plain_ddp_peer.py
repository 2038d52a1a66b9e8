"""A rank of plain ``torch.nn.parallel.DistributedDataParallel`` on the pccl_aio group, for
``test_torch_membership.py``; prints JSON lines.

Usage: python plain_ddp_peer.py MASTER_ADDR WORLD STEPS INDEX [STOP_AT]

Trains an MLP (3 layers, a few buckets) for STEPS steps, checking after each ``backward()``
that the averaged gradient is the true mean of the ranks' gradients: every rank computes
every rank's gradient itself (the data of rank i is seeded with i; the replicas are equal),
and DDP's average must be the mean over all WORLD ranks or over the first WORLD - 1 (the
last one stopped or killed), else the rank prints "wrong". Prints "step" per step; on an
exception "raised" with its type and message, then takes the new membership
(``renew_process_group``: "renewed", or "not_renewed" on a rank that is no member now; either
exits if it is not in a group of two or more now), builds DDP again and trains 5 more steps;
"done" at the end; exits 0. With STOP_AT, this rank prints "stopping" after that step and
stops itself (SIGSTOP) for the test to resume or kill.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import pccl_aio as pccl
import pccl_aio.torch as pt


def emit(**kw: object) -> None:
    print(json.dumps({"t": time.time(), **kw}), flush=True)


def mean_grad(model: torch.nn.Module, xs: list[torch.Tensor]) -> torch.Tensor:
    """The mean over ``xs`` of the model's gradient on each batch."""
    total = None
    for x in xs:
        model.zero_grad()
        model(x).pow(2).mean().backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        total = g if total is None else total + g
    assert total is not None
    return total / len(xs)


def main() -> None:
    addr, world, steps, index = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    stop_at = int(sys.argv[5]) if len(sys.argv) > 5 else -1
    torch.set_num_threads(1)
    group = pt.init_process_group(addr, min_peers=world, heartbeat_interval=0.2,
                                  heartbeat_timeout=2.0, data_timeout=3.0)
    emit(event="joined", rank=dist.get_rank(), world=dist.get_world_size())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = [torch.Generator().manual_seed(i) for i in range(world)]
    try:
        train(model, ddp, opt, data, index, steps, stop_at)
    except Exception as exc:  # (reported whole to the test)
        emit(event="raised", type=type(exc).__name__, error=str(exc)[:1500],
             changed=group.membership_changed)
        try:  # the survivors take the new membership and train on, with the right mean
            group = pt.renew_process_group()
        except pccl.PcclError as again:
            emit(event="not_renewed", type=type(again).__name__, error=str(again)[:500])
            os._exit(0)
        emit(event="renewed", rank=dist.get_rank(), world=dist.get_world_size())
        if dist.get_world_size() < 2:  # (the resumed rank, in a group of its own)
            os._exit(0)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        train(model, ddp, opt, data, index, 5, -1)
    emit(event="done")
    os._exit(0)


def train(model: torch.nn.Module, ddp: torch.nn.Module, opt: torch.optim.Optimizer,
          data: list[torch.Generator], index: int, steps: int, stop_at: int) -> None:
    """``steps`` steps (see the module's docstring)."""
    step = 0
    while step < steps:
        xs = [torch.randn(16, 64, generator=g) for g in data]
        means = [mean_grad(model, xs), mean_grad(model, xs[:-1])]
        opt.zero_grad()
        ddp(xs[index]).pow(2).mean().backward()
        avg = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        err = min(float((avg - m).abs().max()) for m in means)
        if err > 1e-5:
            emit(event="wrong", step=step, err=err, world=dist.get_world_size())
        opt.step()
        step += 1
        emit(event="step", step=step, world=dist.get_world_size())
        if step == stop_at:
            emit(event="stopping")
            os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    main()
