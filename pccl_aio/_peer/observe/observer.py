"""What a peer tells about itself: its log lines and its counters (``core/stats.py``).

One line per event, each with the run, peer and group ids (``ControlPlane.ids``): at INFO
the ring changing (peers lost or joined), an all-reduce aborted (and why) and a relaunch by
``all_reduce_multiple_with_retry``; at DEBUG each all-reduce completed (bytes, seconds).
The master session logs its own events (``session.py``: connected; ``communicator.py``:
admitted; ``failover.py``: master lost and rejoined). The counters change once per
collective, never per frame; ``metrics.py`` serves them when ``metrics_port`` is given.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..._errors import PeerLostError
from ..._text import plural
from ..._wire import messages as m
from .core.stats import PeerStats, size_class

if TYPE_CHECKING:
    from ..data.collective import Collective
    from ..session.control import ControlPlane

__all__ = ["Observer"]

log = logging.getLogger("pccl_aio.peer")


class Observer:
    """One communicator's events, as log lines and ``stats``."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        self.stats = PeerStats()
        self._ring: list[int] = []  # this peer's ring as of the last Membership

    def watch(self, coll: Collective) -> Collective:
        """Count and log ``coll`` when it ends (latency from now); returns it."""
        coll.hooks.append(_Watch(self, asyncio.get_running_loop()))
        return coll

    def ended(self, coll: Collective, seconds: float) -> None:
        """A collective's attempt ended (its verdict, ``seconds`` after its launch); logs
        name its kind (``all-reduce``, ``broadcast``, ...)."""
        stats = self.stats
        if coll.seq:
            stats.moved(coll.traffic())
        fut = coll.future
        exc = None if fut.cancelled() else fut.exception()
        if exc is None:
            nbytes = coll.dst.count * coll.dst.dtype.itemsize
            stats.completed += 1
            stats.latency[size_class(nbytes)].observe(seconds)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s tag=%d seq=%d completed: %d B in %.4f s", coll.kind.label,
                          coll.tag, coll.seq, nbytes, seconds, extra=self.control.ids(
                              tag=coll.tag, seq=coll.seq, bytes=nbytes,
                              seconds=round(seconds, 6), tx=coll.tx, rx=coll.rx))
        elif isinstance(exc, PeerLostError):
            stats.aborted += 1
            cause = str(exc).removeprefix(f"{coll.kind.label} tag {coll.tag} aborted: ")
            log.info("%s tag=%d seq=%d aborted: %s", coll.kind.label, coll.tag, coll.seq,
                     cause, extra=self.control.ids(tag=coll.tag, seq=coll.seq, cause=cause))
        else:
            stats.failed += 1
            log.debug("%s tag=%d seq=%d failed: %r", coll.kind.label, coll.tag, coll.seq, exc,
                      extra=self.control.ids(tag=coll.tag, seq=coll.seq, cause=repr(exc)))

    def retried(self, tag: int, attempt: int, max_attempts: int, exc: BaseException) -> None:
        """``all_reduce_multiple_with_retry`` relaunches ``tag`` (its ``attempt``-th)."""
        self.stats.retries += 1
        cause = _cause(tag, exc)
        log.info("retrying all-reduce tag=%d (attempt %d of %d) after: %s", tag, attempt,
                 max_attempts, cause, extra=self.control.ids(tag=tag, attempt=attempt,
                                                              cause=cause))

    def admitted(self, world: int) -> None:
        """``connect`` returns: this peer is a member of the run."""
        cp = self.control
        log.info("peer %d admitted to the run: ring of group %d is %s, world size %d",
                 cp.peer_id, cp.config.peer_group, _ids(self._ring), world,
                 extra=cp.ids(ring=self._ring, world=world))

    def on_membership(self, msg: m.Membership) -> None:
        """A new ``Membership``: one line if this peer's ring changed (not at admission,
        which ``connect`` logs)."""
        ring = [p.peer_id for p in msg.ring]
        self.stats.forget(ring)
        old, self._ring = self._ring, ring
        if not old or old == ring:
            return
        gone, new = set(old) - set(ring), set(ring) - set(old)
        lost = [p for p in old if p in gone]
        joined = [p for p in ring if p in new]
        what = [f"lost peer {_ids(lost)}"] if lost else []
        what += [f"peer {_ids(joined)} joined"] if joined else []
        log.info("%s: ring of group %d is now %s (%s), world size %d",
                 ", ".join(what) or "ring reordered", self.control.config.peer_group,
                 _ids(ring), plural(len(ring), "peer"), msg.global_world_size,
                 extra=self.control.ids(ring=ring, world=msg.global_world_size, lost=lost,
                                        joined=joined))


def _cause(tag: int, exc: BaseException) -> str:
    """Why an all-reduce was aborted: the master's reason (``Collective.on_abort``)."""
    return str(exc).removeprefix(f"all-reduce tag {tag} aborted: ")


def _ids(peers: list[int]) -> str:
    return ",".join(str(p) for p in peers)


class _Watch:
    """A collective's end hook: reports it once (``_finish`` may run more than once)."""

    __slots__ = ("done", "loop", "obs", "t0")

    def __init__(self, obs: Observer, loop: asyncio.AbstractEventLoop) -> None:
        self.obs, self.loop, self.t0, self.done = obs, loop, loop.time(), False

    def __call__(self, coll: Collective) -> None:
        if not self.done:
            self.done = True
            try:
                self.obs.ended(coll, self.loop.time() - self.t0)
            except Exception:  # a bug here must not keep the other hooks (retry) from running
                log.exception("counting all-reduce tag=%d failed", coll.tag)
