"""The sparse compressor's specification, in numpy: what the Cython kernels
(``_kernels_sparse.pxi``) must produce byte for byte (``tests/unit/test_sparse.py``).

A float32 vector of ``n`` elements is cut into chunks of ``chunk`` elements (the last one
shorter). Of each chunk the ``k`` elements of largest magnitude are kept (``min(k, len)`` of
a short chunk): magnitudes compare as the bits of ``|x|`` (``x.view(uint32) & 0x7fffffff``),
ties go to the lower index, and the kept indices are listed in ascending order. A chunk's
scale ``s`` is its largest magnitude (a float32); each kept value becomes a ``bits``-bit code
``c = clamp(rint((x / s + 1) * (L - 1) / 2), 0, L - 1)`` with ``L = 2 ** bits`` (in float64;
0 when ``s`` is 0), and decodes to ``float32(s * (c * (2 / (L - 1)) - 1))``.

A part (``Layout.nbytes`` bytes): the scales (float32, little-endian, one per chunk), then the
kept indices within their chunks (``index_bits`` bits each), then the codes (``bits`` bits
each); fields are packed least significant bit first, each section padded to a whole byte.
``accumulate`` adds (``sign`` 1) or subtracts (-1) the decoded values into a float32 vector,
chunk by chunk, in the order the part lists them: float32 additions in one fixed order, so
every peer that accumulates the same parts in the same order holds the same bytes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["Layout", "accumulate", "compress"]

#: Codes of more than 8 bits would not be "compressed"; 2 and 4 are what the papers use.
CODE_BITS = (2, 4, 8)


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """The shape of the parts of one vector: ``n`` elements, ``chunk`` per chunk, ``k`` kept per
    chunk, ``bits`` per code. Pure arithmetic; ``sparse.layout`` checks the arguments."""

    n: int
    chunk: int
    k: int
    bits: int

    @property
    def chunks(self) -> int:
        return -(-self.n // self.chunk)

    @property
    def index_bits(self) -> int:
        return max(1, (self.chunk - 1).bit_length())

    @property
    def kept(self) -> int:
        """Kept elements over all chunks."""
        full, tail = divmod(self.n, self.chunk)
        return full * min(self.k, self.chunk) + min(self.k, tail)

    @property
    def sections(self) -> tuple[int, int, int]:
        """Bytes of the scales, the indices and the codes."""
        kept = self.kept
        return (4 * self.chunks, math.ceil(kept * self.index_bits / 8),
                math.ceil(kept * self.bits / 8))

    @property
    def nbytes(self) -> int:
        return sum(self.sections)


def pack(values: NDArray[Any], bits: int) -> NDArray[np.uint8]:
    """``values`` (each < 2**bits) as ``bits``-bit fields, least significant bit first."""
    v = np.asarray(values, dtype=np.uint64)
    planes = ((v[:, None] >> np.arange(bits, dtype=np.uint64)) & 1).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little")


def unpack(raw: NDArray[np.uint8], count: int, bits: int) -> NDArray[np.int64]:
    """The first ``count`` ``bits``-bit fields of ``raw`` (``pack``'s inverse)."""
    planes = np.unpackbits(raw, bitorder="little")[:count * bits].reshape(count, bits)
    fields: NDArray[np.int64] = (planes.astype(np.int64)
                                 << np.arange(bits, dtype=np.int64)).sum(axis=1)
    return fields


def _select(keys: NDArray[np.uint32], k: int) -> NDArray[np.int64]:
    """Indices of the ``k`` largest keys (ties: the lower index), ascending."""
    order = np.lexsort((np.arange(len(keys)), -keys.astype(np.int64)))
    return np.sort(order[:k])


def decode_table(scale: float, bits: int) -> NDArray[np.float32]:
    """The float32 value of each code of a chunk of scale ``scale``."""
    levels = (1 << bits) - 1
    codes = np.arange(levels + 1, dtype=np.float64)
    return (np.float64(scale) * (codes * (2.0 / levels) - 1.0)).astype(np.float32)


def compress(src: NDArray[np.float32], layout: Layout) -> NDArray[np.uint8]:
    """The part of ``src`` (``layout.n`` float32s); ValueError if a kept value is not finite."""
    levels = (1 << layout.bits) - 1
    scales = np.zeros(layout.chunks, np.float32)
    indices, codes = [], []
    for j in range(layout.chunks):
        x = src[j * layout.chunk:(j + 1) * layout.chunk]
        keys = x.view(np.uint32) & np.uint32(0x7FFFFFFF)
        sel = _select(keys, min(layout.k, len(x)))
        s = np.float32(np.abs(x[sel]).max()) if len(sel) else np.float32(0)
        if not np.isfinite(s):
            raise ValueError(f"a kept value of chunk {j} is not finite")
        scales[j] = s
        if s == 0:
            c = np.zeros(len(sel), np.int64)
        else:
            t = (x[sel].astype(np.float64) / np.float64(s) + 1.0) * (levels / 2.0)
            c = np.clip(np.rint(t), 0, levels).astype(np.int64)
        indices.append(sel)
        codes.append(c)
    out = np.zeros(layout.nbytes, np.uint8)
    a, b, _ = layout.sections
    out[:a] = scales.astype("<f4").view(np.uint8)
    idx = pack(np.concatenate(indices), layout.index_bits)
    out[a:a + len(idx)] = idx
    code = pack(np.concatenate(codes), layout.bits)
    out[a + b:a + b + len(code)] = code
    return out


def accumulate(dst: NDArray[np.float32], part: NDArray[np.uint8], layout: Layout,
               sign: int = 1) -> None:
    """Add (``sign`` 1) or subtract (-1) the decoded ``part`` into ``dst``."""
    a, b, _ = layout.sections
    scales = part[:a].view("<f4")
    idx = unpack(part[a:a + b], layout.kept, layout.index_bits)
    codes = unpack(part[a + b:], layout.kept, layout.bits)
    at = 0
    for j in range(layout.chunks):
        m = min(layout.k, min(layout.chunk, layout.n - j * layout.chunk))
        where = j * layout.chunk + idx[at:at + m]
        values = decode_table(float(scales[j]), layout.bits)[codes[at:at + m]]
        if sign > 0:
            dst[where] += values
        else:
            dst[where] -= values
        at += m
