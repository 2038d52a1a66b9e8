"""What the membership and topology calls of ``Communicator`` do behind their documentation
(``update_topology``, ``are_peers_pending``, ``wait_for_peers``, ``optimize_topology``): check
the arguments (nothing is sent when one is bad), then vote through the control plane within
the call's deadline (``deadline.py``)."""

from __future__ import annotations

from collections.abc import Callable

from ..._errors import InvalidUsageError, PcclTimeoutError
from ..._text import plural
from ..._types import TopologyInfo
from ..._wire import messages as m
from .. import deadline
from . import arrivals
from .control import ControlPlane

__all__ = ["TopologyCalls"]


class TopologyCalls:
    """The joint votes of one communicator. ``check_usable`` raises why a call cannot be
    made now (another event loop, a session that ended)."""

    def __init__(self, control: ControlPlane, check_usable: Callable[[], None],
                 peer_group: int) -> None:
        self._control, self._check_usable, self._group = control, check_usable, peer_group

    async def update_topology(self, timeout: float | None) -> None:
        self._check_usable()
        limit = deadline.check(timeout)
        if self._control.colls:
            raise InvalidUsageError("update_topology() while collectives are in flight")
        await deadline.within(self._control.vote("topology", m.VoteUpdateTopology()), limit,
                              "update_topology()")

    async def are_peers_pending(self, timeout: float | None) -> bool:
        self._check_usable()
        limit = deadline.check(timeout)
        return bool(await deadline.within(self._control.vote("pending", m.VotePeersPending()),
                                          limit, "are_peers_pending()"))

    async def wait_for_peers(self, n: int, timeout: float | None) -> int:
        self._check_usable()
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidUsageError(f"n must be an int >= 1, not {n!r}")
        limit = deadline.check(timeout)
        control = self._control
        waited = arrivals.wait_for_peers(
            control.arrivals, n, lambda: control.peer_group_world_size, control.check_usable,
            lambda: self.are_peers_pending(None), lambda: self.update_topology(None))
        try:
            return await deadline.within(waited, limit, f"wait_for_peers({n})")
        except PcclTimeoutError as exc:
            raise PcclTimeoutError(
                f"{exc}: peer group {self._group} has {control.peer_group_world_size} of the "
                f"{plural(n, 'peer')} wanted, and nobody else joined") from None

    async def optimize_topology(self, timeout: float | None) -> TopologyInfo:
        self._check_usable()
        limit = deadline.check(timeout)
        if self._control.colls:
            raise InvalidUsageError("optimize_topology() while collectives are in flight")
        answer: m.TopologyOptimized = await deadline.within(
            self._control.vote("optimize", m.VoteOptimize()), limit, "optimize_topology()")
        return TopologyInfo(tuple(answer.ring), answer.measured, answer.bottleneck_bps)
