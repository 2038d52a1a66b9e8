"""A DDP replica for ``test_torch_backend.py``: ``pccl_aio.torch.DistributedDataParallel``
(torch's DDP on a local group, its gradients averaged by the comm hook over the pccl_aio
group); prints JSON lines.

Usage: python ddp_peer.py MASTER_ADDR WORLD STEPS INDEX [FREEZE_AT]

Before each step the replicas admit joiners (a joint vote) and sync the model, SGD's state
and the step count (``SharedState.from_module``): a joiner receives them there and takes part
from that step. A step whose gradient all-reduce was aborted (a replica lost mid-step: every
survivor sees it) is skipped and run again. The run ends after the first step past STEPS
taken by WORLD replicas (so a survivor waits, training, for the joiner to come). Prints "step"
after each step, "failed" for each skipped one and "done" with the parameters' digest. With
FREEZE_AT, this replica prints "frozen" after that step and stops itself (SIGSTOP) for the test
to SIGKILL, in the middle of the run whatever the machine's speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import torch

import pccl_aio as pccl
import pccl_aio.torch as pt


def emit(**kw: object) -> None:
    print(json.dumps({"t": time.time(), **kw}), flush=True)


def main() -> None:
    addr, world, steps, index = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    freeze_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    torch.set_num_threads(1)
    group = pt.init_process_group(addr, min_peers=world, heartbeat_interval=0.2,
                                  heartbeat_timeout=2.0, data_timeout=3.0)
    comm = group.comm
    emit(event="joined", ws=comm.peer_group_world_size)
    torch.manual_seed(int(index))  # a different model on each: the first sync makes them one
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                                torch.nn.Linear(128, 8))
    net = pt.DistributedDataParallel(model, bucket_cap_mb=0.01)  # 2 buckets
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    step = torch.zeros(1, dtype=torch.int64)
    state = pccl.SharedState.from_module(model, opt, extra={"step": step})
    data = torch.Generator().manual_seed(int(index))  # this replica's data
    failed, first = 0, True
    while True:
        if not first and comm.are_peers_pending():
            comm.update_topology()  # admits the joiner: it syncs with us next
        first = False
        try:
            comm.sync_shared_state(state)  # a joiner receives model, momentum, step here
        except pccl.SharedStateError:
            continue  # every peer of the group got it: retry
        state.revision += 1
        ws = comm.peer_group_world_size  # the world of this step (the same on every replica)
        opt.zero_grad()
        net(torch.randn(16, 64, generator=data)).pow(2).mean().backward()
        if net.failed:  # every survivor skips this step alike, and runs it again
            failed += 1
            emit(event="failed", step=int(step), error=str(net.error))
            net.reset()
            continue
        opt.step()
        step += 1
        emit(event="step", step=int(step), ws=ws)
        if int(step) == freeze_at:
            emit(event="frozen")
            os.kill(os.getpid(), signal.SIGSTOP)
        if int(step) >= steps and ws == world:
            break
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    emit(event="done", digest=digest, failed=failed, step=int(step))
    comm.close()


if __name__ == "__main__":
    main()
