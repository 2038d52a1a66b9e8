"""One attempt's data flow: its run task, the receive callbacks and the link's backlog.

The receiver writes a frame where the ``DataPath`` says (``target``); the receive callback
(``on_segment``) works the segment and forwards it at once when the link to the successor
has room, else it waits in order (worked, in ``_outbox``; or, where the path ``defers``,
unworked, in ``_inbox``) for the run task, so receive, reduce and send overlap. The run task
opens the link, sends the path's own frames, forwards what waited, and ends when every
segment is in or the data deadline passed (counted from the last arrival, once the master's
start is confirmed). It reports the outcome (``CollectiveEnv.report``); an early attempt's
failure is held until the master's start (``confirm``). Cancelling the task (``release``)
ends the attempt at once; nothing is reported then. Nothing here is kind-specific.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import NamedTuple

from ..._errors import PcclTimeoutError, PeerLostError
from ..._wire.data import MAGIC, pack_header
from .core.steps import Arrival, Forward
from .env import CollectiveEnv
from .link import Link
from .paths.base import DataPath

log = logging.getLogger("pccl_aio.collective")


class _Stalled(PcclTimeoutError):
    """The data deadline passed: nothing arrived from the predecessor for ``data_timeout``."""


def _nothing() -> None:
    """A released pipeline's ``done``."""


class Ring(NamedTuple):
    """Where this peer sits in the attempt's ring."""

    world: int
    predecessor: int  # the peer it receives from
    successor: int  # the peer it sends to


class Pipeline:
    """The data flow of attempt ``seq`` of collective ``tag`` over ``path``; ``done`` is
    called when its data finished here (before the success is reported)."""

    def __init__(self, env: CollectiveEnv, tag: int, seq: int, path: DataPath, ring: Ring,
                 confirmed: bool, done: Callable[[], None]) -> None:
        self._env, self._tag, self.seq, self.path, self.ring = env, tag, seq, path, ring
        self.confirmed, self._done = confirmed, done  # the master's start came (a deadline)
        self._loop = asyncio.get_running_loop()
        self._last_rx = self._loop.time()  # of the last arrival (the data deadline's start)
        self.tx = self.rx = 0
        self._run: asyncio.Task[None] | None = None
        self._ended = False  # the run task ended (reported)
        self._link: Link | None = None  # set once the run task has the link open
        self._outbox: collections.deque[Forward] = collections.deque()
        self._inbox: collections.deque[Arrival] = collections.deque()
        self._wake: asyncio.Future[None] | None = None
        self._failure: Exception | None = None  # raised while processing inline
        # the predecessor's frames broke the protocol: why, and the peer whose data
        # connection broke if that failed it (else 0)
        self._stream_error: tuple[str, int] | None = None
        self._held: tuple[str, int] | None = None  # an early attempt's failure, not reported

    def sender(self, phase: int) -> int:
        """The peer whose frames of ``phase`` this attempt takes: the ring's predecessor."""
        return self.ring.predecessor

    def waits_on(self, peer: int) -> bool:
        """A lost connection from ``peer`` fails this attempt (its data not all in)."""
        return peer == self.ring.predecessor

    def traffic(self) -> list[tuple[int, int, int]]:
        """(peer id, bytes sent to it, bytes received from it) of this attempt so far."""
        return [(self.ring.successor, self.tx, 0), (self.ring.predecessor, 0, self.rx)]

    def _sending_to(self) -> int:
        """The peer sent to (named if a connection error fails the attempt)."""
        return self.ring.successor

    def _stalled_on(self) -> int:
        """The peer named when the data deadline passes: the predecessor, if nothing at all
        came from it (else none: the stall may be further up the ring)."""
        return self.ring.predecessor if self.rx == 0 else 0

    @property
    def broken(self) -> bool:
        """The predecessor's frames broke the protocol."""
        return self._stream_error is not None

    def spawn(self) -> None:
        """Start the run task (the path may have taken stashed frames already)."""
        self._run = self._env.tasks.spawn(self._run_data(),
                                          name=f"pccl_aio collective {self.seq}")
        self._run.add_done_callback(self._ran)

    def _ran(self, task: asyncio.Task[None]) -> None:
        """The run task ended: let go of it (a cancelled one holds its error, whose frames
        hold this pipeline: a cycle that would keep the attempt's buffers until a
        garbage-collector pass)."""
        self._ended = True
        if self._run is task:
            self._run = None

    def done_now(self) -> None:
        """A path with nothing to move (a barrier's) is done at its start: no task, no link."""
        self._done()
        self._env.report(self._tag, self.seq, True, "")

    def confirm(self, active: bool) -> None:
        """The master's start confirmed this attempt: the data deadline counts from now, and
        a failure held meanwhile is reported (if the caller still wants it: ``active``)."""
        self.confirmed = True
        self._last_rx = self._loop.time()
        if self._held is not None and active:
            self._env.report(self._tag, self.seq, False, *self._held)
        self._poke()

    def release(self) -> None:
        """End the attempt: cancel its task, give back the path's buffers (idempotent).
        ``done`` is dropped: it is the collective's (which holds this pipeline), and a cycle
        would leave both to the garbage collector, a pass every few hundred collectives."""
        if self._run is not None and not self._run.done():
            self._run.cancel()
        self._done = _nothing
        self.path.release()

    # ---- driven by the receiver -------------------------------------------------------------
    def on_segment(self, phase: int, offset: int, length: int, p0: float, p1: float) -> None:
        """A segment arrived (in the receive callback). When the link to the successor has
        room, work and forward it right here (no task wake-up per segment). Otherwise (link
        not open yet, or saturated) the run task forwards it once there is room; unless the
        path defers, it is worked here all the same, so only a partial sum waiting to be sent
        keeps its receive slot."""
        self.rx += length
        self._last_rx = self._loop.time()
        path = self.path
        if self._failure is None:
            try:
                link = self._link
                wait = (link is None or self._inbox or self._outbox or path.own_first
                        or not link.has_room())
                if wait and path.defers:
                    self._inbox.append(Arrival(phase, offset, p0, p1))
                    return self._poke()
                out = path.process(phase, offset, p0, p1)
                if out is not None:
                    if wait or link is None:
                        self._outbox.append(out)
                        return self._poke()
                    self._send_now(link, *out)
            except Exception as exc:  # a local failure: the run task reports it
                self._failure = exc
        if path.remaining == 0 or self._failure is not None:
            self._poke()

    def on_error(self, reason: str, suspect: int, active: bool) -> None:
        """The frames broke the plan: the run task reports the failure; if it already
        reported success (a forged frame came first) and the caller still wants it
        (``active``), this reports it, so the master aborts the collective instead."""
        if self._stream_error is None:
            self._stream_error = (reason, suspect)
            if active and (self._ended or (self._run is not None and self._run.done())):
                log.warning("collective tag=%d seq=%d: %s after it was reported done",
                            self._tag, self.seq, reason)
                self._env.report(self._tag, self.seq, False, reason)
        self._poke()

    def _poke(self) -> None:
        w, self._wake = self._wake, None
        if w is not None and not w.done():
            w.set_result(None)

    # ---- the run task -----------------------------------------------------------------------
    async def _run_data(self) -> None:
        try:
            await self._flow()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # report, then wait for the master's abort
            log.debug("collective tag=%d seq=%d failed locally: %r", self._tag, self.seq, exc)
            broke = self._stream_error[1] if self._stream_error is not None else 0
            suspect = broke or (self._sending_to() if isinstance(exc, ConnectionError) else 0)
            # nothing at all from the peer waited on within the data timeout: it is named
            stalled = isinstance(exc, _Stalled) and not suspect and self._stalled_on() != 0
            if stalled:
                suspect = self._stalled_on()
            if self.confirmed:
                self._env.report(self._tag, self.seq, False, repr(exc), suspect, stalled)
            else:  # an early start: the master's start decides (reported then, if it stands)
                self._held = (repr(exc), suspect)
            return
        self._done()
        self._env.report(self._tag, self.seq, True, "")

    async def _flow(self) -> None:
        """Move the attempt's data: the ring's flow over the link to the successor."""
        await self._pipeline(await self._env.link(self.ring.successor))

    async def _pipeline(self, link: Link) -> None:
        path = self.path
        # Received segments are forwarded as the link has room, between our own sends (a
        # backlog would hold receive slots); with ``own_first``, only once ours are out.
        self._link = link
        sends = path.first_sends()
        while True:
            if not path.own_first:
                await self._drain(link)
            out = next(sends, None)
            if out is None:
                break
            await self._send(link, *out)
        while True:
            await self._drain(link)
            self._check()
            if path.remaining == 0:
                path.finish()
                return
            await self._wait()

    def _check(self) -> None:
        """Raise what failed the attempt meanwhile (here, or the frames it received)."""
        if self._failure is not None:
            raise self._failure
        if self._stream_error is not None:
            raise PeerLostError(self._stream_error[0])

    async def _wait(self) -> None:
        """Sleep until poked, or until the data deadline (counted from the last arrival, once
        confirmed), which raises ``_Stalled``."""
        loop, timeout = self._loop, self._env.data_timeout
        left = self._last_rx + timeout - loop.time() if self.confirmed else None
        if left is not None and left <= 0:
            raise _Stalled(f"no data for {timeout:.1f} s (seq {self.seq}); sender stalled")
        self._wake = loop.create_future()
        try:
            async with asyncio.timeout(left):
                await self._wake
        except TimeoutError:
            pass  # the deadline is checked again by the next call, from the last arrival

    async def _drain(self, link: Link) -> None:
        """Forward (after working, if still due) the segments that waited for room."""
        while self._outbox or self._inbox:
            out = (self._outbox.popleft() if self._outbox
                   else self.path.process(*self._inbox.popleft()))
            if out is not None:
                await self._send(link, *out)

    def _send_now(self, link: Link, phase: int, off: int, payload: memoryview,
                  p0: float = 0.0, p1: float = 0.0, slot: memoryview | None = None) -> None:
        """Queue one frame; ``slot`` (holding ``payload``) is free again once it was sent."""
        n = len(payload)
        sender, end = link.send_now(
            pack_header(MAGIC, phase, self._tag, self.seq, off, n, p0, p1), payload)
        self.tx += n
        if slot is not None:
            self.path.sent(sender, end, slot)

    async def _send(self, link: Link, phase: int, off: int, payload: memoryview,
                    p0: float = 0.0, p1: float = 0.0, slot: memoryview | None = None) -> None:
        """``_send_now`` once the link has room (waits while all its connections are full)."""
        await link.wait_room()
        self._send_now(link, phase, off, payload, p0, p1, slot)
