"""DiLoCo across replicas of an FSDP2 model: the small GPT of ``charlm.py`` sharded over two
processes per replica (gloo inside a replica), the replicas joined by pccl_aio peer groups.

    python -m pccl_aio.master --port 48148 &
    for r in 1 2; do for s in 0 1; do
        python examples/fsdp_diloco.py --seed $r --shard $s --replica-store 127.0.0.1:$((49000+r)) &
    done; done

A replica is two processes (``--shard 0`` and ``1``) that meet at ``--replica-store`` (shard 0
listens there) and ``fully_shard`` the model between them: inner AdamW steps, gradients
reduce-scattered within the replica. Shard i of every replica is a pccl_aio peer in peer group
i: every ``--inner`` (H) steps it averages the pseudo-gradient of its own part of the
parameters over its group (the shard dimension in the peer groups), and takes an outer
Nesterov step on that part. Each process prints the line protocol of ``charlm.py`` with the
digest of its part of the global model: at every outer step it is the same on every replica.

Replicas are lost and join as a whole. A lost replica aborts the averaging in both groups: the
survivors retry on their own; a replica left alone trains on by itself until one joins. The
two processes of a replica tell the master they are one (``replica=``, ``replica_size=2``):
they start the run together, and a joining replica is admitted once both its processes
registered, in one round, so that no process of it waits over gloo for a partner that is not
yet a member. Joiners are admitted at an outer step (each replica's two processes agree on it
over gloo: the joint votes of the two groups give the same answer on every replica, so every
replica decides alike) and receive their part of the global model, the outer momentum and the
step in their group's shared-state sync. A process whose partner in the
replica died sees gloo fail and exits. ``python -m pccl_aio.launch examples/fsdp_diloco.py
--peers 2 --replica-procs 2 --churn 2 -- --tiny`` runs it with replicas killed whole.

Under torchrun a job is a replica: ``PCCL_AIO_MASTER=HOST:PORT torchrun --nproc-per-node 2
examples/fsdp_diloco.py`` (no ``--shard``, no ``--replica-store``): gloo over torchrun's
group inside the job, and ``Communicator.from_env()`` takes the job as one replica (its id),
rank r in peer group r. Start such jobs at will against one master: each joins the run live.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import timedelta
from typing import cast

import charlm
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import pccl_aio as pccl
from pccl_aio import blocking


def agree(flag: bool) -> bool:
    """True when both processes of this replica say True (gloo, within the replica)."""
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def sync(peer: charlm.Peer, state: pccl.SharedState) -> None:
    """Before an outer step: admit joining replicas (in both groups at once, or not at all)
    and sync this shard's part of the global model in its group; retried by the whole
    replica when either group's sync failed."""
    while True:
        pending = not peer.first and peer.comm.are_peers_pending()
        peer.first = False
        peer.admit_pending(agree(pending))
        # (alone, a replica trains on by itself: waiting for company in wait_for_peers would
        # need both shards' votes while one of them, still seeing the lost replica, may be
        # waiting for the other over gloo; joiners are admitted here at the next outer step)
        try:
            info = peer.comm.sync_shared_state(state)
            ok = True
        except pccl.SharedStateError as exc:  # every peer of this group got it
            peer.log("failed", error=repr(str(exc)).replace(" ", "_"))
            ok = False
        if agree(ok):  # (the other group may have failed: then both groups sync again)
            peer.sent += info.tx_bytes
            state.revision += 1
            return


def main(args: argparse.Namespace) -> int:
    cfg, train, val = charlm.setup(args)
    timeout = timedelta(seconds=args.replica_timeout)
    if args.shard is None:  # under torchrun: its job is the replica, its rank the shard
        dist.init_process_group("gloo", timeout=timeout)
        args.shard = dist.get_rank()
    else:
        host, port = args.replica_store.rsplit(":", 1)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=args.shard,
                                world_size=2, timeout=timeout)
    model = charlm.GPT(cfg)  # the same initial model on every replica
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    # this shard's part of each parameter (FSDP2's parameters are DTensors)
    local = [cast(DTensor, p).to_local() for p in model.parameters()]
    part = torch.nn.ParameterList(torch.nn.Parameter(t.detach().clone()) for t in local)
    outer = torch.optim.SGD(part.parameters(), lr=args.outer_lr, momentum=args.momentum,
                            nesterov=True)
    flat = torch.zeros(sum(t.numel() for t in local))  # the part's .grad: one all-reduce
    at = 0
    for p in part:
        p.grad, at = flat[at:at + p.numel()].view_as(p), at + p.numel()
    count = torch.zeros(1, dtype=torch.int64)  # outer steps taken by the run
    state = pccl.SharedState.from_module(part, outer, extra={"step": count})
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    last = math.ceil(args.inner_steps / args.inner)
    secret = pccl.load_secret(args.secret_file) or b""
    if args.replica_store is None:  # (torchrun: master, replica and peer group from its
        comm = blocking.Communicator.from_env(secret=secret)  # environment)
    else:
        comm = blocking.Communicator(args.master, peer_group=args.shard,  # the replica's two
                                     replica=args.replica_store, replica_size=2,  # join
                                     secret=secret)  # together
    comm.connect(attempts=args.attempts)
    with charlm.Peer(args, comm) as peer:
        peer.connect()
        while int(count) < last:
            sync(peer, state)  # a joiner receives its part, the momentum and the step here
            k = int(count) + 1
            if k > last:
                break
            with torch.no_grad():
                for t, p in zip(local, part):
                    t.copy_(p)
            first, end = (k - 1) * args.inner, min(k * args.inner, args.inner_steps)
            total = 0.0
            for i in range(first + 1, end + 1):
                charlm.set_lr(inner, charlm.lr_at(args.lr, i, args.inner_steps))
                inner.zero_grad()
                loss = model(*charlm.batch(train, cfg, 2 * args.seed + args.shard, i))
                loss.backward()
                inner.step()
                total += float(loss.detach())
            world = average(peer, part, local, flat, k)
            outer.step()  # never zero_grad: the .grad views stay
            count += 1
            val_loss = charlm.evaluate(model, val, cfg) if charlm.evaluate_at(args, k, last) \
                else math.nan  # (both shards evaluate: FSDP's forward is a collective)
            peer.step(k, end, world, total / max(end - first, 1), val_loss,
                      charlm.digest(list(part)))
        peer.done(int(count), min(int(count) * args.inner, args.inner_steps),
                  charlm.evaluate(model, val, cfg), charlm.digest(list(part)))
    dist.destroy_process_group()
    return 0


def average(peer: charlm.Peer, part: torch.nn.ParameterList, local: list[torch.Tensor],
            flat: torch.Tensor, k: int) -> int:
    """Average this part's pseudo-gradient (``part - local``, into ``flat``: the part's
    ``.grad``) over its group; the world size it took (``charlm.average``: a lost replica
    aborts the attempt in the group, the survivors retry together)."""

    @torch.no_grad()
    def pseudo_gradient() -> None:
        for p, t in zip(part, local):
            torch.sub(p, t, out=p.grad)

    return charlm.average(peer, flat, k, pseudo_gradient)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = charlm.diloco_parser(__doc__, "inner steps per outer step (H)")
    ap.add_argument("--shard", type=int, choices=(0, 1),
                    help="this process's shard of its replica (its pccl_aio peer group); "
                         "omitted under torchrun (its rank)")
    ap.add_argument("--replica-store", metavar="HOST:PORT",
                    help="where the replica's two processes meet (shard 0 listens); omitted "
                         "under torchrun")
    ap.add_argument("--replica-timeout", type=float, default=60.0,
                    help="seconds a gloo call within the replica waits for the partner")
    args = ap.parse_args(argv)
    if (args.shard is None) != (args.replica_store is None):
        ap.error("--shard and --replica-store go together (neither: under torchrun)")
    if args.shard is None and "RANK" not in os.environ:
        ap.error("--shard and --replica-store are needed outside torchrun")
    return args


if __name__ == "__main__":
    sys.exit(main(parse()))
