"""One all-reduce attempt on one peer: the pipelined data path and its life cycle.

Life cycle, driven by the control reader *in master message order*: ``launch`` (the vote
sent) -> ``on_start`` (data flows; on a ticket already at launch, ``early``, which the master's
start then confirms or replaces) -> the run task reports ``CollectiveDone`` -> ``on_complete``
| ``on_abort`` | ``on_rejected``, synchronously in the reader, so every peer of a group reacts
to the same verdicts alike (that keeps retries in lock-step).

The ring's data path: the receiver writes segments straight into a reused receive slot (the
quantized path: a scratch) or ``dst`` (all-gather); the receive callback reduces a segment
and forwards it at once when the link has room (else the run task does), so receive, reduce
and send overlap. Small buffers take ``core/gather.py``'s path instead. In place,
``core.backup.InputBackup`` keeps what an abort must put back. The collective sees its
communicator only as a ``CollectiveEnv``; the ring's per-segment work is ``core/steps.py``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

from ..._compute import ops as _ops
from ..._errors import DeadlockError, InvalidUsageError, PcclTimeoutError, PeerLostError
from ..._types import QUANT_BITS, QuantAlgo, Quantization, ReduceInfo, ReduceOp
from ..._wire.data import MAGIC, pack_header
from ..core.buffers import Buffer
from .core import gather, ring
from .core.backup import InputBackup
from .core.slots import SLOTS_BASE, Slots
from .core.steps import Arrival, Forward, Step, landing, start, wire_bytes, work
from .env import CollectiveEnv
from .link import Link

log = logging.getLogger("pccl_aio.collective")

SEGMENT_BYTES = 1 << 20  # pipeline segment, in bytes on the wire


class Collective:
    """One attempt of one tagged all-reduce on this peer."""

    def __init__(self, env: CollectiveEnv, tag: int, src: Buffer, dst: Buffer,
                 op: ReduceOp, in_place: bool, quant: Quantization | None = None,
                 restore: bool = True) -> None:
        self.env, self.tag, self.op = env, tag, op
        self.quant = quant if quant is not None and quant.algo != QuantAlgo.NONE else None
        self._b = dst.dtype.itemsize
        # bits per element on the wire: 4-bit codes go two per byte
        self._bits = QUANT_BITS[self.quant.dtype] if self.quant else 8 * self._b
        self.src, self.dst = src, dst
        loop = asyncio.get_running_loop()
        self.future: asyncio.Future[ReduceInfo] = loop.create_future()
        # An abandoned (cancelled) handle must not log "exception was never retrieved".
        self.future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.started: asyncio.Future[None] = loop.create_future()
        self.seq = self.world = self.ticket = 0  # seq and ring size at the start; ticket seq
        self._data_done = False  # its data finished here (the result is final in ``dst``)
        self.confirmed = False  # the master started it (an early start waits for this)
        self._held: tuple[str, int] | None = None  # an early attempt's failure, not reported
        self.active = self.cancelled = False
        self.tx = self.rx = 0
        self.hooks: list[Callable[[Collective], None]] = []
        self._run: asyncio.Task[None] | None = None
        self._loop, self._in_place = loop, in_place
        # Segments waiting for room on the link, in order: unquantized ones reduced on arrival
        # (frees our own chunk's receive slots) wait in ``_outbox`` as sends; quantized ones
        # wait in ``_inbox`` unprocessed, so their decode/encode interleaves with the sends.
        self._outbox: collections.deque[Forward] = collections.deque()
        self._inbox: collections.deque[Arrival] = collections.deque()
        self._link: Link | None = None  # set once the run task has the link open
        self._remaining = 0  # segments still to receive and process
        self._last_rx = 0.0  # loop time of the last arrival (the data deadline counts from it)
        self._local_failure: Exception | None = None  # raised while processing inline
        self._stream_error: str | None = None  # the predecessor's frames broke the protocol
        self._suspect = 0  # the peer whose data connection broke, if that failed it
        self._qdt, self._algo = ((int(self.quant.dtype), int(self.quant.algo)) if self.quant
                                 else (0, 0))
        self.plan: ring.RingPlan | None = None  # set at the start (the ring's)
        self._small: gather.GatherPlan | None = None  # ... or the small path's
        self._own_first = False  # forwards wait until our own first sends are out
        self.predecessor = self.successor = -1  # the peers it receives from, sends to (at start)
        self.awaited = False  # the caller waits on it (the master was told: CollectiveWait)
        self._steps: dict[tuple[int, int], Step] = {}  # (phase, offset) -> work, set at start
        self._k = _ops.kernels()  # per-segment jobs: views cut here, arguments checked once
        self._op, self._dt = int(op), int(dst.dtype)
        self._wake: asyncio.Future[None] | None = None
        self._expected: dict[tuple[int, int], int] = {}
        self._scratch: memoryview | None = None
        self._scratch_owner: bytearray | None = None
        self._slots: Slots | None = None  # unquantized: reduce-scatter receive slots
        # In place (unless restore_on_abort=False) an abort puts the input back (the backup of
        # ``save_input``); out of place ``src`` is never written
        self._backup: InputBackup | None = None
        self._backs_up, self._unrestored = in_place and restore, in_place and not restore
        # The quantized path accumulates into ``dst``; out of place it starts from ``src``.
        if not in_place and self.quant is not None:
            _ops.copy(dst.view, src.view)

    def save_input(self) -> None:
        """In place (unless restore_on_abort=False): take the backup (called right after the
        vote went out, so the quantized path's whole copy overlaps the master's round trip;
        otherwise segments are copied as they are first written)."""
        if self._backs_up and self._backup is None:
            self._backup = InputBackup(self.env.scratch, self.dst.view,
                                       whole=self.quant is not None)

    def cancel(self) -> None:
        """The caller stopped waiting: fail it for the group (its tag is held till the verdict)."""
        self.cancelled = True
        if not self.seq:  # still voting: withdraw, the master aborts it for the group
            self.env.report(self.tag, 0, False, "cancelled by the caller")
        elif self.active:
            self.active = False
            self.env.report(self.tag, self.seq, False, "cancelled by the caller")

    # ---- driven by the control reader -------------------------------------------------------
    def on_start(self, seq: int, ring_ids: list[int], me: int, early: bool = False) -> None:
        """The master started this collective as ``seq`` on ``ring_ids`` (``early``: this
        peer did, on a ticket, before the master's start): start moving data. Started early
        as ``seq`` already: the master's start confirms it. Started early as another seq (the
        master found the ticket void): that attempt is dropped, this one starts from the input
        as launched. Until confirmed, an early attempt has no data deadline (the master's vote
        watches the group meanwhile, as for any collective not started)."""
        if self.seq:
            if seq == self.seq:
                return self._confirm()
            self._reset()
        self.seq = seq
        if not early:
            self._confirm()
        if self.cancelled:  # the caller gave up before the start: tell the master at once
            self.env.registry.skip(seq)
            self.env.report(self.tag, seq, False, "cancelled")
            return
        self.world = len(ring_ids)
        rank = ring_ids.index(me)
        self.predecessor = ring_ids[rank - 1]
        if gather.chosen(self.dst.count * self._b, self.world, self.quant is not None):
            self._start_small(rank)
        else:
            self._start_ring(rank)
        self.active = True
        self.env.registry.add(seq, self)
        self.successor = succ = ring_ids[(rank + 1) % self.world]
        self._run = self.env.tasks.spawn(self._run_data(succ), name=f"pccl_aio all-reduce {seq}")

    def _start_small(self, rank: int) -> None:
        """The small path (``core/gather.py``): our input into its slot of the scratch."""
        self._small = g = gather.GatherPlan(rank, self.world, self.dst.count * self._b)
        self._expected, self._remaining = g.expected(), self.world - 1
        self._scratch_owner, self._scratch = self.env.scratch.take(g.nbytes * self.world)
        _ops.copy(self._scratch[g.mine() : g.mine() + g.nbytes], self.src.view)

    def _start_ring(self, rank: int) -> None:
        """The ring's plan, receive slots (or quantized scratch) and each segment's work."""
        laid = start(rank, self.world, self.dst.view, self.src.view, self.dst.count, self._b,
                     self._bits, self.quant is not None, self.env.scratch, SEGMENT_BYTES,
                     SLOTS_BASE + 2 * self.env.p2p_connections)
        self.plan, self._expected, self._steps, self._slots = laid[:4]
        self._scratch_owner, self._scratch = laid.scratch or (None, None)
        # P = 2: our chunk goes out before the forwards (final values in dst, no slot held),
        # so the last forward never waits a hop at the end for the other's last segment
        self._own_first = self.world == 2
        self._remaining = len(self._expected)  # frames may arrive before the run task starts

    def _confirm(self) -> None:
        self.confirmed = True
        self._last_rx = self._loop.time()  # the data deadline counts from here
        if not self.started.done():
            self.started.set_result(None)
        if self._held is not None and self.active:  # the early attempt failed meanwhile
            self.env.report(self.tag, self.seq, False, *self._held)
        self._poke()

    def on_complete(self) -> None:
        self._finish(None)

    def on_abort(self, reason: str) -> None:
        lost = ("; the in-place input was not restored (restore_on_abort=False)"
                if self._unrestored else "")
        self._finish(PeerLostError(f"all-reduce tag {self.tag} aborted: {reason}{lost}"))

    def on_rejected(self, reason: str, deadlock: bool = False) -> None:
        cls = DeadlockError if deadlock else InvalidUsageError
        self._finish(cls(f"all-reduce tag {self.tag} rejected: {reason}"))

    def on_lost(self, exc: BaseException) -> None:  # the master is gone: no verdict will come
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if exc is not None and self._backup is not None:  # (an early start wrote it too)
            self._backup.restore()  # a failed attempt leaves the input as launched
        self._release()
        if not self.started.done():
            self.started.cancel()
        if not self.future.done():
            if exc is None:
                self.future.set_result(ReduceInfo(self.world, self.tx, self.rx))
            else:
                self.future.set_exception(exc)
        for hook in self.hooks:
            hook(self)

    def _release(self) -> None:
        """End the attempt's data path: its task, its frames, its buffers and backup."""
        self.active = False
        if self.seq:
            self.env.registry.remove(self.seq)
        if self._run is not None and not self._run.done():
            self._run.cancel()
        if self._scratch_owner is not None:
            self.env.scratch.give(self._scratch_owner)
        self._scratch_owner = self._scratch = None
        if self._backup is not None:
            self._backup.release(self.env.scratch)
            self._backup = None
        if self._slots is not None:
            self._slots.release()
            self._slots = None
        self._steps = {}

    def _reset(self) -> None:
        """Drop an early attempt (its ticket was void) and put the input back as launched."""
        if self._backup is not None:
            self._backup.restore()
        self._release()
        self._run = self._link = self._local_failure = self._stream_error = self._held = None
        self._outbox.clear()
        self._inbox.clear()
        self._expected = {}
        self._small = self.plan = None
        self.tx = self.rx = self._suspect = 0
        self._data_done = False
        self.save_input()
        if not self._in_place and self.quant is not None:
            _ops.copy(self.dst.view, self.src.view)

    # ---- driven by the receiver (Sink protocol) ---------------------------------------------
    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        if self._expected.pop((phase, offset), -1) != length:
            return None
        if self._small is not None:  # an input, into its slot of the scratch
            assert self._scratch is not None
            return self._scratch[offset : offset + length]
        return landing(self._steps[(phase, offset)], phase, offset, length,
                       self.quant is not None, self._slots, self._backup)

    def on_segment(self, phase: int, offset: int, length: int, p0: float, p1: float) -> None:
        """A segment arrived (in the receive callback). When the link to the successor has
        room, reduce and forward it right here (no task wake-up per segment). Otherwise
        (link not open yet, or saturated) the run task forwards it once there is room; an
        unquantized one is reduced here all the same, so only a partial sum waiting to be
        sent keeps its receive slot."""
        self.rx += length
        self._last_rx = self._loop.time()
        if self._local_failure is None:
            try:
                link = self._link
                wait = (link is None or self._inbox or self._outbox or self._own_first
                        or not link.has_room())
                if wait and self.quant is not None and not self._own_first:
                    self._inbox.append(Arrival(phase, offset, p0, p1))
                    return self._poke()
                out = self._process(phase, offset, p0, p1)
                if out is not None:
                    if wait or link is None:
                        self._outbox.append(out)
                        return self._poke()
                    self._send_now(link, *out)
            except Exception as exc:  # a local failure: the run task reports it
                self._local_failure = exc
        if self._remaining == 0 or self._local_failure is not None:
            self._poke()

    def on_error(self, reason: str, suspect: int = 0) -> None:
        """The frames broke the plan (a repeated (phase, offset), a wrong sender): the run
        task reports the failure; if it already reported success (a forged frame came first)
        this reports it, so the master aborts the collective instead of completing it."""
        if self._stream_error is None:
            self._stream_error, self._suspect = reason, suspect
            if self.active and self._run is not None and self._run.done():
                log.warning("all-reduce tag=%d seq=%d: %s after it was reported done",
                            self.tag, self.seq, reason)
                self.env.report(self.tag, self.seq, False, reason)
        self._poke()

    def _poke(self) -> None:
        w, self._wake = self._wake, None
        if w is not None and not w.done():
            w.set_result(None)

    # ---- the run task -----------------------------------------------------------------------
    async def _run_data(self, succ: int) -> None:
        try:
            link = await self.env.link(succ)
            await self._pipeline(link)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # report, then wait for the master's abort
            log.debug("collective tag=%d seq=%d failed locally: %r", self.tag, self.seq, exc)
            suspect = self._suspect or (succ if isinstance(exc, ConnectionError) else 0)
            if self.confirmed:
                self.env.report(self.tag, self.seq, False, repr(exc), suspect)
            else:  # an early start: the master's start decides (reported then, if it stands)
                self._held = (repr(exc), suspect)
            return
        self._data_done = True
        self.env.report(self.tag, self.seq, True, "")

    @property
    def data_ok(self) -> bool:
        """Its data finished here without error: only the master's verdict is missing."""
        return self._data_done and self._stream_error is None and self.active

    async def _pipeline(self, link: Link) -> None:
        plan, dst, b, bits = self.plan, self.dst.view, self._b, self._bits
        scratch, quant, small = self._scratch, self.quant, self._small
        # Received segments are forwarded as the link has room, between our own chunk's sends
        # (a backlog would hold receive slots); at P = 2 only once our chunk is out.
        self._link = link
        if small is not None:  # our whole input, from its slot
            assert scratch is not None
            await self._drain(link)
            await self._send(link, gather.GATHER, small.mine(),
                             scratch[small.mine() : small.mine() + small.nbytes])
        for off, n in plan.first_sends() if plan is not None else ():
            if not self._own_first:
                await self._drain(link)
            if quant:  # the sender quantizes what it sends; the scratch of our own chunk is free
                assert scratch is not None
                qs = scratch[wire_bytes(off // b, bits) : wire_bytes((off + n) // b, bits)]
                p0, p1 = _ops.quantize(qs, dst[off : off + n], self._dt, self._qdt, self._algo)
                await self._send(link, ring.RS, off, qs, p0, p1)
            else:  # our own chunk: read from the input (dst itself when in place)
                await self._send(link, ring.RS, off, self.src.view[off : off + n])
        self._own_first = False  # now the forwards that waited
        loop, timeout = self._loop, self.env.data_timeout
        while True:
            await self._drain(link)
            if self._local_failure is not None:
                raise self._local_failure
            if self._stream_error is not None:
                raise PeerLostError(self._stream_error)
            if self._remaining == 0:
                if small is not None:  # every input is here: reduce them, in rank order
                    assert scratch is not None
                    if self._backup is not None:
                        self._backup.save(0, small.nbytes)
                    small.reduce(dst, scratch, self._op, self._dt)
                return
            left = self._last_rx + timeout - loop.time() if self.confirmed else None
            if left is not None and left <= 0:
                raise PcclTimeoutError(
                    f"no data for {timeout:.1f} s (seq {self.seq}); predecessor stalled")
            self._wake = loop.create_future()
            try:
                async with asyncio.timeout(left):
                    await self._wake
            except TimeoutError:
                pass  # the deadline is checked again above, from the last arrival

    async def _drain(self, link: Link) -> None:
        """Forward (after processing, if still due) the segments that waited for room."""
        while self._outbox or self._inbox:
            out = (self._outbox.popleft() if self._outbox
                   else self._process(*self._inbox.popleft()))
            if out is not None:
                await self._send(link, *out)

    def _process(self, phase: int, off: int, p0: float, p1: float) -> Forward | None:
        """Reduce (or decode) one received segment (the ring's: ``core/steps.work``); what to
        forward, if anything (and the slot to free once it is sent)."""
        self._remaining -= 1
        if self._small is not None:  # an input: forwarded as it came, reduced at the end
            if not self._small.forwarded(off):
                return None
            assert self._scratch is not None
            return Forward(phase, off, self._scratch[off : off + self._small.nbytes], p0, p1,
                           None)
        return work(self._steps[(phase, off)], phase, off, p0, p1, self._k, self._op, self._dt,
                    (self._qdt, self._algo) if self.quant else None, self.world, self._slots,
                    self._backup)

    def _send_now(self, link: Link, phase: int, off: int, payload: memoryview,
                  p0: float = 0.0, p1: float = 0.0, slot: memoryview | None = None) -> None:
        """Queue one frame; ``slot`` (holding ``payload``) is free again once it was sent."""
        n = len(payload)
        sender, end = link.send_now(pack_header(MAGIC, phase, self.tag, self.seq, off, n, p0, p1),
                                    payload)
        self.tx += n
        if slot is not None and self._slots is not None:
            self._slots.free_when_written(sender, end, slot)

    async def _send(self, link: Link, phase: int, off: int, payload: memoryview,
                    p0: float = 0.0, p1: float = 0.0, slot: memoryview | None = None) -> None:
        """``_send_now`` once the link has room (waits while all its connections are full)."""
        await link.wait_room()
        self._send_now(link, phase, off, payload, p0, p1, slot)
