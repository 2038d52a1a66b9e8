"""Plain PyTorch DDP on fault-tolerant replicas: the small GPT of ``charlm.py`` trained with
``torch.distributed`` on the pccl_aio group.

    python -m pccl_aio.master --port 48148 &
    python examples/ddp_torch_distributed.py --seed 1 &
    python examples/ddp_torch_distributed.py --seed 2 &
    python examples/ddp_torch_distributed.py --seed 3  # join or kill -9 any time

A DDP program as any other; its pccl_aio lines: ``pccl_aio.torch.init_process_group`` (the
pccl_aio group becomes torch's default: ``dist.get_rank()``, ``dist.all_reduce`` work on it),
``pccl_aio.torch.DistributedDataParallel`` (torch's DDP whose gradient buckets a comm hook
averages over the replicas that take part), and the shared-state sync before each step
(``peer.sync``, as in ``ddp.py``: a joiner receives the model, AdamW's state and the step count
there and takes part from that step). A replica lost during the backward pass makes the step
fail on every survivor alike (``ddp.failed``): all print a ``lost`` line and run it again.
"""

from __future__ import annotations

import argparse
import math
import sys

import charlm
import torch
import torch.distributed as dist

import pccl_aio as pccl
import pccl_aio.torch


def main(args: argparse.Namespace) -> int:
    cfg, train, val = charlm.setup(args)
    group = pccl_aio.torch.init_process_group(
        args.master, secret=pccl.load_secret(args.secret_file) or b"")
    model = charlm.GPT(cfg)
    ddp = pccl_aio.torch.DistributedDataParallel(model)  # the comm hook: AVG over replicas
    params = list(model.parameters())  # the tied head weight once
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    step = torch.zeros(1, dtype=torch.int64)  # steps taken by the run
    state = pccl.SharedState.from_module(model, opt, extra={"step": step})
    last, val_loss = args.inner_steps, math.nan
    counted = 0  # the group's collective bytes already in peer.sent
    with charlm.Peer(args, group.comm) as peer:
        peer.connect()  # waits for --min-peers
        while int(step) < last:
            peer.sync(state)  # a joiner receives the model, AdamW's state and the step here
            k = int(step) + 1  # the step this one makes
            if k > last:
                break
            world = group.comm.peer_group_world_size  # the replicas of this step
            opt.zero_grad()
            loss = ddp(*charlm.batch(train, cfg, args.seed, k))
            loss.backward()
            if ddp.failed:  # a replica was lost mid-step: every survivor runs it again
                peer.lost(k, group.comm.peer_group_world_size)
                ddp.reset()
                continue
            charlm.set_lr(opt, charlm.lr_at(args.lr, k, last))
            opt.step()
            step += 1
            # what the DDP hook's all-reduces sent (their ReduceInfo stays in the hook)
            total = group.comm.tx_bytes
            peer.sent, counted = peer.sent + total - counted, total
            val_loss = charlm.evaluate(model, val, cfg) if charlm.evaluate_at(args, k, last) \
                else math.nan
            peer.step(k, k, world, float(loss.detach()), val_loss, charlm.digest(params))
        if math.isnan(val_loss):  # took no step
            val_loss = charlm.evaluate(model, val, cfg)
        peer.done(int(step), int(step), val_loss, charlm.digest(params))
    dist.destroy_process_group()
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    return charlm.ddp_parser(__doc__).parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse()))
