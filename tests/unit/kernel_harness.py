"""The harness of the kernel tests (``test_kernels_*.py``); no tests here.

Implementations under test: "numpy" (``reference.py``, the specification), "cython" (the
extension with its AVX2 loops when the CPU has AVX2) and "cython-scalar" (the extension's
portable loops, AVX2 switched off). Random arrays come from a numpy Generator seeded by
hypothesis, so a failure prints the seed. ``PCCL_AIO_NO_EXTENSIONS=1`` tests the numpy path only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pccl_aio._compute import reference as ref

NO_EXT = os.environ.get("PCCL_AIO_NO_EXTENSIONS", "") not in ("", "0")
cy: ModuleType | None = None
if not NO_EXT:
    try:
        from pccl_aio import _kernels as cy
    except ImportError:  # pragma: no cover - build-dependent
        cy = None

# Tests of the Cython module against the reference carry the "cython" marker; the numpy-only
# CI run deselects them (-m "not cython") instead of skipping them.
CY_IMPLS = ["cython", "cython-scalar"]
SIMD_LEVEL = {"cython": 1, "cython-scalar": 0}
IMPLS = ["numpy", *CY_IMPLS] if cy is not None else ["numpy"]
SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
U8, U16, F16, BF16, F32, F64 = 0, 2, 8, 9, 10, 11
U4 = 12  # 4-bit codes, two per byte (MIN_MAX only)
FLOATS = (F16, BF16, F32, F64)
SUM, AVG, PROD, MAX, MIN = range(5)
MIN_MAX, ZPS = 1, 2
ITEM = {d: np.dtype(t).itemsize for d, t in ref.NP_DTYPES.items()}
#: (quantized dtype, algorithm) pairs the kernels support
QUANT_CASES = [(U8, 1), (U8, 2), (U16, 1), (U16, 2), (U4, 1)]


def code_bytes(q: int, n: int) -> int:
    """Bytes of n codes of the quantized dtype q (4-bit codes: two per byte)."""
    return (n + 1) // 2 if q == U4 else n * ITEM[q]
QTYPE = {U8: np.uint8, U16: np.uint16}


@contextlib.contextmanager
def kernels(name: str) -> Iterator[Any]:
    """The kernel module for an implementation name (SSE2 on or off for Cython)."""
    if name == "numpy":
        yield ref
        return
    assert cy is not None
    old = cy._set_simd(SIMD_LEVEL[name])
    try:
        yield cy
    finally:
        cy._set_simd(old)


def rand_values(rng: np.random.Generator, dtype: int, n: int) -> np.ndarray:
    """n elements of dtype as their storage type: random bits, ordinary and special values."""
    raw = np.frombuffer(rng.bytes(n * ITEM[dtype]), dtype=ref.NP_DTYPES[dtype]).copy()
    if dtype < F16:
        info = np.iinfo(raw.dtype)
        extremes = np.array([info.min, info.max, 0, 1, info.max // 2], dtype=raw.dtype)
        pick = rng.random(n) < 0.3
        raw[pick] = rng.choice(extremes, int(pick.sum()))
        return raw
    nice = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 7, n)
    nice[rng.random(n) < 0.05] = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 65504.0])
    with np.errstate(over="ignore"):
        if dtype == BF16:
            vals = (nice.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            vals = nice.astype(ref.NP_DTYPES[dtype])
    return np.where(rng.random(n) < 0.25, raw, vals)


def placed(data: np.ndarray | bytes, offset: int) -> memoryview:
    """A writable byte view of data starting at a (mis)aligned offset in a fresh buffer."""
    raw = bytes(data)
    buf = bytearray(offset + len(raw))
    buf[offset:] = raw
    return memoryview(buf)[offset:]


def as_array(view: memoryview, dtype: int, n: int | None = None) -> np.ndarray:
    """The elements (or, for U4, the first n codes unpacked) of a byte view."""
    if dtype == U4:
        return ref.unpack4(view, len(view) * 2 if n is None else n)
    return np.frombuffer(view, dtype=ref.NP_DTYPES[dtype])


sizes = st.one_of(st.sampled_from([0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33]),
                  st.integers(0, 300), st.integers(4000, 4200))
offsets = st.integers(0, 7)
seeds = st.integers(0, 2**32 - 1)
