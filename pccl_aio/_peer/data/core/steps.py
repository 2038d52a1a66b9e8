"""One ring all-reduce attempt's segments, as ``paths/ring.py`` works them (sans-IO).

``start`` lays the attempt out: ``wire_lengths`` and ``cut`` slice what each received segment
expects on the wire and what is done with it; ``landing`` is where it is received, ``work``
does it once it arrived. ``Arrival`` and
``Forward`` are segments waiting for room on the link to the successor. Nothing here blocks or
touches a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

from ...._compute import ops as _ops
from ...._types import ReduceOp
from .backup import InputBackup
from .ring import AG, RS, RingPlan
from .slots import Pool, Slots

_EMPTY = memoryview(b"")


class Step(NamedTuple):
    """A segment's work, cut once at the start: final reduce of our chunk?, the phase to
    forward it in (None: not forwarded), its slices of dst, of the quantized scratch and of
    the input."""

    owned: bool
    forward: int | None
    dst: memoryview
    codes: memoryview
    src: memoryview


class Arrival(NamedTuple):
    """A quantized segment waiting unprocessed for room on the link."""

    phase: int
    offset: int
    p0: float
    p1: float


class Forward(NamedTuple):
    """A processed segment waiting for room on the link; ``slot`` is freed once it is sent."""

    phase: int
    offset: int
    payload: memoryview
    p0: float
    p1: float
    slot: memoryview | None


def wire_bytes(elems: int, bits: int) -> int:
    """Bytes on the wire of the first ``elems`` elements of ``bits`` each (4-bit: rounded up)."""
    return (elems * bits + 7) >> 3


class Start(NamedTuple):
    """What ``start`` lays out for one ring attempt."""

    plan: RingPlan
    expected: dict[tuple[int, int], int]  # (phase, byte offset in dst) -> bytes on the wire
    steps: dict[tuple[int, int], Step]
    slots: Slots | None  # unquantized: the reduce-scatter receive slots
    scratch: tuple[bytearray, memoryview] | None  # quantized: the codes' scratch (and owner)


def start(rank: int, world: int, dst: memoryview, src: memoryview, count: int, itemsize: int,
          bits: int, quantized: bool, pool: Pool, segment_bytes: int, slots_block: int,
          scatter: memoryview | None = None) -> Start:
    """The ring's plan, receive slots (or quantized scratch) and each segment's work, for
    ``count`` elements of ``itemsize`` bytes, ``bits`` per element on the wire. With
    ``scatter`` (a reduce-scatter) the plan stops after the reduce-scatter, rank ``rank``
    owning chunk ``rank``, whose final values go to ``scatter`` instead of ``dst``."""
    def wire(elems: int) -> int:
        return wire_bytes(elems, bits)

    # segments are sized on the wire: a quantized one covers more elements; 4-bit codes
    # need chunks and segments of an even count of elements (whole bytes)
    gather = scatter is None
    plan = RingPlan(rank if gather else (rank - 1) % world, world, count, itemsize,
                    max(1, segment_bytes * 8 // bits), 2 if bits < 8 else 1, gather)
    lens = plan.expected()  # (phase, byte offset in dst) -> bytes in dst
    expected = wire_lengths(lens, itemsize, wire)
    slots, scratch = None, None
    if quantized:  # codes are received and sent from their place in it
        scratch = pool.take(wire(count))
    else:
        rs = [n for (phase, _), n in expected.items() if phase == RS]
        if rs:
            slots = Slots(pool, max(rs), min(len(rs), slots_block))
    out: memoryview | _Scatter = dst
    if scatter is not None:  # the owned chunk is written into ``scatter``
        lo = plan.bounds[plan.owned] * itemsize
        out = _Scatter(dst, scatter, lo, lo + scatter.nbytes)
    steps = cut(plan, lens, expected, out, src, scratch[1] if scratch else None, itemsize, wire)
    return Start(plan, expected, steps, slots, scratch)


class _Scatter:
    """``dst`` sliced as a reduce-scatter's: the owned chunk's bytes [lo, hi) in ``into``."""

    def __init__(self, dst: memoryview, into: memoryview, lo: int, hi: int) -> None:
        self._dst, self._into, self._lo, self._hi = dst, into, lo, hi

    def __getitem__(self, s: slice) -> memoryview:
        lo = self._lo
        if lo <= s.start < self._hi:
            return self._into[s.start - lo : s.stop - lo]
        return self._dst[s]


def landing(step: Step, phase: int, off: int, length: int, quantized: bool,
            slots: Slots | None, backup: InputBackup | None) -> memoryview:
    """Where a ring segment is received: the quantized scratch, ``dst`` itself (all-gather:
    the final bytes land in place) or a receive slot."""
    if quantized:
        return step.codes
    if phase == AG:
        if backup is not None:
            backup.save(off, length)
        return step.dst
    assert slots is not None
    return slots.land(off, length)


def wire_lengths(lens: dict[tuple[int, int], int], itemsize: int,
                 wire: Callable[[int], int]) -> dict[tuple[int, int], int]:
    """(phase, byte offset in dst) -> bytes on the wire, from the bytes in dst (``lens``);
    ``wire``: the wire bytes of the first n elements (quantized codes are fewer)."""
    b = itemsize
    return {(p, off): wire((off + n) // b) - wire(off // b) for (p, off), n in lens.items()}


def cut(plan: RingPlan, lens: dict[tuple[int, int], int], expected: dict[tuple[int, int], int],
        dst: memoryview | _Scatter, src: memoryview, scratch: memoryview | None, itemsize: int,
        wire: Callable[[int], int]) -> dict[tuple[int, int], Step]:
    """Each segment's work: its slices of ``dst``, of the quantized ``scratch`` (if any) and
    of the input ``src``, and what the plan does after it arrives."""
    steps = {}
    for (phase, off), n in lens.items():
        q = wire(off // itemsize)
        owned, fwd = plan.after_receive(phase, off)
        qs = scratch[q : q + expected[(phase, off)]] if scratch is not None else _EMPTY
        steps[(phase, off)] = Step(owned, fwd, dst[off : off + n], qs, src[off : off + n])
    return steps


def work(step: Step, phase: int, off: int, p0: float, p1: float, k: ModuleType, op: int,
         dt: int, quant: tuple[int, int] | None, world: int, slots: Slots | None,
         backup: InputBackup | None) -> Forward | None:
    """Reduce (or decode) one received ring segment by its ``step``; what to forward, if
    anything (and the slot to free once it is sent). ``k``: the kernels (``ops.kernels()``);
    ``quant``: (quantized dtype, algorithm) on the quantized path, else None. Blocks for the
    kernels only (1 MiB at most)."""
    owned, fwd, seg, qs, src = step  # src: dst itself in place
    out, hold = qs, None
    if phase == RS and not quant:
        # in place, the kernel saves the input segment in the same pass (``into``)
        assert slots is not None
        slot = slots.landed.pop(off)
        got = slot[: len(seg)]
        if owned:  # the final value of our chunk: dst is written here, once
            k.reduce_from(seg, src, got, op, dt, backup.into(off, len(seg)) if backup else None)
            slots.free(slot)
            if op == ReduceOp.AVG:
                k.divide(seg, world, dt)
            out = seg
        else:  # a partial sum: into the receive slot, forwarded from there
            k.reduce_from(got, src, got, op, dt, backup.into(off, len(seg)) if backup else None)
            out, hold = got, slot
    elif phase == RS:  # quantized: dequantize the received bytes and accumulate
        assert quant is not None
        qdt, algo = quant
        _ops.dequantize_accumulate(seg, qs, p0, p1, op, dt, qdt, algo)
        if owned and op == ReduceOp.AVG:
            _ops.divide(seg, world, dt)
        if fwd is not None:  # (a reduce-scatter's owner keeps its chunk as reduced)
            p0, p1 = _ops.quantize(qs, seg, dt, qdt, algo)
            if owned:  # the owner keeps exactly what everyone else will decode
                _ops.dequantize(seg, qs, p0, p1, dt, qdt, algo)
    elif quant:  # all-gather: decode; forward the received bytes verbatim
        _ops.dequantize(seg, qs, p0, p1, dt, quant[0], quant[1])
    else:  # all-gather: the bytes landed in dst
        out = seg
    return None if fwd is None else Forward(fwd, off, out, p0, p1, hold)
