"""One rank of ``test_torch_by_name.py``: ``dist.init_process_group(BACKEND,
init_method="file://...", rank=, world_size=)`` by name, the collectives of
``torch_pg_peer.py`` and those with roots or a block order (broadcast from each rank, scatter,
gather, the object collectives), then plain DDP; prints one JSON line of digests (and, on
pccl_aio, this rank's position in the ring).

Usage: python torch_byname_peer.py pccl_aio|gloo INIT_FILE WORLD RANK [--go]

``--go``: print ``ready`` once imported and wait for a line on stdin before the init (the
test then decides the order in which the ranks connect).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import pccl_aio.torch  # noqa: F401  (registers the backend)
from tests.process.torch_pg_peer import collectives, ddp, digest


def rooted(rank: int, world: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for root in range(world):
        b = torch.full((5,), float(10 * rank + 1))
        dist.broadcast(b, src=root)
        out[f"broadcast_{root}"] = digest(b)
    got = torch.empty(3)
    dist.scatter(got, [torch.full((3,), 100.0 + r) for r in range(world)] if rank == 1 else None,
                 src=1)
    out["scatter"] = digest(got)
    parts = [torch.empty(3) for _ in range(world)] if rank == world - 1 else None
    dist.gather(torch.full((3,), float(rank)), parts, dst=world - 1)
    out["gather"] = digest(*parts) if parts else ""
    objs: list[object] = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    out["all_gather_object"] = json.dumps(objs)
    msg: list[object] = [f"from {rank}"]
    dist.broadcast_object_list(msg, src=world - 1)
    out["broadcast_object_list"] = str(msg[0])
    return out


def main() -> None:
    backend, path, world, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    if "--go" in sys.argv:
        print("ready", flush=True)
        sys.stdin.readline()
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank,
                            world_size=world)
    pg = dist.distributed_c10d._get_default_group()
    result = {"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": backend,
              "ring": pg.comm.rank if backend == "pccl_aio" else rank,
              **collectives(rank, world, "cpu"), **rooted(rank, world), "ddp": ddp(rank, "cpu")}
    print(json.dumps(result), flush=True)
    if backend == "gloo":
        dist.barrier()  # (as torch_pg_peer.py: every rank past its last collective first)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
