"""``DistributedDataParallel``: torch's DDP over fault-tolerant replicas (torchft's shape).

DDP is built on ``local_group()`` (``local.py``): its own collectives (the constructor's shape
check and module broadcast, buffer broadcasts) stay in the process, so a replica may join
mid-run; ``ddp_comm_hook`` all-reduces every gradient bucket over the pccl_aio group with AVG
over the replicas that take part. ``find_unused_parameters=True`` keeps DDP's bucket layout
the one it builds at construction: by default DDP rebuilds its buckets after the first
iteration in gradient-ready order, so a joiner's first step would all-reduce its buckets laid
out otherwise than the others' (the same sizes, other parameters at each offset: wrong
gradients, no error). DDP then warns once that it found no unused parameter.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .._errors import InvalidUsageError, PcclError
from .._types import Quantization
from .group import ProcessGroup
from .hooks import HookState, ddp_comm_hook
from .local import local_group

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """``DistributedDataParallel(module, group=None, *, quantization=None, **ddp_options)``:
    DDP whose gradients are averaged over the replicas of the pccl_aio ``group`` (torch's
    default group when it is one). After ``backward()``: ``failed`` is True when a replica was
    lost mid-step (on every survivor alike): skip ``optimizer.step()``, call ``reset()`` and run
    the step again; else step and ``reset()``. ``ddp_options`` go to torch's DDP (not
    ``process_group`` nor ``find_unused_parameters``)."""

    def __init__(self, module: torch.nn.Module, group: ProcessGroup | None = None, *,
                 quantization: Quantization | None = None, **ddp_options: Any) -> None:
        for name in ("process_group", "find_unused_parameters", "device_mesh"):
            if name in ddp_options:
                raise InvalidUsageError(f"{name}= is set by pccl_aio.torch."
                                        "DistributedDataParallel (see its docstring)")
        if group is None:
            group = _default_group()
        if not isinstance(group, ProcessGroup):
            raise InvalidUsageError(f"group must be a pccl_aio.torch.ProcessGroup, not "
                                    f"{type(group).__name__}")
        super().__init__(module, process_group=local_group(), find_unused_parameters=True,
                         **ddp_options)
        self.hook = HookState(group, quantization)
        self.register_comm_hook(self.hook, ddp_comm_hook)

    @property
    def failed(self) -> bool:
        """True once a bucket of this step was aborted (the step is void on every survivor)."""
        return self.hook.failed

    @property
    def error(self) -> PcclError | None:
        """The first error of this step (``PeerLostError``...), else None."""
        return self.hook.error

    def reset(self) -> None:
        """A new step: call it after each optimizer step, or skipped one."""
        self.hook.reset()


def _default_group() -> ProcessGroup:
    pg = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    if not isinstance(pg, ProcessGroup):
        raise InvalidUsageError("no pccl_aio group: call pccl_aio.torch.init_process_group() "
                                "first or pass group=")
    return pg
