"""PyTorch's ``torch.distributed`` on pccl_aio: the fault-tolerant process group.

    import torch.distributed as dist
    import pccl_aio.torch

    group = pccl_aio.torch.init_process_group("10.0.0.1:48148", min_peers=2)
    dist.all_reduce(t)             # on the pccl_aio group, torch's default now
    model = torch.nn.parallel.DistributedDataParallel(model)

Replicas that join and leave: ``pccl_aio.torch.DistributedDataParallel(model)``, DDP on
``local_group()`` (its own collectives stay in the process) with ``ddp_comm_hook``
all-reducing the gradients over the pccl_aio group.

Importing this module registers the backend name ``"pccl_aio"`` with torch (``dist.Backend``).
``init_process_group`` connects a ``pccl_aio.blocking.Communicator``, waits until the peer
group has ``min_peers`` peers (asleep meanwhile) and makes a ``ProcessGroup`` over it torch's
default group. Every collective raises pccl_aio's typed errors from ``Work.wait()`` (a lost
peer: ``PeerLostError``, on every peer). Needs torch; CPU or CUDA tensors (CUDA staged
through host memory).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from ._torch.ddp import DistributedDataParallel
from ._torch.group import BACKEND, ProcessGroup, reduce_op
from ._torch.hooks import AllReduceHook, HookState, ddp_comm_hook
from ._torch.local import LocalGroup, local_group
from ._torch.work import Work
from .blocking import Communicator

__all__ = ["BACKEND", "AllReduceHook", "DistributedDataParallel", "HookState", "LocalGroup",
           "ProcessGroup", "Work", "ddp_comm_hook", "init_process_group", "local_group",
           "reduce_op"]

_handing: list[ProcessGroup] = []  # the group ``init_process_group`` hands torch's factory


def _factory(store: Any, rank: int, world_size: int, timeout: timedelta) -> ProcessGroup:
    if not _handing:
        raise RuntimeError("the pccl_aio backend is created by pccl_aio.torch."
                           "init_process_group(master, ...), not by dist.init_process_group")
    return _handing.pop()


dist.Backend.register_backend(BACKEND, _factory, devices=["cpu"])


def init_process_group(master: str, *, min_peers: int = 1, timeout: float | None = None,
                       **communicator_options: Any) -> ProcessGroup:
    """Connect to the run at ``master``, wait for ``min_peers`` peers in this peer group and
    make the pccl_aio group torch's default; returns it (``group.comm`` is the blocking
    communicator). Blocks for the connection and the wait (``timeout`` seconds at most for
    each: ``PcclTimeoutError``); raises the communicator's errors. Call
    ``dist.destroy_process_group()`` and ``group.comm.close()`` at the end.
    """
    comm = Communicator(master, **communicator_options)
    try:
        comm.connect()
        if min_peers > 1:
            comm.wait_for_peers(min_peers, timeout=timeout)
        group = ProcessGroup(comm)
        _handing.append(group)
        try:
            dist.init_process_group(BACKEND, store=HashStore(), rank=group.rank(),
                                    world_size=group.size())
        finally:
            _handing.clear()
    except BaseException:
        comm.close()
        raise
    return group
