"""``PcclBackend``: the by-name group as a c10d ``Backend`` (torch 2.14 and later).

Since torch 2.14 a Python subclass of ``torch._C._distributed_c10d.Backend`` is a backend of
its own (torch's ``PyBackend`` trampoline): torch wraps it in its ``ProcessGroup``, runs its
hooks around each call and offers the fault-tolerance entry points. ``PcclBackend`` hands
every collective, point-to-point call and all-to-all to the ``FixedGroup`` it wraps (torch's
ranks, mapped onto the ring) and adds:

- ``get_error()``: ``ErrorType.COMM_ERROR`` once a call failed with a lost peer
  (``REMOTE_ERROR`` for another error, ``TIMEOUT`` for a timeout), else ``SUCCESS``;
  ``error`` is the exception itself.
- ``shrink(ranks)`` (``dist.shrink_group``): the survivors' backend. Blocks until the peer
  group is exactly the ranks that stay (the master dropped the excluded ones: at once for a
  killed process, after the heartbeat timeout for a frozen one; ``timeout`` at most, then
  ``PcclTimeoutError``), then makes a ``FixedGroup`` of them over the same communicator;
  ranks are renumbered in order, as torch does.
- ``abort()`` drops the run at once (the communicator closed, every call in flight fails);
  ``shutdown()`` is ``dist.destroy_process_group``'s orderly end (``FixedGroup.shutdown``);
  neither closes a communicator a shrunk backend took over. ``set_timeout`` sets the wait
  of ``shrink``.
- ``supports_reconfigure``, ``get_reconfigure_handle()``, ``reconfigure(opts)``: the
  group's (``FixedGroup``; ``reconfigure.py``), a replacement taking a lost rank.

On torch 2.13 ``Backend`` cannot be subclassed in Python: ``SUPPORTED`` is False and the
by-name form is the ``FixedGroup`` itself (a ``ProcessGroup``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Backend as _Backend
from torch.torch_version import TorchVersion

from .._errors import PcclTimeoutError, PeerLostError
from .fixed import FixedGroup
from .group import BACKEND
from .work import Work

__all__ = ["SUPPORTED", "PcclBackend"]

SUPPORTED = bool(TorchVersion(torch.__version__) >= "2.14")
POLL = 0.05  # seconds between looks at the membership while ``shrink`` waits
_CALLS = ("allreduce", "allreduce_coalesced", "broadcast", "allgather", "all_gather_single",
          "allgather_into_tensor_coalesced", "reduce_scatter", "reduce_scatter_single",
          "reduce_scatter_tensor_coalesced", "alltoall", "barrier", "gather", "scatter",
          "reduce", "send", "recv", "recv_anysource")


def _no(self: Any) -> bool:
    return False


class PcclBackend(_Backend):  # type: ignore[misc]
    """A c10d backend over ``group`` (see the module)."""

    def __init__(self, group: FixedGroup, timeout: timedelta = timedelta(minutes=30)) -> None:
        super().__init__(group.rank(), group.size())
        self.group = group
        self.timeout = timeout
        #: the last call's error (``get_error``)
        self.error: BaseException | None = None

    def getBackendName(self) -> str:
        return BACKEND

    def name(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"pccl_aio.torch.PcclBackend(rank={self.rank()}, size={self.size()})"

    # ---- calls: the group's, their errors noted ----------------------------------------------
    def _noted(self, work: Work) -> Work:
        def note(settled: torch.futures.Future[Any]) -> None:
            value = settled.value()
            if isinstance(value, BaseException):
                self.error = value

        work.settled().add_done_callback(note)
        return work

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> Work:
        return self._noted(self.group.alltoall_base(output, input, output_split_sizes,
                                                    input_split_sizes, opts))

    def _start_coalescing(self, device: Any = None) -> None:
        self.group._start_coalescing(device)

    def _end_coalescing(self, device: Any = None) -> Work:
        return self._noted(self.group._end_coalescing(device))

    # ---- fault tolerance ---------------------------------------------------------------------
    def get_error(self) -> Any:
        from torch._C._distributed_c10d import ErrorType

        if self.error is None:
            return ErrorType.SUCCESS
        if isinstance(self.error, TimeoutError):
            return ErrorType.TIMEOUT
        return ErrorType.COMM_ERROR if isinstance(self.error, PeerLostError) \
            else ErrorType.REMOTE_ERROR

    def set_timeout(self, timeout: timedelta) -> None:
        self.timeout = timeout

    @property
    def supports_shrinking(self) -> bool:
        return True

    # (answered here: torch's trampoline would look each one up here again, for ever)
    supports_coalescing = supports_splitting = supports_tensor_alloc = property(_no)
    supports_window = supports_abort_hooks = property(_no)

    @property
    def supports_reconfigure(self) -> bool:
        return True

    def get_reconfigure_handle(self) -> str:
        return self.group.get_reconfigure_handle()

    def reconfigure(self, opts: Any) -> Work:
        """Replace lost ranks (``FixedGroup.reconfigure``, ``reconfigure.py``); the last
        error is forgotten once it succeeded."""
        work = self.group.reconfigure(opts)
        self.error = None
        return work
    supports_completion_hooks = property(_no)

    def shrink(self, ranks_to_exclude: list[int], shrink_flags: int = 0,
               opts_override: Any = None) -> PcclBackend:
        """The backend of the ranks that stay; blocks until the peer group is theirs."""
        group, comm = self.group, self.group.comm
        stay = [p for r, p in enumerate(group.order) if r not in set(ranks_to_exclude)]
        end = time.monotonic() + self.timeout.total_seconds()
        while sorted(comm.ranks) != sorted(stay):
            if time.monotonic() > end:
                raise PcclTimeoutError(
                    f"shrink: the peer group is peers {sorted(comm.ranks)}, not the ranks "
                    f"that stay (peers {stay}), after {self.timeout.total_seconds():g} s")
            time.sleep(POLL)  # (the master's news arrive on the communicator's loop)
        shrunk = FixedGroup(comm, stay, master=group.master, linger=group.linger,
                            address=group.address, timeout=group.timeout)
        group.handed, group.master = True, None  # (the shrunk group ends them)
        return PcclBackend(shrunk, self.timeout)

    def abort(self) -> None:
        """Drop everything now: calls in flight fail on this rank."""
        self.group.close()
        if not self.group.handed:
            self.group.comm.close()

    def shutdown(self) -> None:
        self.group.shutdown()


def _delegate(name: str) -> Any:
    def call(self: PcclBackend, *args: Any) -> Work:
        return self._noted(getattr(self.group, name)(*args))

    call.__name__ = name
    call.__doc__ = f"The group's ``{name}``."
    return call


for _name in _CALLS:
    setattr(PcclBackend, _name, _delegate(_name))
