"""Data-parallel training (DDP) of the small GPT of ``charlm.py`` with the blocking API.

    python -m pccl_aio.master --port 48148 &
    python examples/ddp.py --seed 1 &
    python examples/ddp.py --seed 2 &
    python examples/ddp.py --seed 3  # join or kill -9 any time

Every step each peer computes the gradient of its own batch (``--seed``), the group averages
the gradients through ``pccl_aio.blocking.Buckets`` and every peer takes the same AdamW step, so the
model stays bit-identical everywhere. Each step is an outer step of the line protocol
(``step``/``done`` lines, see ``charlm.py``); validation every ``--eval-every`` steps.

The model, AdamW's state and the step count are the shared state (``SharedState.
from_module``), synced before every step: a peer that joins mid-run receives them there and
continues from the run's step. A peer lost during the all-reduce makes the buckets retry on
the survivors (``all_reduce_multiple_with_retry``); the step then prints a ``lost`` line.
A peer left alone takes the step with its own gradient and waits for company before the next.
"""

from __future__ import annotations

import argparse
import math
import sys

import charlm
import torch

import pccl_aio as pccl
from pccl_aio.blocking import Buckets


def main(args: argparse.Namespace) -> int:
    cfg, train, val = charlm.setup(args)
    model = charlm.GPT(cfg)
    params = list(model.parameters())  # the tied head weight once
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    buckets = Buckets.grads_of(model)  # flat buffers made once, like DDP's buckets
    step = torch.zeros(1, dtype=torch.int64)  # steps taken by the run
    state = pccl.SharedState.from_module(model, opt, extra={"step": step})
    last, val_loss = args.inner_steps, math.nan
    with charlm.Peer(args) as peer:
        peer.connect()
        while int(step) < last:
            peer.sync(state)  # a joiner receives the model, AdamW's state and the step here
            k = int(step) + 1  # the step this one makes
            if k > last:
                break
            opt.zero_grad()
            loss = model(*charlm.batch(train, cfg, args.seed, k))
            loss.backward()
            try:
                world = peer.reduced(buckets.all_reduce(peer.comm, op=pccl.ReduceOp.AVG), k)
            except pccl.TooFewPeersError:  # alone now: our own gradient (nothing sent)
                world = 1
            charlm.set_lr(opt, charlm.lr_at(args.lr, k, last))
            opt.step()
            step += 1
            val_loss = charlm.evaluate(model, val, cfg) if charlm.evaluate_at(args, k, last) \
                else math.nan
            peer.step(k, k, world, float(loss.detach()), val_loss, charlm.digest(params))
        if math.isnan(val_loss):  # took no step
            val_loss = charlm.evaluate(model, val, cfg)
        peer.done(int(step), int(step), val_loss, charlm.digest(params))
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    return charlm.ddp_parser(__doc__).parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse()))
