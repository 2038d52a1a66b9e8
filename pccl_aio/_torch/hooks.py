"""The DDP communication hook of the pccl_aio group: fault-tolerant replicas, the torchft way.

``ddp_comm_hook(state, bucket)`` all-reduces each gradient bucket with AVG over the replicas
that take part (the world may shrink mid-run; DDP's own division by its fixed world size is
the default hook's, which this one replaces). A bucket whose all-reduce is aborted (a replica
was lost: ``PeerLostError`` on every survivor alike) leaves the local gradients as they were
and marks the step ``failed`` in ``HookState``: the training loop then skips the optimizer
step on every survivor and runs the step again. A replica alone in its group keeps its own
gradient. Every bucket is launched whatever happened to the ones before, so the replicas
always make the same calls in the same order; a bucket's tag is fixed (``HOOK_TAGS`` + its
index), so its all-reduce starts early on its ticket. Runs in DDP's autograd threads; nothing
here blocks (the collective completes on the group's thread). Build DDP on ``local_group()``
(``local.py``) so that replicas can join mid-run: DDP's own collectives then stay local.
``AllReduceHook`` is the same for FSDP2's ``set_all_reduce_hook``. Annotations here are
objects, not strings: DDP compares the hook's with ``dist.GradBucket``
(``torch._C._distributed_c10d.GradBucket``).
"""

from typing import Any

import torch
from torch._C._distributed_c10d import GradBucket

from .._errors import MasterLostError, PcclError, SharedStateError, TooFewPeersError
from .._peer.state.core.shared_state import SharedState
from .._types import Quantization, ReduceOp
from .group import ProcessGroup
from .work import Work, done

__all__ = ["FSDP_HOOK_TAG", "HOOK_TAGS", "AllReduceHook", "HookState", "ddp_comm_hook"]

#: The hook's tags: bucket i's is ``HOOK_TAGS + i`` (above the group's own, ``group.TAGS``).
HOOK_TAGS = 1 << 32
#: ``AllReduceHook``'s tag (one call at a time; fixed, so it starts early on its ticket).
FSDP_HOOK_TAG = 1 << 33


class HookState:
    """The hook's state for one DDP model (``model.register_comm_hook(state, ddp_comm_hook)``):
    ``failed`` once a bucket of this step was aborted, ``error`` the first such error."""

    def __init__(self, group: ProcessGroup, quantization: Quantization | None = None) -> None:
        self.group, self.quantization = group, quantization
        self.failed = False
        self.error: PcclError | None = None
        #: this replica rejoined the run as a new member (``MasterLostError.new_member``: it
        #: was frozen or cut off past the timeouts): its next sync receives the run's state
        #: before it votes on anything, as a joiner's first does. Kept across ``reset()``.
        self.rejoined = False

    def reset(self) -> None:
        """A new step (call it after each optimizer step or skipped one)."""
        self.failed, self.error = False, None

    def _lost(self, exc: PcclError) -> None:
        if isinstance(exc, MasterLostError) and exc.new_member:
            self.rejoined = True
        if not self.failed:
            self.failed, self.error = True, exc


def ddp_comm_hook(state: HookState, bucket: GradBucket
                  ) -> torch.futures.Future[torch.Tensor]:
    """All-reduce one bucket (AVG over the replicas taking part, quantized on the wire with
    ``state.quantization``); its future gives the bucket. See the module's docstring."""
    buf: torch.Tensor = bucket.buffer()
    group = state.group
    # a bucket's tag is the same every step (DDP waits for all of a step's buckets), so from
    # the second step on each starts at once on the ticket its previous run handed out
    tag, quant = HOOK_TAGS + bucket.index(), state.quantization
    try:  # (posted: the autograd thread goes on at once; a launch error comes in settle)
        handle = group.post(lambda c: c.all_reduce_async(buf, op=ReduceOp.AVG, tag=tag,
                                                         quantization=quant))
    except PcclError as exc:  # (the communicator is closed: the step is void)
        state._lost(exc)
        return done(buf).get_future()
    work = Work([handle], lambda: buf, group.completions, inline=True)

    def settle(f: torch.futures.Future[Any]) -> torch.Tensor:
        error = f.value()  # (the bucket, or the error itself: ``Work.settled``)
        if isinstance(error, TooFewPeersError):  # alone (at the launch or since): its own
            pass
        elif isinstance(error, PcclError):  # aborted on every survivor alike: step void
            state._lost(error)
        elif isinstance(error, BaseException):
            raise error
        return buf

    return work.settled().then(settle)


class AllReduceHook(HookState):
    """FSDP2's all-reduce hook over fault-tolerant replicas: ``fully_shard`` a model over the
    processes of one replica (gloo), then ``model.set_all_reduce_hook(hook)``. Each call
    averages a reduce-scattered gradient over the pccl_aio ``group`` (AVG over the replicas
    taking part; shard i of every replica in peer group i), blocking until it is done. A
    replica lost mid-step marks the step ``failed`` instead of raising, so FSDP's backward
    completes; alone in its group a replica keeps its own gradient. A replica's shards are in
    different groups, so one may fail a step another completed: after ``backward()`` ask
    ``failed_in(replica_group)`` (the flag ORed over the replica's processes, one gloo
    all-reduce): every replica then skips the same steps. ``reset()`` before the next step.
    Replicas join through ``admit()``, called between steps on every process."""

    _voted = False  # (admit's first call votes on nothing)

    def __call__(self, grad: torch.Tensor) -> None:
        try:  # (every call is made whatever happened before: the same calls on every peer)
            self.group.comm.all_reduce(grad, op=ReduceOp.AVG, tag=FSDP_HOOK_TAG,
                                       quantization=self.quantization)
        except TooFewPeersError:
            pass
        except PcclError as exc:
            self._lost(exc)

    def failed_in(self, replica_group: Any = None) -> bool:
        """Did any process of this replica see the step fail? A gloo all-reduce (MAX) over
        ``replica_group`` (torch's default group if None); blocks for it."""
        return _any(self.failed, replica_group)

    def admit(self, state: SharedState, replica_group: Any = None) -> int:
        """Between two steps, on every process of every replica: admit the replicas waiting to
        join, and make ``state`` (this shard's parameters, optimizer state and step) identical
        across this shard's peer group, so that a joiner receives it; returns the group's size.

        Admission is a joint vote of every member of every group (``are_peers_pending``, then
        ``update_topology``): the same answer on every process, so a joining replica's shards
        are admitted at the same step everywhere. Make a replica's communicators with
        ``replica=`` and ``replica_size=``: else its shards may be admitted one round apart,
        one then waiting over gloo for a partner that cannot be admitted without its vote. The
        first call votes on nothing (a joiner was just admitted; at the start every replica
        makes it). A sync that failed in either of the replica's groups (a replica was lost
        meanwhile) is run again by both (``replica_group``: the replica's processes, torch's
        default group if None). Blocks; raises what the votes raise (``MasterLostError``...).
        """
        comm = self.group.comm
        if self._voted and not self.rejoined and comm.are_peers_pending():
            comm.update_topology()
        self._voted, self.rejoined = True, False
        while True:
            failed = False
            try:
                comm.sync_shared_state(state)
            except SharedStateError:  # every peer of this group got it
                failed = True
            if not _any(failed, replica_group):
                state.revision += 1
                return comm.peer_group_world_size


def _any(flag: bool, replica_group: Any) -> bool:
    """``flag`` ORed over ``replica_group`` (a gloo all-reduce, MAX); blocks for it."""
    import torch.distributed as dist

    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=replica_group)
    return bool(t.item())
