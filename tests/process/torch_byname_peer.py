"""One rank of ``test_torch_by_name.py``: ``dist.init_process_group(BACKEND,
init_method="file://...", rank=, world_size=)`` by name, the collectives of
``torch_pg_peer.py`` and those with roots or a block order (broadcast from each rank, scatter,
gather, the object collectives), point-to-point, all-to-all and reduce in every dtype
(``point_to_point``), subgroups (``subgroups``), a distributed checkpoint and a compiled
functional collective (``checkpoint_and_compile``), then plain DDP; prints one JSON line of
digests (and, on pccl_aio, this rank's position in the ring).

Usage: python torch_byname_peer.py pccl_aio|gloo INIT_FILE WORLD RANK [--go]

``--go``: print ``ready`` once imported and wait for a line on stdin before the init (the
test then decides the order in which the ranks connect).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import pccl_aio.torch
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
    ins = [torch.full((2,), float(rank)), torch.full((3, 1), 10.0 + rank), torch.empty(0)]
    lists = [[torch.empty_like(t) for t in ins] for _ in range(world)]
    dist.all_gather_coalesced(lists, ins)
    out["all_gather_coalesced"] = digest(*(t for ts in lists for t in ts))
    objs: list[object] = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    out["all_gather_object"] = json.dumps(objs)
    msg: list[object] = [f"from {rank}"]
    dist.broadcast_object_list(msg, src=world - 1)
    out["broadcast_object_list"] = str(msg[0])
    return out


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int8, torch.uint8]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _data(rank: int, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(0, 5, (n,), generator=g).to(dtype)  # exact in every dtype


def point_to_point(rank: int, world: int) -> dict[str, str]:
    """send/recv around the ring of torch ranks, isend/irecv, batch_isend_irecv, a receive
    from any rank, all_to_all(_single) with equal and unequal splits, reduce to each root
    with each op, in every dtype."""
    out: dict[str, str] = {}
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for i, dt in enumerate(DTYPES):
        name = str(dt).split(".")[1]
        x, got = _data(rank, 37 + i, dt, 1), torch.empty(37 + i, dtype=dt)
        if rank % 2 == 0:
            dist.send(x, nxt, tag=i)
            dist.recv(got, prv, tag=i)
        else:
            dist.recv(got, prv, tag=i)
            dist.send(x, nxt, tag=i)
        out[f"sendrecv_{name}"] = digest(_bits(got))
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt),
                                       dist.P2POp(dist.irecv, got, prv)])
        for req in reqs:
            req.wait()
        out[f"batch_{name}"] = digest(_bits(got))
        ins, outs = _data(rank, 4 * world, dt, 2), torch.empty(4 * world, dtype=dt)
        dist.all_to_all_single(outs, ins)
        out[f"all_to_all_single_{name}"] = digest(_bits(outs))
        splits_in = [r + rank + 1 for r in range(world)]  # to rank r: r + rank + 1 rows
        splits_out = [rank + r + 1 for r in range(world)]
        ins = _data(rank, sum(splits_in), dt, 3).reshape(-1, 1).repeat(1, 2)
        outs = torch.empty(sum(splits_out), 2, dtype=dt)
        dist.all_to_all_single(outs, ins, splits_out, splits_in)
        out[f"all_to_all_unequal_{name}"] = digest(_bits(outs))
        lists = [_data(rank, 5, dt, 4 + r) for r in range(world)]  # (gloo: equal sizes)
        into = [torch.empty(5, dtype=dt) for _ in range(world)]
        dist.all_to_all(into, lists)
        out[f"all_to_all_{name}"] = digest(*(_bits(t) for t in into))
    ops = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
           "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    for root in range(world):
        for opname, op in ops.items():
            for dt in (torch.float32, torch.int64):
                t = _data(rank, 11, dt, 5)
                dist.reduce(t, dst=root, op=op)  # (elsewhere than the root: unspecified)
                key = f"reduce_{root}_{opname}_{str(dt).split('.')[1]}"
                out[key] = digest(t) if rank == root else ""
    if rank == 0:  # a receive from any rank: every other rank sends one
        senders = []
        for _ in range(world - 1):
            buf = torch.empty(3)
            senders.append(dist.recv(buf, tag=99))
            out[f"anysource_{senders[-1]}"] = digest(buf)
        out["anysource"] = str(sorted(senders))
    else:
        dist.send(torch.full((3,), float(rank)), 0, tag=99)
    return out


def subgroups(rank: int, world: int) -> dict[str, str]:
    """new_group (two overlapping ones, each a run of its own), new_subgroups of one rank,
    collectives and point-to-point inside them; every rank calls every new_group, as torch
    requires."""
    out: dict[str, str] = {}
    g01, g12 = dist.new_group([0, 1]), dist.new_group([1, world - 1])
    for name, g, members in (("g01", g01, (0, 1)), ("g12", g12, (1, world - 1))):
        if rank not in members:
            continue
        t = _data(rank, 9, torch.float32, 6)
        dist.all_reduce(t, group=g)
        b = _data(rank, 4, torch.int64, 7)
        dist.broadcast(b, src=members[1], group=g)
        x = torch.full((3,), float(rank))
        if rank == members[0]:
            dist.send(x, members[1], group=g)
        else:
            dist.recv(x, members[0], group=g)
        out[name] = digest(t, b, x)
    mine, _ = dist.new_subgroups(group_size=1)
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=mine)
    out["subgroup_of_one"] = digest(t)
    return out


def checkpoint_and_compile(rank: int, path: str) -> dict[str, str]:
    """``torch.distributed.checkpoint`` save and load (its planner's gather, scatter and
    broadcast of objects, and barriers), and a ``torch.compile``d functional all-reduce that
    finds the group by its registered name."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(_data(rank, p.numel(), torch.float32, 8 + i).view(p.shape))
    dcp.save({"model": model.state_dict(), "step": torch.tensor(7 + rank)},
             checkpoint_id=f"{path}.checkpoint")
    loaded = torch.nn.Linear(4, 3)
    into = {"model": loaded.state_dict(), "step": torch.tensor(0)}
    dcp.load(into, checkpoint_id=f"{path}.checkpoint")
    group = dist.distributed_c10d._get_default_group()

    @torch.compile(backend="aot_eager", fullgraph=True)
    def twice_summed(t: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(t * 2, "sum", group) + 1

    compiled = twice_summed(_data(rank, 6, torch.float32, 10))
    return {"checkpoint": digest(loaded.weight, loaded.bias, into["step"]),
            "compiled_all_reduce": digest(compiled)}


def main() -> None:
    backend, path, world, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    if "--go" in sys.argv:
        print("ready", flush=True)
        sys.stdin.readline()
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank,
                            world_size=world)
    fixed = pccl_aio.torch.fixed_group() if backend == "pccl_aio" else None
    result = {"rank": dist.get_rank(), "world": dist.get_world_size(), "backend": backend,
              "ring": fixed.comm.rank if fixed is not None else rank,
              **collectives(rank, world, "cpu"), **rooted(rank, world),
              **point_to_point(rank, world), **subgroups(rank, world),
              **checkpoint_and_compile(rank, path),
              "ddp": ddp(rank, "cpu")}
    print(json.dumps(result), flush=True)
    if backend == "gloo":
        dist.barrier()  # (as torch_pg_peer.py: every rank past its last collective first)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
