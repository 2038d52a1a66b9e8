"""One shard of one replica for ``test_torch_backend.py``: FSDP2 inside the replica (gloo),
``pccl_aio.torch.AllReduceHook`` across replicas; prints JSON lines.

Usage: python fsdp_ft_peer.py MASTER_ADDR STORE_ADDR REPLICAS REPLICA SHARD STEPS [join]

Shard i of every replica is a pccl_aio peer in peer group i. Each step: ``hook.admit`` (joiners
admitted, this shard's parameters and the step count synced in its group), forward, backward
(the hook averages each reduce-scattered gradient over the group), then the replica asks
whether either of its shards saw the step fail (``failed_in``): if so it skips the optimizer
step and runs the step again ("failed"), else it steps ("step", with the digest of this
shard's parameters). With ``join`` the process prints "ready" once its model is built and
connects only when a line comes on stdin (a replica joining the run).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import pccl_aio as pccl
import pccl_aio.torch as pt
from pccl_aio.blocking import Communicator


def emit(**kw: object) -> None:
    print(json.dumps({"t": time.time(), **kw}), flush=True)


def main() -> None:
    addr, store, replicas = sys.argv[1], sys.argv[2], int(sys.argv[3])
    replica, shard, steps = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    joining = sys.argv[7:] == ["join"]
    torch.set_num_threads(1)
    host, port = store.rsplit(":", 1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=shard,
                            world_size=2, timeout=timedelta(seconds=60))
    torch.manual_seed(100 + replica if joining else 0)  # a joiner's differs until it syncs
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    count = torch.zeros(1, dtype=torch.int64)  # steps taken by the run
    state = pccl.SharedState({**{f"p{i}": p.to_local() for i, p in enumerate(model.parameters())},
                              "step": count})
    comm = Communicator(addr, peer_group=shard, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                        data_timeout=3.0, replica=store, replica_size=2)  # admitted together
    if joining:
        emit(event="ready")
        sys.stdin.readline()
    comm.connect()
    if not joining:
        comm.wait_for_peers(replicas)
    group = pt.ProcessGroup(comm)
    hook = pt.AllReduceHook(group)
    model.set_all_reduce_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(2 * replica + shard)
    while True:
        ws = hook.admit(state)
        step = int(count)
        if step >= steps:
            break
        opt.zero_grad()
        model(torch.randn(8, 16, generator=data)).pow(2).mean().backward()
        if hook.failed_in():  # either shard's group lost the replica: both skip, alike
            emit(event="failed", step=step, error=str(hook.error))
        else:
            opt.step()
            count += 1
            local = [p.to_local() for p in model.parameters()]
            emit(event="step", step=int(count), ws=ws, digest=hashlib.sha256(b"".join(
                t.detach().contiguous().numpy().tobytes() for t in local)).hexdigest()[:16])
        hook.reset()
    emit(event="done", step=step)
    group.close()
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
