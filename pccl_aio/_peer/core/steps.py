"""One ring all-reduce attempt's segments, as ``collective.Collective`` works them (sans-IO).

``wire_lengths`` and ``cut`` slice, once at the start, what each received segment expects on
the wire and what is done with it; ``Arrival`` and ``Forward`` are segments waiting for room on
the link to the successor. Nothing here blocks or touches a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .ring import RingPlan

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


def wire_lengths(lens: dict[tuple[int, int], int], itemsize: int,
                 wire: Callable[[int], int]) -> dict[tuple[int, int], int]:
    """(phase, byte offset in dst) -> bytes on the wire, from the bytes in dst (``lens``);
    ``wire``: the wire bytes of the first n elements (quantized codes are fewer)."""
    b = itemsize
    return {(p, off): wire((off + n) // b) - wire(off // b) for (p, off), n in lens.items()}


def cut(plan: RingPlan, lens: dict[tuple[int, int], int], expected: dict[tuple[int, int], int],
        dst: memoryview, src: memoryview, scratch: memoryview | None, itemsize: int,
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
