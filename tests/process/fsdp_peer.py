"""One shard of one replica for ``test_torch_fsdp.py``: FSDP2 inside a replica (gloo), the
replicas joined by pccl_aio, in both forms; prints one JSON line of digests.

Usage: python fsdp_peer.py MASTER_ADDR STORE_ADDR REPLICAS REPLICA SHARD

Processes: REPLICAS x 2, global rank REPLICA * 2 + SHARD in a gloo world (the HSDP mesh needs
one). Shard i of every replica is a pccl_aio peer in peer group i (the shard dimension).

- ``hook``: ``fully_shard`` over this replica's gloo pair, ``set_all_reduce_hook`` averaging
  each reduce-scattered gradient over the replicas with pccl_aio (AVG).
- ``hsdp``: ``fully_shard`` over ``DeviceMesh.from_group([pccl_aio group, gloo pair])``:
  FSDP's own HSDP all-reduce goes over the pccl_aio group.

Each trains 8 steps on replica-seeded data; the digest of this shard's local parameters must
be the same on every replica (and the two forms the same, both averaging the same way).
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import pccl_aio as pccl
import pccl_aio.torch as pt
from pccl_aio.blocking import Communicator


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial model on every replica
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train(net: torch.nn.Module, replica: int) -> str:
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(replica)
    for _ in range(8):
        opt.zero_grad()
        net(torch.randn(8, 16, generator=data)).pow(2).mean().backward()
        opt.step()
    local = [p.to_local() for p in net.parameters()]  # this shard's part
    return hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes()
                                   for t in local)).hexdigest()[:16]


def main() -> None:
    addr, store, replicas = sys.argv[1], sys.argv[2], int(sys.argv[3])
    replica, shard = int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(1)
    host, port = store.rsplit(":", 1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}",
                            rank=replica * 2 + shard, world_size=replicas * 2)
    pairs = [dist.new_group([r * 2, r * 2 + 1]) for r in range(replicas)]  # (all call each)
    pair = pairs[replica]
    comm = Communicator(addr, peer_group=shard)  # shard i of every replica: peer group i
    comm.connect()
    comm.wait_for_peers(replicas)
    group = pt.ProcessGroup(comm)
    out: dict[str, object] = {"replica": replica, "shard": shard, "rank": group.rank()}

    net = fully_shard(model(), mesh=DeviceMesh.from_group(pair, "cpu"))

    def average(grad: torch.Tensor) -> None:  # the reduce-scattered shard of a gradient
        comm.all_reduce(grad, op=pccl.ReduceOp.AVG)

    net.set_all_reduce_hook(average)
    out["hook"] = train(net, replica)

    ranks = torch.arange(replicas * 2).view(replicas, 2)
    mesh = DeviceMesh.from_group([group, pair], "cpu", mesh=ranks,
                                 mesh_dim_names=("replicate", "shard"))
    out["hsdp"] = train(fully_shard(model(), mesh=mesh), replica)
    out["name"] = group.group_name
    print(json.dumps(out), flush=True)
    group.close()
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
