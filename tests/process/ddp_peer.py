"""A DDP replica for ``test_torch_backend.py``: plain ``DistributedDataParallel`` on the
pccl_aio group with ``pccl_aio.torch.ddp_comm_hook``; prints JSON lines.

Usage: python ddp_peer.py MASTER_ADDR WORLD STEPS INDEX [FREEZE_AT]

Trains until STEPS optimizer steps were taken; a step whose gradient all-reduce was aborted
(a replica lost mid-step: every survivor sees it) is skipped and run again. Prints "step"
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

import pccl_aio.torch as pt


def emit(**kw: object) -> None:
    print(json.dumps({"t": time.time(), **kw}), flush=True)


def main() -> None:
    addr, world, steps, index = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    freeze_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    torch.set_num_threads(1)
    group = pt.init_process_group(addr, min_peers=world, heartbeat_interval=0.2,
                                  heartbeat_timeout=2.0, data_timeout=3.0)
    torch.manual_seed(0)  # the same initial model on every replica
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                                torch.nn.Linear(128, 8))
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)  # 3 buckets
    state = pt.HookState(group)
    net.register_comm_hook(state, pt.ddp_comm_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(int(index))  # this replica's data
    step = failed = 0
    while step < steps:
        opt.zero_grad()
        net(torch.randn(16, 64, generator=data)).pow(2).mean().backward()
        if state.failed:  # every survivor skips this step alike, and runs it again
            failed += 1
            emit(event="failed", step=step, error=str(state.error))
        else:
            opt.step()
            step += 1
            emit(event="step", step=step, ws=group.size())
            if step == freeze_at:
                emit(event="frozen")
                os.kill(os.getpid(), signal.SIGSTOP)
        state.reset()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    emit(event="done", digest=digest, failed=failed, ws=group.size())
    group.comm.close()


if __name__ == "__main__":
    main()
