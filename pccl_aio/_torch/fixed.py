"""``FixedGroup``: the by-name group (``dist.init_process_group("pccl_aio")``), whose ranks
are torch's.

pccl_aio orders a peer group's ring by admission (and ``optimize_topology``), not by the rank
torch gave each process. A ``FixedGroup`` knows each rank's peer id (``order``, exchanged
through torch's store, ``rendezvous.py``) and maps torch's ranks onto ring positions: a
broadcast or scatter root is sent to the collective as the root's ring position, an
all-gather's blocks are put back in rank order, a reduce-scatter's input blocks are put in
ring order before it runs. All-reduce and barrier need no mapping. When the ring happens to
be in rank order nothing is copied. Everything else is ``ProcessGroup``'s: every collective
pinned to the ring the group was made with, so after a lost or admitted peer (or a ring the
master reordered) every collective raises ``MembershipChangedError`` on every rank. The
world's size is fixed: the survivors shrink it (``dist.shrink_group``, ``backend.py``) or a
replacement takes the lost rank (``reconfigure``, ``reconfigure.py``), which rebinds the
group to the new ring.

``shutdown()`` (``dist.destroy_process_group()``) closes the communicator; in the rank that
started the run's master it waits (``linger`` seconds at most) until the other ranks have
left the run, then closes the master, so that no rank's last collective loses its master.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist

from .._errors import InvalidUsageError
from .._peer.core import staging
from ..blocking import Communicator, Master
from .group import Make, ProcessGroup, reduce_op
from .reconfigure import handle_of, reconfigure
from .work import Work, done

__all__ = ["FixedGroup"]

POLL = 0.05  # seconds between looks at the run's membership while the master's rank lingers


class FixedGroup(ProcessGroup):
    """The group of ``comm`` with torch's ranks: ``order[r]`` is rank r's peer id; the
    group's peers must be exactly those (``InvalidUsageError`` otherwise). ``master``: the
    run's master, started by this rank, closed at ``shutdown()``; ``address``: the master's
    address (what ``reconfigure`` hands a replacement). ``comm=None``: a rank that joins at
    ``reconfigure`` (``rank`` and ``size`` given; every call before raises
    ``InvalidUsageError``)."""

    def __init__(self, comm: Communicator | None, order: Sequence[int] = (), *,
                 master: Master | None = None, linger: float = 30.0, address: str = "",
                 rank: int = -1, size: int = 0, timeout: float = 1800.0) -> None:
        if comm is None:
            self._start(rank, size)
            self.comm, self.members = cast(Communicator, Unjoined(rank)), ()
            #: the peer ids in torch's rank order
            self.order: tuple[int, ...] = ()
        else:
            order = tuple(order)
            _check(comm, order)
            super().__init__(comm, rank=order.index(comm.peer_id))
            self.order = order
        self.master, self.linger, self.address, self.timeout = master, linger, address, timeout
        self._positions()
        #: this process's part of a reconfigure handle (``reconfigure.py``)
        self.nonce = secrets.token_hex(8)
        #: a shrunk group took the communicator (and master) over (``backend.py``)
        self.handed = False

    def _positions(self) -> None:
        #: ``position[r]``: torch rank r's position in the ring
        self.position = tuple(self.members.index(p) for p in self.order)
        #: ``rank_at[p]``: the torch rank at ring position p
        self.rank_at = tuple(self.order.index(p) for p in self.members)
        self.in_rank_order = self.position == tuple(range(len(self.order)))

    @property
    def joined(self) -> bool:
        """The group has its communicator (it was not made to join at ``reconfigure``, or
        has been reconfigured since)."""
        return not isinstance(self.comm, Unjoined)

    def recorded(self, work: Work) -> Work:
        """``work`` with the group's timeout as its wait's default (gloo's rule: a
        collective not done within ``init_process_group``'s timeout raises)."""
        work.default_timeout = self.timeout
        return super().recorded(work)

    def need_joined(self) -> None:
        """``InvalidUsageError`` before ``reconfigure`` joined this rank to its group."""
        if not self.joined:
            self.comm.peer_id  # noqa: B018  (``Unjoined`` raises the error)

    def rebind(self, comm: Communicator, order: list[int], address: str) -> None:
        """Take ``comm``'s peer group with torch's ranks ``order`` (``reconfigure``): the
        collectives from now on are pinned to its ring."""
        _check(comm, tuple(order))
        self.bind(comm, tuple(comm.ranks))
        self.order, self.address = tuple(order), address
        self._positions()

    def __repr__(self) -> str:
        return f"pccl_aio.torch.FixedGroup(rank={self.rank()}, size={self.size()})"

    # ---- replacing a lost rank (torch's reconfigure API; ``reconfigure.py``) -----------------
    @property
    def supports_reconfigure(self) -> bool:
        return True

    def get_reconfigure_handle(self) -> str:
        return handle_of(self)

    def reconfigure(self, opts: Any) -> Work:
        """torch's ``dist._reconfigure`` (``ReconfigureOptions``): blocks until the ranks of
        ``opts.handles`` are this group's, then returns a completed ``Work``."""
        seconds = opts.timeout.total_seconds() if opts.timeout is not None else -1
        reconfigure(self, opts.uuid, opts.handles, seconds if seconds > 0 else None)
        return done(None)

    def peer_of(self, rank: int) -> int:
        self.need_joined()
        return self.order[rank]

    def rank_of(self, peer: int) -> int:
        return self.order.index(peer)

    def ring_root(self, root: int) -> Any:
        """Options naming torch rank ``root``'s ring position (what ``ProcessGroup`` reads)."""
        if not 0 <= root < self.size():
            raise InvalidUsageError(f"root {root} is not a rank of a group of {self.size()}")
        self.need_joined()
        opts = dist.BroadcastOptions()
        opts.rootRank = self.position[root]
        return opts

    # ---- collectives with a root -------------------------------------------------------------
    def broadcast(  # type: ignore[override]
            self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        root = opts.rootRank if opts is not None else 0
        return super().broadcast(tensors, self.ring_root(root))

    def scatter(  # type: ignore[override]
            self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
            opts: Any = None) -> Work:
        """Rank ``root``'s ``inputs[0]`` (one tensor per rank, in rank order), rank r's to
        ``outputs[0]`` on rank r: a broadcast of them all, each rank keeping its own."""
        root = opts.rootRank if opts is not None else 0
        ring, out, world, rank = self.ring_root(root), outputs[0], self.size(), self.rank()
        if rank == root:
            flat = torch.cat([_cpu(t).reshape(-1) for t in inputs[0]])
        else:
            flat = torch.empty(world * out.numel(), dtype=out.dtype)
        tag = self.next_tag()

        def finish() -> list[torch.Tensor]:
            out.copy_(flat.chunk(world)[rank].view(out.shape))
            return outputs

        return self.launch_work([_broadcast(flat, ring.rootRank, tag)], finish, inline=False)

    # (gather: ``ProcessGroup.gather`` compares torch ranks and calls ``allgather`` below)

    # ---- all-gathers: blocks arrive in ring order, go out in rank order ----------------------
    def gathered(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Work:
        """All-gather each ``(src, dst)``: ``dst`` holds every rank's ``src`` in rank order."""
        self.need_joined()
        if self.in_rank_order:
            makes = [_gather(_cpu(s), _cpu(d), self.next_tag()) for s, d in pairs]
            return self.launch_work(makes, lambda: [d for _, d in pairs])
        scratch = [torch.empty_like(_cpu(d)) for _, d in pairs]
        makes = [_gather(_cpu(s), t, self.next_tag()) for (s, _), t in zip(pairs, scratch)]
        index = torch.tensor(self.position)

        def finish() -> list[torch.Tensor]:
            for (_, d), t in zip(pairs, scratch):
                d.view(self.size(), -1).copy_(t.view(self.size(), -1).index_select(0, index))
            return [d for _, d in pairs]

        return self.launch_work(makes, finish, inline=False)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Work:
        return self.gathered([(input, output)])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        return self.gathered(list(zip(inputs, outputs, strict=True)))

    all_gather_single_coalesced = allgather_into_tensor_coalesced  # type: ignore[assignment]

    def allgather(  # type: ignore[override]
            self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
            opts: Any = None) -> Work:
        flats = [torch.empty(len(outs) * t.numel(), dtype=t.dtype)
                 for outs, t in zip(outputs, inputs, strict=True)]
        makes = [_gather(_cpu(t), f, self.next_tag()) for t, f in zip(inputs, flats)]

        def finish() -> list[list[torch.Tensor]]:
            for outs, flat in zip(outputs, flats):
                parts = flat.chunk(len(outs))
                for r, o in enumerate(outs):
                    o.copy_(parts[self.position[r]].view(o.shape))
            return outputs

        return self.launch_work(makes, finish, inline=False)

    # ---- reduce-scatters: the input's blocks in ring order first -----------------------------
    def ring_blocks(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (one block per rank, in rank order) with its blocks in ring order."""
        if self.in_rank_order:
            return t
        return _cpu(t).reshape(self.size(), -1).index_select(
            0, torch.tensor(self.rank_at, device=t.device)).reshape(-1)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Work:
        return super().reduce_scatter_single(output, self.ring_blocks(input), opts)

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
            self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
            opts: Any = None) -> Work:
        reduce_op(opts if opts is not None else dist.ReduceOp.SUM)  # (refused before a copy)
        return super().reduce_scatter(
            outputs, [[parts[r] for r in self.rank_at] for parts in inputs], opts)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        return super().reduce_scatter_tensor_coalesced(
            outputs, [self.ring_blocks(t) for t in inputs], opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # type: ignore[assignment]

    # ---- the end -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Close the communicator (leaving the run) and stop the group's thread; in the
        master's rank, first wait until the other ranks left the run (``linger`` seconds at
        most: a rank that does not end its process group is waited for that long), then close
        the master. Blocks for that wait; idempotent. A group a shrink took over
        (``handed``: its communicator and master are the shrunk group's now) only stops its
        thread."""
        comm = self.comm
        if self.handed or not self.joined:
            self.close()
            return
        if self.master is not None and not comm.closed:
            end = time.monotonic() + self.linger
            while (len(comm.ranks) > 1 or comm.world_size > 1) and time.monotonic() < end:
                time.sleep(POLL)  # (the ranks' departures arrive on the communicator's loop)
        self.close()
        comm.close()
        if self.master is not None:
            self.master.close()


class Unjoined:
    """The communicator of a rank that joins at ``reconfigure``: every use is an error."""

    def __init__(self, rank: int) -> None:
        self._rank = rank

    def __getattr__(self, name: str) -> Any:
        raise InvalidUsageError(
            f"rank {self._rank} joins its group at reconfigure (it was made with "
            "enable_reconfigure / $PCCL_AIO_RECONFIGURE): call dist._reconfigure (or "
            "pccl_aio.torch.reconfigure) with every rank's handle first")


def _check(comm: Communicator, order: tuple[int, ...]) -> None:
    if sorted(order) != sorted(comm.ranks) or comm.peer_id not in order:
        raise InvalidUsageError(
            f"the pccl_aio peer group is peers {sorted(comm.ranks)}, torch's ranks are "
            f"peers {list(order)}: another process joined the same peer group of the "
            "master (give each run its own master or PCCL_AIO_MASTER)")


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """``t``, if the communicator can send it (CPU, or CUDA staged); ``InvalidUsageError``
    before anything is sent otherwise."""
    staging.needs(t)
    return t


def _broadcast(t: torch.Tensor, root: int, tag: int) -> Make:
    return lambda c, ring: c.broadcast_async(t, root=root, tag=tag, ring=ring)


def _gather(src: torch.Tensor, dst: torch.Tensor, tag: int) -> Make:
    return lambda c, ring: c.all_gather_async(src, dst, tag=tag, ring=ring)
