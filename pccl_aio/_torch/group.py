"""``ProcessGroup``: a ``torch.distributed.ProcessGroup`` over a pccl_aio communicator.

Every method DDP, FSDP2, DTensor and the functional collectives call is a Python override that
launches the matching pccl_aio collective (``all_reduce``, ``broadcast``, ``all_gather``,
``reduce_scatter``, ``barrier``) on the communicator's loop without waiting for it (``post``;
the call DDP's reducer makes from its autograd thread must return at once; a launch error
surfaces at ``Work.wait()``) and returns a ``Work`` (``work.py``); ``Work.wait()`` blocks. As
with gloo, a collective that failed leaves its output holding unspecified bytes.

A group's rank and size are fixed when it is made, as torch assumes (its C++ side, DDP's
reducer among it, reads the size given then): every collective is pinned to the group's
ring (``ring=``), so once the peer group's membership changed (a peer lost or admitted, this
peer rejoined as a new member) every collective fails on every peer, with
``MembershipChangedError`` where the change is known, instead of computing a result of
another world (DDP would divide a sum of two by three). ``pccl_aio.torch.renew_process_group``
makes the group of the new membership. Tags cycle through ``TAGS`` values, the same on every
peer because torch makes every rank call the group's collectives in the same order; a tag
that comes round again starts early on its ticket. CUDA tensors are staged through host
memory by the communicator (``_peer/core/staging.py``); another device is an
``InvalidUsageError``. Point-to-point, all-to-all and ``reduce`` are ``p2p.py``'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _register_process_group

from .._errors import InvalidUsageError, MembershipChangedError, PeerLostError
from .._peer.communicator import AllReduceHandle as AsyncHandle
from .._peer.communicator import Communicator as AsyncCommunicator
from .._peer.core import staging
from .._types import ReduceOp
from ..blocking import AllReduceHandle, Communicator
from .p2p import PointToPointOps
from .work import Completions, Work, joined

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

    def _get_backend(self, device: Any) -> Any:
        """torch's backend of ``device``, or this group where torch has none: a Python group
        is its own backend (torch 2.15's ``batch_isend_irecv`` asks every group for one and
        reads ``supports_coalescing`` off it; a group has none: each send and receive is
        launched on its own)."""
        try:
            return super()._get_backend(device)
        except RuntimeError:
            return self


class ProcessGroup(PointToPointOps, Named):
    """The fault-tolerant process group of one connected ``blocking.Communicator``, for the
    peer group's membership as it is when it is made (``members``)."""

    def __init__(self, comm: Communicator, *, rank: int | None = None) -> None:
        """``rank``: the rank torch knows this peer by, where it is not the peer's ring
        position (the by-name group's, ``fixed.py``, which maps ranks to ring positions)."""
        if comm.rank < 0:
            raise InvalidUsageError("connect the communicator first (it has no rank yet)")
        members = tuple(comm.ranks)
        self._start(members.index(comm.peer_id) if rank is None else rank, len(members))
        self.bind(comm, members)

    def _start(self, rank: int, size: int) -> None:
        """What a group is before it has a communicator: torch's rank and size, a thread,
        a name (``bind`` gives it the communicator)."""
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._rank, self._size = rank, size
        self._tags = itertools.cycle(range(TAGS))
        self.completions = Completions()  # (the comm hook's works complete there too)
        self._coalescing: list[Work] | None = None
        # named and registered at once, for DeviceMesh.from_group (it finds groups by name);
        # init_process_group names the default group again, torch's way
        self._name = f"pccl_aio:{next(_names)}"
        _register_process_group(self._name, self)  # type: ignore[arg-type]

    def bind(self, comm: Communicator, members: tuple[int, ...]) -> None:
        """Pin the group to ``comm``'s ring ``members`` (peer ids in ring order); tags start
        again from the first."""
        self.comm = comm
        #: the peer ids of the group in ring order: the ring every collective is pinned to
        self.members = members
        self._peer = comm.peer_id
        self._tags = itertools.cycle(range(TAGS))

    # ---- what torch asks of a group ----------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"pccl_aio.torch.ProcessGroup(rank={self.rank()}, size={self.size()})"

    @property
    def membership_changed(self) -> bool:
        """The peer group is no longer ``members`` (as this peer knows it now): the group's
        collectives fail; make the new one with ``pccl_aio.torch.renew_process_group``."""
        return self.comm.peer_id != self._peer or tuple(self.comm.ranks) != self.members

    def close(self) -> None:
        """Stop the completion thread (the communicator is the caller's to close)."""
        self.completions.close()

    # ---- collectives -------------------------------------------------------------------------
    def _work(self, handles: list[AllReduceHandle], finish: Callable[[], Any],
              inline: bool = True) -> Work:
        """The work of ``handles``; ``inline=False`` where ``finish`` copies (it then runs on
        the completion thread, not the communicator's loop)."""
        return self.recorded(Work(handles, finish, self.completions, inline, self._typed))

    def recorded(self, work: Work) -> Work:
        """``work``, kept for ``_end_coalescing`` while coalescing."""
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def _start_coalescing(self, device: Any = None) -> None:
        """torch's ``_coalescing_manager``: the works launched until ``_end_coalescing`` are
        waited for as one (each runs as launched: nothing is held back)."""
        if self._coalescing is not None:
            raise InvalidUsageError("this group is already coalescing")
        self._coalescing = []

    def _end_coalescing(self, device: Any = None) -> Work:
        works, self._coalescing = self._coalescing, None
        if works is None:
            raise InvalidUsageError("_end_coalescing without _start_coalescing")
        return joined(works, self.completions)

    def _typed(self, exc: BaseException) -> BaseException:
        """A lost peer's error as a ``MembershipChangedError`` once the change is known."""
        if isinstance(exc, PeerLostError) and not isinstance(exc, MembershipChangedError) \
                and self.membership_changed:
            changed = MembershipChangedError(
                f"{exc}; the pccl_aio group's membership changed (this group: {self.size()} "
                f"ranks, peer ids {list(self.members)}; the peer group now: "
                f"{self.comm.peer_group_world_size}): make the group of the new membership "
                "with pccl_aio.torch.renew_process_group() (and DDP again on it)")
            changed.__cause__ = exc
            return changed
        return exc

    def post(self, make: Callable[[AsyncCommunicator], AsyncHandle]) -> AllReduceHandle:
        """Launch ``make(async_comm)`` on the communicator's loop without waiting for it
        (DDP's buckets are launched from its autograd thread, which must go on computing);
        a launch error surfaces in the work, at ``wait()``."""
        return self.comm._post(make)

    def _launch(self, make: Callable[[AsyncCommunicator, tuple[int, ...]], AsyncHandle]
                ) -> AllReduceHandle:
        """Post ``make(async_comm, members)``: a collective pinned to the group's ring."""
        members = self.members
        return self.post(lambda c: make(c, members))

    def launch_work(self, makes: list[Make], finish: Callable[[], Any],
                    inline: bool = True) -> Work:
        """Post each of ``makes`` pinned to the group's ring (``make(async_comm, members)``)
        and return them as one ``Work`` (for groups built on this one, ``fixed.py``)."""
        return self._work([self._launch(m) for m in makes], finish, inline)

    def peer_of(self, rank: int) -> int:
        """The peer id of torch rank ``rank`` (its ring position's, in this group)."""
        return self.members[rank]

    def rank_of(self, peer: int) -> int:
        """The torch rank of peer id ``peer``."""
        return self.members.index(peer)

    def next_tag(self) -> int:
        """The tag of the next collective (the same sequence on every rank)."""
        return next(self._tags)

    def allreduce(  # type: ignore[override]
            self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = reduce_op(opts if opts is not None else dist.ReduceOp.SUM)
        hs = [self._launch(_all_reduce(_cpu(t), op, next(self._tags))) for t in tensors]
        return self._work(hs, lambda: tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors, opts)

    def broadcast(  # type: ignore[override]
            self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        root = opts.rootRank if opts is not None else 0
        hs = [self._launch(_broadcast(_cpu(t), root, next(self._tags))) for t in tensors]
        return self._work(hs, lambda: tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Work:
        h = self._launch(_gather(_cpu(input), _cpu(output), next(self._tags)))
        return self._work([h], lambda: [output])

    _allgather_base = all_gather_single

    def allgather(  # type: ignore[override]
            self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Work:
        flats, hs = [], []
        for outs, t in zip(outputs, inputs, strict=True):
            flat = torch.empty(len(outs) * t.numel(), dtype=t.dtype)
            flats.append(flat)
            hs.append(self._launch(_gather(_cpu(t), flat, next(self._tags))))

        def finish() -> list[list[torch.Tensor]]:
            for outs, flat in zip(outputs, flats):
                for o, part in zip(outs, flat.chunk(len(outs))):
                    o.copy_(part.view(o.shape))
            return outputs

        return self._work(hs, finish, inline=False)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """``output_lists[r][i]``: rank r's ``inputs[i]`` (``dist.all_gather_coalesced``):
        one all-gather per input, waited for as one."""
        works = [self.allgather([[outs[i] for outs in output_lists]], [t])
                 for i, t in enumerate(inputs)]
        return joined(works, self.completions)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        hs = [self._launch(_gather(_cpu(i), _cpu(o), next(self._tags)))
              for o, i in zip(outputs, inputs, strict=True)]
        return self._work(hs, lambda: outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced  # type: ignore[assignment]

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Work:
        op = reduce_op(opts if opts is not None else dist.ReduceOp.SUM)
        h = self._launch(_scatter(_cpu(input), _cpu(output), op, next(self._tags)))
        return self._work([h], lambda: [output])

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
            self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Work:
        op = reduce_op(opts if opts is not None else dist.ReduceOp.SUM)
        hs = []
        for o, parts in zip(outputs, inputs, strict=True):
            flat = torch.cat([_cpu(p).reshape(-1) for p in parts])
            hs.append(self._launch(_scatter(flat, _cpu(o), op, next(self._tags))))
        return self._work(hs, lambda: outputs)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        op = reduce_op(opts if opts is not None else dist.ReduceOp.SUM)
        hs = [self._launch(_scatter(_cpu(i), _cpu(o), op, next(self._tags)))
              for o, i in zip(outputs, inputs, strict=True)]
        return self._work(hs, lambda: outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # type: ignore[assignment]

    def barrier(self, opts: Any = None) -> Work:
        tag = next(self._tags)
        h = self._launch(lambda c, ring: c.barrier_async(tag=tag, ring=ring))
        return self._work([h], lambda: None)

    def scatter(  # type: ignore[override]
            self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any = None) -> Work:
        """Rank ``root``'s ``inputs[0]`` (one tensor per rank), rank r's to ``outputs[0]``
        on rank r: a broadcast of them all, each rank keeping its own."""
        root, out, world, rank = (opts.rootRank if opts is not None else 0, outputs[0],
                                  self.size(), self.rank())
        if rank == root:
            flat = torch.cat([_cpu(t).reshape(-1) for t in inputs[0]])
        else:
            flat = torch.empty(world * out.numel(), dtype=out.dtype)
        h = self._launch(_broadcast(flat, root, next(self._tags)))

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
        h = self._launch(_gather(_cpu(t), flat, next(self._tags)))
        return self._work([h], lambda: outputs)


Make = Callable[[AsyncCommunicator, tuple[int, ...]], AsyncHandle]


def _broadcast(t: torch.Tensor, root: int, tag: int) -> Make:
    return lambda c, ring: c.broadcast_async(t, root=root, tag=tag, ring=ring)


def _gather(src: torch.Tensor, dst: torch.Tensor, tag: int) -> Make:
    return lambda c, ring: c.all_gather_async(src, dst, tag=tag, ring=ring)


def _scatter(src: torch.Tensor, dst: torch.Tensor, op: ReduceOp, tag: int) -> Make:
    return lambda c, ring: c.reduce_scatter_async(src, dst, op=op, tag=tag, ring=ring)


def _all_reduce(t: torch.Tensor, op: ReduceOp, tag: int) -> Make:
    """torch's semantics: after a failure the tensor holds unspecified bytes (no copy is
    saved to restore it: a copy of every bucket DDP reduces)."""
    return lambda c, ring: c.all_reduce_async(t, op=op, tag=tag, restore_on_abort=False,
                                              ring=ring)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """``t``, if its device is the CPU or one the communicator stages (CUDA);
    ``InvalidUsageError`` before anything is sent otherwise."""
    staging.needs(t)
    return t

