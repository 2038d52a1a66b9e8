"""The quantized ring all-reduce's data path: the ring's plan with codes on the wire.

Each frame carries a segment's codes (``core/steps.py``): the sender quantizes what it sends,
the receiver dequantizes and accumulates into ``dst`` (the reduce-scatter) or decodes (the
all-gather) and forwards the received codes verbatim. Frames land in a scratch of codes
where they are also sent from. A segment that must wait for room on the link waits
unprocessed, so its decode and encode interleave with the sends. Nothing here blocks beyond
the kernels on one segment, or awaits.

The collective prepares the input for this path at launch (``prepare``): it accumulates into
``dst``, so out of place ``dst`` starts as a copy of ``src``, and an abort's backup is the
whole input at once.
"""

from __future__ import annotations

from typing import ClassVar

from ...._compute import ops as _ops
from ...._types import QUANT_BITS, Quantization
from ...core.buffers import Buffer
from ..core.ring import RS
from ..core.steps import Forward, wire_bytes
from .ring import RingPath


def prepare(src: Buffer, dst: Buffer, in_place: bool) -> None:
    """Out of place, ``dst`` starts as the input (the path accumulates into it)."""
    if not in_place:
        _ops.copy(dst.view, src.view)


class QuantRingPath(RingPath):
    """One rank's part of a quantized ring all-reduce."""

    quantized: ClassVar[bool] = True

    def _wire_bits(self, itemsize: int, quant: Quantization | None) -> int:
        assert quant is not None
        return QUANT_BITS[quant.dtype]  # 4-bit codes go two per byte

    def _first(self, off: int, n: int) -> Forward:
        """Our own chunk, quantized into its place in the scratch (free till then)."""
        assert self._scratch is not None and self._q is not None
        b, bits = self._b, self._bits
        qs = self._scratch[wire_bytes(off // b, bits) : wire_bytes((off + n) // b, bits)]
        p0, p1 = _ops.quantize(qs, self._dst[off : off + n], self._dt, *self._q)
        return Forward(RS, off, qs, p0, p1, None)
