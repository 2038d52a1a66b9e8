"""``local_group()``: a process group of this process alone, for DDP over fault-tolerant
replicas (torchft's shape: DDP's own collectives stay local, the gradients travel in the hook).

DDP's constructor checks shapes (``allgather``) and copies rank 0's module (``broadcast``), its
second iteration broadcasts the rebuilt bucket order, and each forward may broadcast buffers.
Over a group whose members come and go, a replica joining mid-run would make those calls
alone and wait for ever. Built on this group instead, DDP makes them with itself (each returns
at once); the comm hook (``hooks.ddp_comm_hook``) all-reduces the gradients over the pccl_aio
group, and a joiner receives the model from a shared-state sync. Nothing here blocks.
"""

from __future__ import annotations

from typing import Any

import torch

from .group import Named
from .work import Work, done

__all__ = ["LocalGroup", "local_group"]


class LocalGroup(Named):
    """Rank 0 of a world of one: every collective is a local copy (reductions of one rank are
    the identity), completed at once."""

    def __init__(self) -> None:
        super().__init__(0, 1)  # type: ignore[call-arg]

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def getBackendName(self) -> str:
        return "pccl_aio.local"

    def __repr__(self) -> str:
        return "pccl_aio.torch.LocalGroup()"

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None  # type: ignore[override]
                  ) -> Work:
        return done(tensors)

    allreduce_coalesced = allreduce

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None  # type: ignore[override]
                  ) -> Work:
        return done(tensors)

    def allgather(self, outputs: list[list[torch.Tensor]],  # type: ignore[override]
                  inputs: list[torch.Tensor], opts: Any = None) -> Work:
        for outs, t in zip(outputs, inputs, strict=True):
            outs[0].copy_(t)
        return done(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Work:
        output.view(-1).copy_(input.reshape(-1))
        return done([output])

    _allgather_base = all_gather_single

    def reduce_scatter(self, outputs: list[torch.Tensor],  # type: ignore[override]
                       inputs: list[list[torch.Tensor]], opts: Any = None) -> Work:
        for o, parts in zip(outputs, inputs, strict=True):
            o.copy_(parts[0])
        return done(outputs)

    # (one rank: its whole input is its part)
    reduce_scatter_single = all_gather_single  # type: ignore[assignment]
    _reduce_scatter_base = all_gather_single  # type: ignore[assignment]

    def barrier(self, opts: Any = None) -> Work:
        return done(None)

    def scatter(self, outputs: list[torch.Tensor],  # type: ignore[override]
                inputs: list[list[torch.Tensor]], opts: Any = None) -> Work:
        outputs[0].copy_(inputs[0][0])
        return done(outputs)

    def gather(self, outputs: list[list[torch.Tensor]],  # type: ignore[override]
               inputs: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allgather(outputs, inputs)


_local: list[LocalGroup] = []


def local_group() -> LocalGroup:
    """This process's ``LocalGroup`` (one per process): pass it as DDP's ``process_group``
    when the gradients go through ``ddp_comm_hook``, so replicas may join and leave."""
    if not _local:
        _local.append(LocalGroup())
    return _local[0]
