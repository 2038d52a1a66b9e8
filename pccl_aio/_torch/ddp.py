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

from .._errors import InvalidUsageError, MasterLostError, PcclError, SharedStateError
from .._peer.state.core.shared_state import SharedState
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
    ``process_group`` nor ``find_unused_parameters``). Before each step ``sync(state)``
    admits joiners and syncs the state (a joiner, or a replica back from a freeze, receives
    it there)."""

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
        self._voted = False  # (the first ``sync`` votes on nothing)

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

    def sync(self, state: SharedState) -> int:
        """Before each step, on every replica: admit the replicas waiting to join (a joint
        vote: ``are_peers_pending``, then ``update_topology``), then make ``state`` (model,
        optimizer state, step) identical on every replica, so that a joiner receives it;
        bumps ``state.revision`` and returns the number of replicas of the step.

        What a replica meets on the way is handled here, the same way on every replica: a
        sync that failed on every peer is run again; a call the master's loss interrupted
        (``MasterLostError``) is retried, that call and not the ones before it (the others
        may have had its answer); a replica that rejoined as a new member (frozen, or cut
        off, past the timeouts: ``MasterLostError.new_member``, seen here or by the hook)
        skips the vote and syncs first, as a joiner does, receiving the run's state. The
        first call of a replica votes on nothing (a joiner was just admitted; at the start
        every replica makes it). Blocks; raises what ends the session
        (``MasterConnectionError`` after ``master_timeout``, ``KickedError``,
        ``DeadlockError``).
        """
        comm, hook = self.hook.group.comm, self.hook
        stage = "sync" if hook.rejoined or not self._voted else "vote"
        self._voted, hook.rejoined = True, False
        while True:
            try:
                if stage == "vote":
                    stage = "admit" if comm.are_peers_pending() else "sync"
                elif stage == "admit":
                    comm.update_topology()
                    stage = "sync"
                else:
                    comm.sync_shared_state(state)
                    break
            except MasterLostError as exc:  # retry that call, or sync first as a joiner
                if exc.new_member:
                    stage = "sync"
            except SharedStateError:  # (failed on every peer: again)
                pass
        state.revision += 1
        return comm.peer_group_world_size


def _default_group() -> ProcessGroup:
    pg = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    if not isinstance(pg, ProcessGroup):
        raise InvalidUsageError("no pccl_aio group: call pccl_aio.torch.init_process_group() "
                                "first or pass group=")
    return pg
