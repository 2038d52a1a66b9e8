"""One rank of ``test_torch_p2p_kill.py``: ``dist.init_process_group("pccl_aio")`` by name
(``file://`` init, the master named by ``$PCCL_AIO_MASTER``), then steps of an
``all_to_all_single`` and a ``send`` from the last rank to each other rank, checked exactly;
JSON events on stdout.

Usage: python torch_p2p_peer.py INIT_FILE WORLD RANK [STOP_AT]

With ``STOP_AT`` this rank prints ``stopping`` at that step and waits on stdin (the test then
SIGKILLs it). The others, once an operation raises, print ``raised`` (the error's type and
text, the operation), then ranks 0 and 1 exchange a message (``send``/``recv`` between
survivors still works: ``after``); on torch 2.14+ (``dist.shrink_group`` on our backend) they shrink
the world to themselves and all-reduce in it (``shrunk``).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.torch_version import TorchVersion

import pccl_aio.torch  # noqa: F401  (registers the backend)


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def step(i: int, rank: int, world: int) -> str:
    """One step; returns the name of the operation that raised, or ''."""
    op = "all_to_all_single"
    try:
        ins = torch.arange(4 * world, dtype=torch.float32) + 1000 * rank + i
        outs = torch.empty(4 * world)
        dist.all_to_all_single(outs, ins)
        want = torch.cat([torch.arange(4 * rank, 4 * rank + 4, dtype=torch.float32)
                          + 1000 * r + i for r in range(world)])
        if not torch.equal(outs, want):
            emit(event="wrong", op=op, step=i)
        op = "send/recv"
        last = world - 1
        if rank == last:
            for r in range(last):
                dist.send(torch.full((1000,), float(i)), r, tag=i % 1000)
        else:
            got = torch.empty(1000)
            dist.recv(got, last, tag=i % 1000)
            if not bool((got == i).all()):
                emit(event="wrong", op=op, step=i)
    except Exception as exc:  # (what the test checks: typed, on every survivor)
        emit(event="raised", op=op, step=i, type=type(exc).__name__, error=str(exc)[:300])
        return op
    return ""


def main() -> None:
    path, world, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stop_at = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    torch.set_num_threads(1)
    dist.init_process_group("pccl_aio", init_method=f"file://{path}", rank=rank,
                            world_size=world)
    emit(event="joined", rank=rank)
    for i in range(100_000):
        if i == stop_at:
            emit(event="stopping", step=i)
            sys.stdin.readline()  # (killed while it waits)
        if step(i, rank, world):
            break
    if rank in (0, 1):  # two survivors: point-to-point between them goes on
        x = torch.full((10,), 7.0 + rank)
        got = torch.empty(10)
        if rank == 0:
            dist.send(x, 1, tag=5000)
            dist.recv(got, 1, tag=5001)
        else:
            dist.recv(got, 0, tag=5000)
            dist.send(x, 0, tag=5001)
        emit(event="after", got=float(got[0]))
        if TorchVersion(torch.__version__) >= "2.14":  # the survivors' world of two
            dist.shrink_group([world - 1])
            t = torch.full((3,), float(rank + 1))
            dist.all_reduce(t)
            emit(event="shrunk", world=dist.get_world_size(), rank=dist.get_rank(),
                 sum=float(t[0]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
