"""What the collective calls of ``Communicator`` do behind their documentation: check the
arguments (``core/args.py``; nothing is sent when one is bad), launch one collective
(``all_reduce``, ``barrier``, ``launch_ranked``: broadcast, all-gather, reduce-scatter) or
many all-reduces with relaunches (``retry.MultiReduce``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..._errors import InvalidUsageError, TooFewPeersError
from ..._types import CollectiveKind, DataType, Quantization, ReduceInfo, ReduceOp
from ..core import args
from ..core.buffers import Buffer, as_buffer
from ..core.staging import HostPool, Stages
from ..observe.observer import Observer
from ..session.control import ControlPlane
from .collective import Collective, Spec
from .dataplane import DataPlane
from .handle import AllReduceHandle
from .retry import MultiReduce

__all__ = ["ReduceCalls"]


class ReduceCalls:
    """The all-reduce calls of one communicator. ``check_loop`` raises ``InvalidUsageError``
    off the communicator's event loop."""

    def __init__(self, control: ControlPlane, data: DataPlane, obs: Observer,
                 check_loop: Callable[[], None], peer_group: int) -> None:
        self._control, self._data, self._obs = control, data, obs
        self._check_loop, self._group = check_loop, peer_group
        self._host = HostPool()  # host twins of device tensors (``core/staging.py``)

    def launch(self, src: Any, dst: Any, op: Any, tag: Any, quantization: Any,
               restore_on_abort: Any, awaited: bool,
               ring: Sequence[int] | None = None) -> AllReduceHandle:
        """Check the arguments, then vote for one all-reduce (``ring``: only in that ring,
        ``pinned``); its handle."""
        self._check_usable()
        spec = None if ring is None else Spec(ranks=pinned(ring))
        if not isinstance(restore_on_abort, bool):
            raise InvalidUsageError(
                f"restore_on_abort must be True or False, not {restore_on_abort!r}")
        stages = Stages(self._host)
        try:
            same = dst is None or dst is src
            src = stages.host(src, load=True, out=same)
            dst = src if same else stages.host(dst, load=False, out=True)
            s, d, in_place = args.buffers(src, dst)
            op = args.op(op)
            tag = args.tag(tag)
            quant = args.quantization(quantization, d.dtype)
            if tag in self._control.colls:
                raise InvalidUsageError(f"tag {tag} is already in flight on this peer")
            self._check_group()
            coll = self._obs.watch(Collective(self._data, tag, s, d, op, in_place, quant,
                                              restore=restore_on_abort, spec=spec))
            _staged(coll, stages)
            self._control.launch(coll, awaited)
        except BaseException:
            stages.done(False)
            raise
        return AllReduceHandle(coll, self._check_loop, self._control.awaiting)

    def launch_ranked(self, kind: CollectiveKind, src: Any, dst: Any, op: Any, tag: Any,
                      quantization: Any, root: Any, awaited: bool,
                      restore: Any = False, ring: Sequence[int] | None = None
                      ) -> AllReduceHandle:
        """Check the arguments of a barrier, broadcast, all-gather or reduce-scatter against
        the ring as it is now (``comm.ranks``), or ``ring`` (``pinned``) if given, then vote
        for it in that ring; its handle (done at once in a group of one)."""
        self._check_usable()
        ms, me = self._control.membership, self._control.peer_id
        ranks = [p.peer_id for p in ms.ring] if ms is not None else []
        if ring is not None and me in (pin := pinned(ring)):
            ranks = list(pin)  # (this peer in none of it: the start fails it for the group)
        rank = ranks.index(me) if me in ranks else 0
        tag = args.tag(tag)
        stages = Stages(self._host)
        try:
            if kind != CollectiveKind.BARRIER:  # device tensors: their host twins
                src = stages.host(src, load=kind != CollectiveKind.BROADCAST or root == rank,
                                  out=kind == CollectiveKind.BROADCAST)
                dst = dst if dst is None else stages.host(dst, load=False, out=True)
            return self._launch_ranked(kind, src, dst, op, tag, quantization, root, awaited,
                                       restore, ranks, rank, stages)
        except BaseException:
            stages.done(False)
            raise

    def _launch_ranked(self, kind: CollectiveKind, src: Any, dst: Any, op: Any, tag: int,
                       quantization: Any, root: Any, awaited: bool, restore: Any,
                       ranks: list[int], rank: int, stages: Stages) -> AllReduceHandle:
        ms, world = self._control.membership, len(ranks)
        copy_own, reduce_op, quant, at = True, ReduceOp.SUM, None, 0
        if kind == CollectiveKind.BARRIER:
            s = d = as_buffer(src, writable=True, what="a barrier's buffer")
        elif kind == CollectiveKind.BROADCAST:
            if not isinstance(restore, bool):
                raise InvalidUsageError(
                    f"restore_on_abort must be True or False, not {restore!r}")
            s = d = as_buffer(src, writable=True, what="tensor")
            at = args.root(root, max(world, 1))
        elif kind == CollectiveKind.ALL_GATHER:
            s, d, copy_own = args.gathered(src, dst, world, rank)
        else:
            s, d = args.scattered(src, dst, world)
            reduce_op = args.op(op)
            quant = args.quantization(quantization, d.dtype)
            if quant is not None and quant.dtype == DataType.UINT4 and d.count % 2:
                raise InvalidUsageError("a reduce-scatter quantized to uint4 needs an even "
                                        f"count per rank, not {d.count}")
        if tag in self._control.colls:
            raise InvalidUsageError(f"tag {tag} is already in flight on this peer")
        spec = Spec(kind, at, tuple(ranks), ms.epoch if ms is not None else 0, copy_own)
        if world == 1 and ms is not None and len(ms.ring) > 1:
            world = 0  # (pinned to a ring of one in a larger group: voted, failed at the start)
        coll = self._obs.watch(Collective(self._data, tag, s, d, reduce_op,
                                          kind == CollectiveKind.BROADCAST, quant,
                                          restore=restore is True, spec=spec))
        _staged(coll, stages)
        handle = AllReduceHandle(coll, self._check_loop, self._control.awaiting)
        if world == 1:
            coll.alone()
        else:
            self._control.launch(coll, awaited)
        return handle

    async def multiple(self, tensors: Sequence[Any], op: Any, max_in_flight: Any,
                       first_tag: Any, max_attempts: Any, quantization: Quantization | None,
                       restore_on_abort: Any, limit: float | None) -> list[ReduceInfo]:
        """``all_reduce_multiple_with_retry`` once its ``timeout`` is checked (``limit``)."""
        args.positive("max_in_flight", max_in_flight)
        args.positive("max_attempts", max_attempts)
        stages = Stages(self._host)  # device tensors: host twins, stored back on success
        try:
            tensors = [stages.host(t, load=True, out=True) for t in tensors]
            result = await self._multiple(tensors, op, max_in_flight, first_tag, max_attempts,
                                          quantization, restore_on_abort, limit)
        except BaseException:
            stages.done(False)
            raise
        stages.done(True)
        return result

    async def _multiple(self, tensors: Sequence[Any], op: Any, max_in_flight: Any,
                        first_tag: Any, max_attempts: Any, quantization: Quantization | None,
                        restore_on_abort: Any, limit: float | None) -> list[ReduceInfo]:
        bufs, tags, quant_of = args.multi(tensors, first_tag, quantization, restore_on_abort)
        reduce_op = args.op(op)
        busy = set(tags) & set(self._control.colls)
        if busy:
            raise InvalidUsageError(f"tags {sorted(busy)} are already in flight")
        self._check_group()

        def make(tag: int, buf: Buffer) -> Collective:
            return self._obs.watch(Collective(self._data, tag, buf, buf, reduce_op, True,
                                              quant_of[tag], restore=restore_on_abort))

        return await MultiReduce(self._control, make, bufs, tags, max_in_flight,
                                 max_attempts if restore_on_abort else 1,
                                 self._obs.retried).run(limit)

    def _check_usable(self) -> None:
        self._check_loop()
        self._control.check_usable()

    def _check_group(self) -> None:
        size = self._control.peer_group_world_size
        if size < 2:
            raise TooFewPeersError(f"peer group {self._group} has {size} peer(s)")


def pinned(ring: Sequence[int]) -> tuple[int, ...]:
    """A collective's ``ring=``: the peer ids, in rank order, of the only ring it may run in
    (``comm.ranks`` as the caller last took it). The master starts it in the group's ring as
    it is then; if that is another (a peer lost or admitted since, the order changed), every
    peer of the attempt fails it for the group (``PeerLostError`` on every peer), so a
    caller that sized its work by the pinned ring never gets a result of another world.
    ``InvalidUsageError`` for what is not a non-empty sequence of distinct peer ids."""
    if isinstance(ring, (str, bytes)) or not isinstance(ring, Sequence):
        raise InvalidUsageError(f"ring must be a sequence of peer ids, not {ring!r}")
    ids = tuple(ring)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i > 0
                          for i in ids) or len(set(ids)) != len(ids):
        raise InvalidUsageError(f"ring must hold distinct positive peer ids, not {ring!r}")
    return ids


def _staged(coll: Collective, stages: Stages) -> None:
    """Device tensors: the results go back to them once ``coll`` succeeded (before its caller
    resumes); their host twins are released whatever happened."""
    if stages:
        coll.hooks.append(lambda c: stages.done(
            not c.future.cancelled() and c.future.exception() is None))
