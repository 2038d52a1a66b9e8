"""One collective on one peer (an all-reduce, broadcast, all-gather, gather, scatter or
reduce-scatter): its life cycle, verdict and input backup.

Life cycle (one ``Phase``, ``core/phase.py``), driven by the control reader *in master
message order*: ``launch`` (the vote sent: ``VOTING``) -> ``on_start`` (data flows:
``RUNNING``; on a ticket already at launch, ``EARLY``, which the master's start then confirms
or replaces) -> the run task reports ``CollectiveDone`` (``DATA_DONE``) -> ``on_complete`` |
``on_abort`` | ``on_rejected`` (``ENDED``), synchronously in the reader, so every peer of a
group reacts to the same verdicts alike (that keeps retries in lock-step).

Each attempt's data moves on one ``DataPath`` chosen at its start (``paths/``: the ring, the
quantized ring, Bruck's log2 P rounds for small all-reduces and all-gathers, the broadcast,
all-gather, gather and scatter paths), driven by a ``Pipeline`` (``pipeline.py``); this
class is the receiver's ``Sink`` and hands it the attempt's frames. In place,
``core.backup.InputBackup`` keeps what an abort must put back. The collective sees its
communicator only as a ``CollectiveEnv``. Nothing here blocks or awaits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NamedTuple

from ..._compute import ops as _ops
from ..._errors import DeadlockError, InvalidUsageError, PeerLostError
from ..._text import plural
from ..._types import CollectiveKind, QuantAlgo, Quantization, ReduceInfo, ReduceOp
from ..core.buffers import Buffer
from . import paths
from .core import phase as _phase
from .core.backup import InputBackup
from .core.phase import Phase
from .core.ring import RingPlan
from .env import CollectiveEnv
from .paths import quant as _quant
from .paths.bruck import BruckPath
from .paths.ring import RingPath
from .pipeline import Pipeline, Ring
from .rounds import Rounds


class Spec(NamedTuple):
    """What a collective is beyond an all-reduce's arguments: its kind, a broadcast's root
    rank, and for a ranked kind the ring (peer ids in rank order) and epoch it was launched
    in (an all-reduce's ``ranks``: a ring it was pinned to, else empty); ``copy_own``: an
    all-gather's input is not already its slot of the output."""

    kind: CollectiveKind = CollectiveKind.ALL_REDUCE
    root: int = 0
    ranks: tuple[int, ...] = ()
    epoch: int = 0
    copy_own: bool = True


class Collective:
    """One attempt of one tagged collective on this peer: an all-reduce, or a ``kind`` of
    ``spec`` (a ranked kind runs only in the ring it was launched in, ``spec.ranks``)."""

    def __init__(self, env: CollectiveEnv, tag: int, src: Buffer, dst: Buffer,
                 op: ReduceOp, in_place: bool, quant: Quantization | None = None,
                 restore: bool = True, spec: Spec | None = None) -> None:
        self.env, self.tag, self.op = env, tag, op
        self.spec = spec or Spec()
        self.quant = quant if quant is not None and quant.algo != QuantAlgo.NONE else None
        self.src, self.dst = src, dst
        loop = asyncio.get_running_loop()
        self.future: asyncio.Future[ReduceInfo] = loop.create_future()
        # An abandoned (cancelled) handle must not log "exception was never retrieved".
        self.future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.started: asyncio.Future[None] = loop.create_future()  # set by the master's start
        self.seq = self.ticket = 0  # the attempt's seq (0: none yet); the ticket's seq
        self._phase = Phase.VOTING
        self.cancelled = False  # the caller gave up (the verdict still comes)
        # Started, not ended, and the caller still wants it: kept by ``_set`` and ``cancel``
        # (a plain attribute: the receiver reads it on every recv)
        self.active = False
        self.awaited = False  # the caller waits on it (the master was told: CollectiveWait)
        self.hooks: list[Callable[[Collective], None]] = []
        self._pipe: Pipeline | None = None  # the attempt's data flow (kept after it ended)
        # In place (unless restore_on_abort=False) an abort puts the input back (the backup of
        # ``save_input``); out of place ``src`` is never written
        self._in_place, self._restore = in_place, restore
        self._backup: InputBackup | None = None
        self._prepare()

    def _prepare(self) -> None:
        if self.quant is not None and self.kind == CollectiveKind.ALL_REDUCE:
            _quant.prepare(self.src, self.dst, self._in_place)

    # ---- the life cycle, as others see it ---------------------------------------------------
    @property
    def phase(self) -> Phase:
        return self._phase

    def _move(self, to: Phase) -> None:
        """The one setter of the phase: refuses a move the life cycle does not allow."""
        self._set(_phase.move(self._phase, to))

    def _set(self, to: Phase) -> None:  # (``to`` checked by ``_phase``'s move or helpers)
        self._phase = to
        self.active = to in _phase.STARTED and not self.cancelled

    @property
    def confirmed(self) -> bool:
        """The master started it (an early start waits for this)."""
        return self.started.done() and not self.started.cancelled()

    @property
    def data_ok(self) -> bool:
        """Its data finished here without error: only the master's verdict is missing."""
        pipe = self._pipe
        return (self._phase in _phase.DONE and not self.cancelled and pipe is not None
                and not pipe.broken)

    @property
    def kind(self) -> CollectiveKind:
        return self.spec.kind

    @property
    def count(self) -> int:
        """Its descriptor's count: elements per rank (an all-gather's input)."""
        return (self.src if self.kind == CollectiveKind.ALL_GATHER else self.dst).count

    @property
    def world(self) -> int:
        return self._pipe.ring.world if self._pipe is not None else int(len(self.spec.ranks) == 1)

    def alone(self) -> None:
        """A ranked kind in a group of one: done here and now (nothing to agree on)."""
        gathers = self.kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER)
        if gathers and self.src.address != self.dst.address:
            _ops.copy(self.dst.view, self.src.view)
        self.started.set_result(None)
        self._finish(None)

    def sender(self, phase: int) -> int:
        """The peer whose frames of ``phase`` it takes (-1 before its start)."""
        return self._pipe.sender(phase) if self._pipe is not None else -1

    def waits_on(self, peer: int) -> bool:
        """Its data is not all in, and some of it is to come from ``peer``."""
        return self._pipe is not None and self._pipe.waits_on(peer)

    def traffic(self) -> list[tuple[int, int, int]]:
        """(peer id, bytes sent to it, bytes received from it) of its attempt so far."""
        return self._pipe.traffic() if self._pipe is not None else []

    @property
    def tx(self) -> int:
        return self._pipe.tx if self._pipe is not None else 0

    @property
    def rx(self) -> int:
        return self._pipe.rx if self._pipe is not None else 0

    @property
    def plan(self) -> RingPlan | None:
        """The ring's plan, if the attempt runs on a ring."""
        path = self._pipe.path if self._pipe is not None else None
        return path.plan if isinstance(path, RingPath) else None

    # ---- driven by the caller and the control plane -----------------------------------------
    def save_input(self) -> None:
        """In place (unless restore_on_abort=False): take the backup (called right after the
        vote went out, so the quantized path's whole copy overlaps the master's round trip;
        otherwise segments are copied as they are first written)."""
        if self._in_place and self._restore and self._backup is None:
            self._backup = InputBackup(self.env.scratch, self.dst.view,
                                       whole=self.quant is not None)

    def cancel(self) -> None:
        """The caller stopped waiting: fail it for the group (its tag is held till the verdict)."""
        active = self.active
        self.cancelled, self.active = True, False
        if not self.seq:  # still voting: withdraw, the master aborts it for the group
            self.env.report(self.tag, 0, False, "cancelled by the caller")
        elif active:
            self.env.report(self.tag, self.seq, False, "cancelled by the caller")

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
        self._move(Phase.EARLY if early else Phase.RUNNING)
        if not early and not self.started.done():
            self.started.set_result(None)
        if self.cancelled:  # the caller gave up before the start: tell the master at once
            self.env.registry.skip(seq)
            self.env.report(self.tag, seq, False, "cancelled")
            return
        if ((self.kind.ranked or self.spec.ranks)  # (a ranked kind: the master aborts it first)
                and tuple(ring_ids) != self.spec.ranks):
            self.env.registry.skip(seq)
            self.env.report(self.tag, seq, False, "the ring is not the one it was launched for "
                            f"({plural(len(self.spec.ranks), 'peer')}): the membership changed")
            return
        world, rank = len(ring_ids), ring_ids.index(me)
        ring = Ring(world, ring_ids[rank - 1], ring_ids[(rank + 1) % world])
        path = paths.start(self.kind, rank, world, self.src, self.dst, self.op, self.quant,
                           self.spec.root, self.env.scratch, self._backup, self._connections,
                           self.spec.copy_own)
        if isinstance(path, BruckPath):  # in rounds, not round the ring
            plan = path.plan
            self._pipe = Rounds(self.env, self.tag, seq, path, ring, not early, self._data_done,
                                [ring_ids[plan.to(k)] for k in range(plan.rounds)],
                                [ring_ids[plan.sender(k)] for k in range(plan.rounds)])
        else:
            self._pipe = Pipeline(self.env, self.tag, seq, path, ring, not early,
                                  self._data_done)
        self.env.registry.add(seq, self)
        if self.kind == CollectiveKind.BARRIER:
            self._pipe.done_now()
        else:
            self._pipe.spawn()

    def _connections(self) -> int:
        return self.env.p2p_connections

    def _confirm(self) -> None:
        if self._phase in _phase.EARLY:
            self._set(_phase.confirmed(self._phase))
        if not self.started.done():
            self.started.set_result(None)
        if self._pipe is not None:  # (an early failure held meanwhile is reported now)
            self._pipe.confirm(self.active)

    def _data_done(self) -> None:
        self._set(_phase.finished(self._phase))

    def on_complete(self) -> None:
        self._finish(None)

    def on_abort(self, reason: str) -> None:
        lost = ("; the in-place input was not restored (restore_on_abort=False)"
                if self._in_place and not self._restore else "")
        self._finish(PeerLostError(f"{self.kind.label} tag {self.tag} aborted: {reason}{lost}"))

    def on_rejected(self, reason: str, deadlock: bool = False) -> None:
        cls = DeadlockError if deadlock else InvalidUsageError
        self._finish(cls(f"{self.kind.label} tag {self.tag} rejected: {reason}"))

    def on_lost(self, exc: BaseException) -> None:  # the master is gone: no verdict will come
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if self._phase is not Phase.ENDED:
            self._move(Phase.ENDED)
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
        """End the attempt's data flow: its task, its frames, its buffers and backup."""
        if self.seq:
            self.env.registry.remove(self.seq)
        if self._pipe is not None:
            self._pipe.release()
        if self._backup is not None:
            self._backup.release(self.env.scratch)
            self._backup = None

    def _reset(self) -> None:
        """Drop an early attempt (its ticket was void) and put the input back as launched."""
        if self._backup is not None:
            self._backup.restore()
        self._release()
        self._pipe = None
        self.save_input()
        self._prepare()

    # ---- driven by the receiver (Sink protocol) ---------------------------------------------
    def target(self, phase: int, offset: int, length: int) -> memoryview | None:
        assert self._pipe is not None  # (registered with the receiver only once it has one)
        return self._pipe.path.target(phase, offset, length)

    def on_segment(self, phase: int, offset: int, length: int, p0: float, p1: float) -> None:
        """A segment arrived (in the receive callback): ``Pipeline.on_segment``."""
        assert self._pipe is not None
        self._pipe.on_segment(phase, offset, length, p0, p1)

    def on_error(self, reason: str, suspect: int = 0) -> None:
        """The frames broke the plan (a repeated (phase, offset), a wrong sender): the
        attempt fails for the group (``Pipeline.on_error``)."""
        if self._pipe is not None:
            self._pipe.on_error(reason, suspect, self.active)
