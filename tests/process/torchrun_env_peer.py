"""Under torchrun: ``pccl_aio.torch.init_process_group()`` with no argument; prints one JSON
line with what it made (torch's default group: torchrun's gloo; the pccl_aio group across
replicas) and an all-reduce over each; two such jobs run at once."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

import pccl_aio.torch

group = pccl_aio.torch.init_process_group(min_peers=2)  # (two jobs: two replicas)
inside, across = torch.ones(2), torch.ones(2)
dist.all_reduce(inside)  # torchrun's group: the two processes of this job
dist.all_reduce(across, group=group)  # this shard's peer group: rank r of both jobs
cfg = group.comm.config
print(json.dumps({"event": "made", "rank": dist.get_rank(), "default": dist.get_backend(),
                  "size": group.size(), "replica": cfg.replica, "replica_size":
                  cfg.replica_size, "peer_group": cfg.peer_group, "inside": inside.tolist(),
                  "across": across.tolist()}), flush=True)
group.comm.close()
dist.destroy_process_group()
