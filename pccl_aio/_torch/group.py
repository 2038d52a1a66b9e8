"""``ProcessGroup``: a ``torch.distributed.ProcessGroup`` over a pccl_aio communicator.

Every method DDP, FSDP2, DTensor and the functional collectives call is a Python override that
launches the matching pccl_aio collective (``all_reduce``, ``broadcast``, ``all_gather``,
``reduce_scatter``, ``barrier``) through the blocking facade and returns a ``Work``
(``work.py``). Launches return at once: ``allreduce`` (the call DDP's reducer makes from its
autograd thread, once per bucket) is posted to the communicator's loop without waiting for it
(``post``; a launch error surfaces at ``Work.wait()``), the others wait for the vote to go
out; ``Work.wait()`` blocks. As with gloo, an all-reduce that failed leaves its tensor holding
unspecified bytes (no copy is saved to restore it). Rank and size are the peer group's as
they are now (they change with the membership, and a collective launched before a change
raises ``PeerLostError``). Tags
cycle through ``TAGS`` values, the same on every peer because torch makes every rank call
the group's collectives in the same order; a tag that comes round again starts early on its
ticket. CUDA tensors are staged through host memory by the communicator
(``_peer/core/staging.py``); another device is an ``InvalidUsageError``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _register_process_group

from .._errors import InvalidUsageError
from .._peer.communicator import AllReduceHandle as AsyncHandle
from .._peer.communicator import Communicator as AsyncCommunicator
from .._peer.core import staging
from .._types import ReduceOp
from ..blocking import AllReduceHandle, Communicator
from .work import Completions, Work

__all__ = ["BACKEND", "Named", "ProcessGroup"]

BACKEND = "pccl_aio"
TAGS = 1 << 12  # tags cycled through (collectives in flight at once, at most)
_names = itertools.count()
_OPS = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.AVG: ReduceOp.AVG,
        dist.ReduceOp.PRODUCT: ReduceOp.PROD, dist.ReduceOp.MIN: ReduceOp.MIN,
        dist.ReduceOp.MAX: ReduceOp.MAX}


def reduce_op(opts: Any) -> ReduceOp:
    """pccl_aio's op for torch's options (or op); ``InvalidUsageError`` for one it lacks
    (BAND, BOR, BXOR, PREMUL_SUM)."""
    op = getattr(opts, "reduceOp", opts)
    for theirs, ours in _OPS.items():
        if op == theirs:
            return ours
    raise InvalidUsageError(f"reduce op {op} is not supported (SUM, AVG, PRODUCT, MIN, MAX)")


class Named(dist.ProcessGroup):
    """The name torch gives a group (``_set_group_name``) and reads back (``group_name``)."""

    _name = ""

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name


class ProcessGroup(Named):
    """The fault-tolerant process group of one connected ``blocking.Communicator``."""

    def __init__(self, comm: Communicator) -> None:
        if comm.rank < 0:
            raise InvalidUsageError("connect the communicator first (it has no rank yet)")
        super().__init__(comm.rank, comm.peer_group_world_size)  # type: ignore[call-arg]
        self.comm = comm
        self._tags = itertools.cycle(range(TAGS))
        self.completions = Completions()  # (the comm hook's works complete there too)
        # named and registered at once, for DeviceMesh.from_group (it finds groups by name);
        # init_process_group names the default group again, torch's way
        self._name = f"pccl_aio:{next(_names)}"
        _register_process_group(self._name, self)  # type: ignore[arg-type]

    # ---- what torch asks of a group ----------------------------------------------------------
    def rank(self) -> int:
        return self.comm.rank

    def size(self) -> int:
        return self.comm.peer_group_world_size

    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"pccl_aio.torch.ProcessGroup(rank={self.rank()}, size={self.size()})"

    def close(self) -> None:
        """Stop the completion thread (the communicator is the caller's to close)."""
        self.completions.close()

    # ---- collectives -------------------------------------------------------------------------
    def _work(self, handles: list[AllReduceHandle], finish: Callable[[], Any],
              inline: bool = True) -> Work:
        """The work of ``handles``; ``inline=False`` where ``finish`` copies (it then runs on
        the completion thread, not the communicator's loop)."""
        return Work(handles, finish, self.completions, inline)

    def post(self, make: Callable[[AsyncCommunicator], AsyncHandle]) -> AllReduceHandle:
        """Launch ``make(async_comm)`` on the communicator's loop without waiting for it
        (DDP's buckets are launched from its autograd thread, which must go on computing);
        a launch error surfaces in the work, at ``wait()``."""
        return self.comm._post(make)

    def next_tag(self) -> int:
        """The tag of the next collective (the same sequence on every rank)."""
        return next(self._tags)

    def allreduce(  # type: ignore[override]
            self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = reduce_op(opts if opts is not None else dist.ReduceOp.SUM)
        hs = [self.post(_all_reduce(_cpu(t), op, next(self._tags))) for t in tensors]
        return self._work(hs, lambda: tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors, opts)

    def broadcast(  # type: ignore[override]
            self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        root = opts.rootRank if opts is not None else 0
        hs = [self.comm.broadcast_async(_cpu(t), root=root, tag=next(self._tags))
              for t in tensors]
        return self._work(hs, lambda: tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Work:
        h = self.comm.all_gather_async(_cpu(input), _cpu(output), tag=next(self._tags))
        return self._work([h], lambda: [output])

    _allgather_base = all_gather_single

    def allgather(  # type: ignore[override]
            self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Work:
        flats, hs = [], []
        for outs, t in zip(outputs, inputs, strict=True):
            flat = torch.empty(len(outs) * t.numel(), dtype=t.dtype)
            flats.append(flat)
            hs.append(self.comm.all_gather_async(_cpu(t), flat, tag=next(self._tags)))

        def finish() -> list[list[torch.Tensor]]:
            for outs, flat in zip(outputs, flats):
                for o, part in zip(outs, flat.chunk(len(outs))):
                    o.copy_(part.view(o.shape))
            return outputs

        return self._work(hs, finish, inline=False)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        hs = [self.comm.all_gather_async(_cpu(i), _cpu(o), tag=next(self._tags))
              for o, i in zip(outputs, inputs, strict=True)]
        return self._work(hs, lambda: outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced  # type: ignore[assignment]

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Work:
        op = reduce_op(opts if opts is not None else dist.ReduceOp.SUM)
        h = self.comm.reduce_scatter_async(_cpu(input), _cpu(output), op=op,
                                           tag=next(self._tags))
        return self._work([h], lambda: [output])

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
            self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Work:
        op = reduce_op(opts if opts is not None else dist.ReduceOp.SUM)
        hs = []
        for o, parts in zip(outputs, inputs, strict=True):
            flat = torch.cat([_cpu(p).reshape(-1) for p in parts])
            hs.append(self.comm.reduce_scatter_async(flat, _cpu(o), op=op,
                                                     tag=next(self._tags)))
        return self._work(hs, lambda: outputs)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        op = reduce_op(opts if opts is not None else dist.ReduceOp.SUM)
        hs = [self.comm.reduce_scatter_async(_cpu(i), _cpu(o), op=op, tag=next(self._tags))
              for o, i in zip(outputs, inputs, strict=True)]
        return self._work(hs, lambda: outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # type: ignore[assignment]

    def barrier(self, opts: Any = None) -> Work:
        return self._work([self.comm.barrier_async(tag=next(self._tags))], lambda: None)

    def scatter(  # type: ignore[override]
            self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any = None) -> Work:
        """Rank ``root``'s ``inputs[0]`` (one tensor per rank), rank r's to ``outputs[0]``
        on rank r: a broadcast of them all, each rank keeping its own."""
        root, out, world = opts.rootRank if opts is not None else 0, outputs[0], self.size()
        rank = self.rank()  # (at the launch: the rank is live)
        if rank == root:
            flat = torch.cat([_cpu(t).reshape(-1) for t in inputs[0]])
        else:
            flat = torch.empty(world * out.numel(), dtype=out.dtype)
        h = self.comm.broadcast_async(flat, root=root, tag=next(self._tags))

        def finish() -> list[torch.Tensor]:
            out.copy_(flat.chunk(world)[rank].view(out.shape))
            return outputs

        return self._work([h], finish, inline=False)

    def gather(  # type: ignore[override]
            self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> Work:
        """Every rank's ``inputs[0]`` into rank ``root``'s ``outputs[0]``: an all-gather."""
        root = opts.rootRank if opts is not None else 0
        if self.rank() == root:
            return self.allgather(outputs, inputs)
        t = inputs[0]
        flat = torch.empty(self.size() * t.numel(), dtype=t.dtype)
        h = self.comm.all_gather_async(_cpu(t), flat, tag=next(self._tags))
        return self._work([h], lambda: outputs)


def _all_reduce(t: torch.Tensor, op: ReduceOp, tag: int
                ) -> Callable[[AsyncCommunicator], AsyncHandle]:
    """torch's semantics: after a failure the tensor holds unspecified bytes (no copy is
    saved to restore it: a copy of every bucket DDP reduces)."""
    return lambda c: c.all_reduce_async(t, op=op, tag=tag, restore_on_abort=False)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """``t``, if its device is the CPU or one the communicator stages (CUDA);
    ``InvalidUsageError`` before anything is sent otherwise."""
    staging.needs(t)
    return t

