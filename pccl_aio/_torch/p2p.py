"""The process groups' point-to-point calls, all-to-alls and ``reduce`` (a base class of
``group.ProcessGroup``).

``send``/``recv``/``recv_anysource`` (and through them ``isend``, ``irecv``,
``batch_isend_irecv``) are the communicator's ``send_async``/``recv_async`` to the peer
id of torch's rank (``peer_of``); torch's tag is the message's. ``all_to_all`` and
``all_to_all_single`` (equal or unequal splits) are the communicator's ``all_to_all_async``
pinned to the group's ring, with the blocks put in ring order: every rank completes or every
rank raises. ``reduce`` is an all-reduce whose result only the root keeps (the others reduce
a copy, so their tensors are left as they were). CUDA and non-contiguous tensors go through
a contiguous host copy; received bytes are copied back when the work completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .._errors import InvalidUsageError
from .._peer.communicator import Communicator as AsyncCommunicator
from .._peer.p2p.calls import TransferHandle as AsyncTransfer
from .._types import TransferInfo
from ..blocking import Communicator, TransferHandle
from .work import Completions, Work, done

__all__ = ["PointToPointOps", "SourcedWork"]


class SourcedWork(Work):
    """A receive's work: ``_source_rank()`` (what ``dist.recv`` reads for a receive from any
    rank) is the torch rank of the peer that sent it."""

    def __init__(self, handle: TransferHandle, finish: Callable[[], Any],
                 completions: Completions, rank_of: Callable[[int], int],
                 inline: bool) -> None:
        self._handle, self._rank_of = handle, rank_of
        super().__init__([handle], finish, completions, inline=inline)

    def _source_rank(self) -> int:
        self.wait()
        info: TransferInfo = self._handle.result()
        return self._rank_of(info.peer)

    source_rank = _source_rank


class PointToPointOps(dist.ProcessGroup):
    """``send``, ``recv``, ``recv_anysource``, ``alltoall``, ``alltoall_base``, ``reduce``
    for a group that maps torch's ranks to peer ids (``peer_of``, ``rank_of``) and to ring
    positions (``members``: the peer ids in ring order)."""

    comm: Communicator
    members: tuple[int, ...]
    completions: Completions
    #: the last send posted to the loop thread (and the communicator it went to): a send
    #: written from this thread must not overtake it (``send``)
    _posted_send: tuple[Communicator, TransferHandle] | None = None

    if TYPE_CHECKING:  # (what the group defines)
        def peer_of(self, rank: int) -> int: ...

        def rank_of(self, peer: int) -> int: ...

        def next_tag(self) -> int: ...

        def recorded(self, work: Work) -> Work: ...

        def allreduce(  # type: ignore[override]
                self, tensors: list[torch.Tensor], opts: Any = None) -> Work: ...

        def launch_work(self, makes: list[Callable[[AsyncCommunicator, tuple[int, ...]], Any]],
                        finish: Callable[[], Any], inline: bool = True) -> Work: ...

    # ---- point-to-point ----------------------------------------------------------------------
    def _other(self, rank: int, what: str) -> int:
        if not 0 <= rank < self.size() or rank == self.rank():
            raise InvalidUsageError(f"{what} rank {rank} is not another rank of this group "
                                    f"of {self.size()}")
        return self.peer_of(rank)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0  # type: ignore[override]
             ) -> Work:
        """Written from this thread where it can be (``send_from_thread``: a small message
        with nothing before it), else posted to the loop thread."""
        peer = self._other(dstRank, "destination")
        host, _ = _host(_one(tensors), load=True)
        posted, comm = self._posted_send, self.comm  # (a rebound group has a new one)
        last = posted[1] if posted is not None and posted[0] is comm else None
        now = comm._send_now(host, peer, tag) if last is None or last.launched() else None
        if now is not None and now.done() and now.exception() is None:
            return self.recorded(done(tensors))  # (written whole: nothing to wait for)
        if now is not None:
            return self.recorded(Work([now], lambda: tensors, self.completions, inline=True))
        h = comm._post_transfer(lambda c: _send(c, host, peer, tag))
        self._posted_send = (comm, h)
        return self.recorded(Work([h], lambda: tensors, self.completions, inline=True))

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0  # type: ignore[override]
             ) -> Work:
        return self._recv(tensors, self._other(srcRank, "source"), tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0  # type: ignore[override]
                       ) -> Work:
        return self._recv(tensors, None, tag)

    def _recv(self, tensors: list[torch.Tensor], peer: int | None, tag: int) -> Work:
        t = _one(tensors)
        host, back = _host(t, load=False)
        h = self.comm._post_transfer(lambda c: _receive(c, host, peer, tag))

        def finish() -> list[torch.Tensor]:
            back()
            return tensors

        return self.recorded(SourcedWork(h, finish, self.completions, self.rank_of,
                                         inline=back is _nothing))

    # ---- all-to-all --------------------------------------------------------------------------
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # type: ignore[override]
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      opts: Any = None) -> Work:
        world = self.size()
        outs = _split(output, output_split_sizes, world, "output")
        ins = _split(input, input_split_sizes, world, "input")
        return self.alltoall(outs, ins, opts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],  # type: ignore[override]
                 opts: Any = None) -> Work:
        world = self.size()
        if len(outputs) != world or len(inputs) != world:
            raise InvalidUsageError(f"all_to_all takes {world} tensors to send and to "
                                    f"receive, not {len(inputs)} and {len(outputs)}")
        by_ring = [self.rank_of(p) for p in self.members]  # ring position -> torch rank
        src = [_host(inputs[r], load=True)[0] for r in by_ring]
        staged = [_host(outputs[r], load=False) for r in by_ring]
        dst = [h for h, _ in staged]
        tag = self.next_tag()

        def finish() -> list[torch.Tensor]:
            for _, back in staged:
                back()
            return outputs

        return self.launch_work(
            [lambda c, ring: c.all_to_all_async(src, dst, tag=tag, ring=ring)], finish,
            inline=False)

    # ---- reduce ------------------------------------------------------------------------------
    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        """An all-reduce; ranks but the root reduce a copy (their tensors stay as they were)."""
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self.size():
            raise InvalidUsageError(f"root {root} is not a rank of a group of {self.size()}")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if self.rank() == root:
            return self.allreduce(tensors, op)
        return self.allreduce([t.clone() for t in tensors], op)


def _send(c: AsyncCommunicator, t: torch.Tensor, peer: int, tag: int) -> AsyncTransfer:
    return c.send_async(t, peer, tag=tag)


def _receive(c: AsyncCommunicator, t: torch.Tensor, peer: int | None, tag: int
             ) -> AsyncTransfer:
    return c.recv_async(t, peer, tag=tag)


def _one(tensors: list[torch.Tensor]) -> torch.Tensor:
    if len(tensors) != 1:
        raise InvalidUsageError(f"point-to-point takes one tensor, not {len(tensors)}")
    return tensors[0]


def _host(t: torch.Tensor, load: bool) -> tuple[torch.Tensor, Callable[[], None]]:
    """A contiguous CPU tensor of ``t``'s bytes (``t`` itself where it is one; a copy, of
    ``t``'s values if ``load``) as uint8, and what copies it back into ``t``."""
    if t.device.type == "cpu" and t.is_contiguous():
        return _bytes(t), _nothing
    host = t.detach().to("cpu", memory_format=torch.contiguous_format) if load else \
        torch.empty(t.shape, dtype=t.dtype)

    def back() -> None:
        with torch.no_grad():
            t.copy_(host)

    return _bytes(host), back


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _nothing() -> None:
    return None


def _split(t: torch.Tensor, sizes: list[int], world: int, what: str) -> list[torch.Tensor]:
    """``t`` cut along its first dimension into ``world`` blocks (``sizes`` rows each, or
    equal ones when ``sizes`` is empty)."""
    if not sizes:
        if t.shape[0] % world if t.dim() else True:
            raise InvalidUsageError(f"all_to_all_single's {what} of {tuple(t.shape)} does not "
                                    f"split into {world} equal blocks")
        return list(t.chunk(world)) if t.shape[0] else [t] * world
    if len(sizes) != world or sum(sizes) != (t.shape[0] if t.dim() else 0):
        raise InvalidUsageError(f"all_to_all_single's {what} split sizes {sizes} do not cut "
                                f"{tuple(t.shape)} into {world} blocks")
    return list(torch.split(t, sizes))

