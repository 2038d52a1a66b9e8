"""PyTorch's ``torch.distributed`` on pccl_aio: the fault-tolerant process group.

By name, a fixed world (torchrun, ``env://``, ``file://``; ``_torch/rendezvous.py``)::

    import pccl_aio.torch
    dist.init_process_group("pccl_aio")  # torch's ranks; rank 0 starts the run's master

Rank 0's process hosts the master (unless ``$PCCL_AIO_MASTER`` names one): when it dies, the
run's master dies with it. ``dist.destroy_process_group()`` closes the communicator (rank 0:
after the other ranks left, then the master).

The live membership, for replicas that join and leave::

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

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from ._errors import InvalidUsageError
from ._peer.communicator import env_options
from ._torch import rendezvous
from ._torch.backend import SUPPORTED, PcclBackend
from ._torch.ddp import DistributedDataParallel
from ._torch.fixed import FixedGroup
from ._torch.group import BACKEND, ProcessGroup, reduce_op
from ._torch.hooks import AllReduceHook, HookState, ddp_comm_hook
from ._torch.local import LocalGroup, local_group
from ._torch.reconfigure import ENV
from ._torch.reconfigure import reconfigure as _reconfigure
from ._torch.work import Work
from .blocking import Communicator

__all__ = ["BACKEND", "AllReduceHook", "DistributedDataParallel", "FixedGroup", "HookState",
           "LocalGroup", "PcclBackend", "fixed_group",
           "ProcessGroup", "Work", "ddp_comm_hook", "init_process_group", "local_group",
           "reconfigure", "reconfigure_handle", "reduce_op", "renew_process_group"]

_handing: list[ProcessGroup] = []  # the group ``init_process_group`` hands torch's factory


def _factory(opts: Any, backend_options: Any = None) -> ProcessGroup | LocalGroup:
    """torch's creator for ``"pccl_aio"`` (``opts``: torch's ``_DistributedBackendOptions``):
    the live-membership group ``init_process_group`` hands it, else the by-name group met
    through torch's store (``_torch/rendezvous.py``; blocks until every rank arrived,
    ``timeout`` at most), a subgroup of a by-name world too, or a rank that joins at
    ``reconfigure`` (``enable_reconfigure=True`` on torch 2.15, ``$PCCL_AIO_RECONFIGURE=1``
    on any: it connects to nothing now). A subgroup of the live-membership group is refused
    (``InvalidUsageError``): its ranks would not survive the next change of membership."""
    store, rank, world_size = opts.store, opts.group_rank, opts.group_size
    timeout: timedelta = opts.timeout
    if _handing:
        return _handing.pop()
    if dist.is_initialized():
        if fixed_group() is None:
            raise InvalidUsageError(
                "subgroups (dist.new_group, new_subgroups, split_group) of the live-membership "
                "group are not supported (by name, dist.init_process_group('pccl_aio'), they "
                "are)")
        if world_size == 1:  # (a group of this rank alone: new_subgroups(group_size=1))
            return LocalGroup()  # type: ignore[return-value]
        return _form(rendezvous.create(store, rank, world_size, timeout, subgroup=True),
                     timeout)
    if getattr(opts, "enable_reconfigure", False) or os.environ.get(ENV, "") == "1":
        return _form(FixedGroup(None, rank=rank, size=world_size,
                                timeout=timeout.total_seconds()), timeout)
    return _form(rendezvous.create(store, rank, world_size, timeout), timeout)


def _form(group: FixedGroup, timeout: timedelta) -> FixedGroup:
    """The by-name group as torch takes it: the ``ProcessGroup`` itself (its calls are
    Python's; torch 2.15 drops a Python work's source rank on the way out of a ``Backend``,
    so a receive from any rank needs this form), with, where torch has the form (2.14+), a
    ``PcclBackend`` registered for the CPU and CUDA, which ``dist.shrink_group`` and torch's
    other fault-tolerance entry points find."""
    if SUPPORTED:
        custom, backend = dist.ProcessGroup.BackendType.CUSTOM, PcclBackend(group, timeout)
        for device in ("cpu", "cuda"):  # (CUDA tensors are staged through the host)
            group._register_backend(torch.device(device), custom, backend)
        group._set_default_backend(custom)
    return group


def fixed_group(group: Any = None) -> FixedGroup | None:
    """The ``FixedGroup`` of a by-name group (torch's default if None), in either form;
    None if it is not one."""
    pg = group if group is not None else (
        dist.distributed_c10d._get_default_group() if dist.is_initialized() else None)
    if isinstance(pg, FixedGroup) or pg is None:
        return pg
    if not isinstance(pg, dist.ProcessGroup):
        return None
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return backend.group if isinstance(backend, PcclBackend) else None


dist.Backend.register_backend(BACKEND, _factory, extended_api=True, devices=["cpu"])


def reconfigure_handle(group: Any = None) -> str:
    """This process's handle for ``reconfigure`` in the by-name ``group`` (torch's default if
    None): what torch 2.15's ``dist._get_reconfigure_handle`` returns. Does not block."""
    return _fixed(group).get_reconfigure_handle()


def reconfigure(uuid: int, handles: Any, group: Any = None,
                timeout: timedelta | None = None) -> None:
    """Make the by-name ``group``'s ranks the processes of ``handles`` (one per rank, from
    ``reconfigure_handle`` in each; a list in rank order or a set): a replacement takes a
    lost rank and every collective works again, on every rank, with the same size
    (``_torch/reconfigure.py``). torch 2.15's ``dist._reconfigure`` on any torch. Every
    rank calls it with the same ``uuid`` and handles; blocks until the peer group is the
    handles' processes (``timeout``, else the group's, ``PcclTimeoutError``).
    ``InvalidUsageError`` on every rank for handles that do not fit."""
    seconds = timeout.total_seconds() if timeout is not None else None
    _reconfigure(_fixed(group), uuid, handles, seconds)


def _fixed(group: Any) -> FixedGroup:
    fixed = fixed_group(group)
    if fixed is None:
        raise InvalidUsageError("reconfigure is for a group of dist.init_process_group("
                                "'pccl_aio') (the live-membership group takes replicas as "
                                "they come)")
    return fixed


def init_process_group(master: str | None = None, *, min_peers: int = 1,
                       timeout: float | None = None, **communicator_options: Any
                       ) -> ProcessGroup:
    """Connect to the run at ``master``, wait for ``min_peers`` peers in this peer group and
    make the pccl_aio group torch's default; returns it (``group.comm`` is the blocking
    communicator). Blocks for the connection and the wait (``timeout`` seconds at most for
    each: ``PcclTimeoutError``); raises the communicator's errors. Call
    ``dist.destroy_process_group()`` and ``group.comm.close()`` at the end.

    ``master=None``: the run the environment names (``Communicator.from_env()``:
    ``$PCCL_AIO_MASTER``, else ``$MASTER_ADDR``). Under ``torchrun --nproc-per-node K`` with
    K > 1 the job is one replica: torch's default group is torchrun's own (``gloo``, or
    ``nccl`` where CUDA is; made here unless it exists) for FSDP inside the replica, and the
    pccl_aio group returned, across replicas (rank r of every job in peer group r), is not
    the default: pass it as ``group=`` or to ``DeviceMesh.from_group``.
    """
    if master is None:
        masters, found = env_options()
        communicator_options = {**found, **communicator_options}
        if communicator_options.get("replica_size", 1) > 1:  # (torchrun's job: a replica)
            if not dist.is_initialized():
                dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            comm = _connected(masters, min_peers, timeout, communicator_options)
            try:
                return ProcessGroup(comm)
            except BaseException:
                comm.close()
                raise
        master = ",".join(masters)
    comm = _connected(master.split(","), min_peers, timeout, communicator_options)
    try:
        return _make_default(comm)
    except BaseException:
        comm.close()
        raise


def _connected(master: list[str], min_peers: int, timeout: float | None,
               options: dict[str, Any]) -> Communicator:
    comm = Communicator(master if len(master) > 1 else master[0], **options)
    try:
        comm.connect()
        if min_peers > 1:
            comm.wait_for_peers(min_peers, timeout=timeout)
    except BaseException:
        comm.close()
        raise
    return comm


def renew_process_group(group: ProcessGroup | None = None) -> ProcessGroup:
    """Take the peer group's present membership: a new ``ProcessGroup`` over ``group``'s
    communicator (torch's default group if None), with the ranks and size of the peer group
    as it is now, made torch's default group in its place when it was the default (torch's
    other groups are destroyed with it, as ``dist.destroy_process_group()`` does). The old
    group stops its thread; its collectives keep failing. Build DDP (or what else read the
    old size) again on the new group. Call it on every surviving rank after
    ``MembershipChangedError`` (from ``backward()``, a ``RuntimeError`` naming it;
    ``group.membership_changed`` tells). Nothing is sent; does not block.
    """
    old = group if group is not None else _default()
    if old is None:
        raise InvalidUsageError("no pccl_aio group is torch's default: pass group=")
    if isinstance(old, FixedGroup):
        raise InvalidUsageError("a group made by dist.init_process_group('pccl_aio') is a "
                                "fixed world: destroy it and init_process_group again")
    if old.comm.rank < 0:
        raise InvalidUsageError("this peer is not a member of the run now (it rejoined as a "
                                "new member, admitted by the others' update_topology())")
    if old is _default():
        dist.destroy_process_group()
        new = _make_default(old.comm)
    else:
        new = ProcessGroup(old.comm)
    old.close()
    return new


def _make_default(comm: Communicator) -> ProcessGroup:
    """A group over ``comm`` made torch's default (through the registered factory)."""
    group = ProcessGroup(comm)
    _handing.append(group)
    try:
        dist.init_process_group(BACKEND, store=HashStore(), rank=group.rank(),
                                world_size=group.size())
    finally:
        _handing.clear()
    return group


def _default() -> ProcessGroup | None:
    """torch's default group, if it is a pccl_aio group."""
    pg = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    return pg if isinstance(pg, ProcessGroup) else None
