"""One rank of ``test_torch_backend.py``: ``torch.distributed`` calls on the default group,
pccl_aio's or gloo's, with the same inputs; prints one JSON line of digests.

Usage: python torch_pg_peer.py pccl_aio MASTER_ADDR WORLD [--device=cuda]
       python torch_pg_peer.py gloo STORE_ADDR WORLD RANK

``--device=cuda`` (``bench/gpu.py``) puts every tensor and the model on the GPU; the digests
are of the bytes copied back, so a CUDA run must match a CPU run's collectives.

Inputs are small integers in float32 (every sum exact in any order), so both backends must
give the same bytes. Then plain ``DistributedDataParallel`` trains a small model 20 steps on
rank-seeded data; the parameters' digest must be the same on every rank.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch.distributed as dist


def digest(*ts: torch.Tensor) -> str:
    return hashlib.sha256(b"".join(t.detach().cpu().contiguous().numpy().tobytes()
                                   for t in ts)).hexdigest()[:16]


def collectives(rank: int, world: int, dev: str) -> dict[str, str]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randint(-8, 8, (1001,), generator=g).float().to(dev)  # odd, exact sums
    out: dict[str, str] = {}
    for op in ("SUM", "MAX", "MIN"):
        t = x.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce_{op}"] = digest(t)
    b = x.clone()
    dist.broadcast(b, src=world - 1)
    out["broadcast"] = digest(b)
    ag = torch.empty(world * x.numel(), device=dev)
    dist.all_gather_into_tensor(ag, x)
    out["all_gather_into_tensor"] = digest(ag)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    out["all_gather"] = digest(*parts)
    rs = torch.empty(7, device=dev)
    dist.reduce_scatter_tensor(rs, torch.randint(-8, 8, (7 * world,), generator=g).float()
                               .to(dev))
    out["reduce_scatter_tensor"] = digest(rs)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    out["async_all_reduce"] = digest(x)
    dist.barrier()
    return out


def ddp(rank: int, dev: str) -> str:
    torch.manual_seed(0)  # the same initial model everywhere
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4)).to(dev)
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for _ in range(20):
        opt.zero_grad()
        net(torch.randn(8, 16, generator=g).to(dev)).pow(2).mean().backward()
        opt.step()
    return digest(*model.parameters())


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--device=")]
    dev = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--device=")), "cpu")
    backend, addr, world = args[0], args[1], int(args[2])
    torch.set_num_threads(1)
    if backend == "pccl_aio":
        import pccl_aio.torch as pt

        group = pt.init_process_group(addr, min_peers=world, heartbeat_interval=0.2,
                                      heartbeat_timeout=2.0)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=int(args[3]),
                                world_size=world)
    rank = dist.get_rank()
    result = {"rank": rank, "world": dist.get_world_size(), "backend": dist.get_backend(),
              "device": dev, **collectives(rank, world, dev), "ddp": ddp(rank, dev)}
    print(json.dumps(result), flush=True)
    if backend == "gloo":
        # every rank past its last collective before any tears down (a gloo rank 0 once
        # died of SIGABRT in teardown, with the others' sockets closing)
        dist.barrier()
    dist.destroy_process_group()
    if backend == "pccl_aio":
        group.comm.close()


if __name__ == "__main__":
    main()
