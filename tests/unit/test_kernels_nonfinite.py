"""Kernel tests, quantization's non-finite policy (``reference.py``): a NaN, an infinity or a
float64 value beyond 2**1000 poisons the block (codes 0, metadata (NaN, NaN)), which decodes
to the canonical NaN and makes the accumulate NaN; the end codes never decode to an infinity
(a zero point's half step past a range at the dtype's largest value). Every implementation
gives the same bytes. Harness: ``kernel_harness``."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._compute import ops as _ops
from pccl_aio._compute import reference as ref
from tests.unit.kernel_harness import (
    AVG,
    BF16,
    F16,
    F32,
    F64,
    FLOATS,
    IMPLS,
    ITEM,
    MAX,
    MIN,
    MIN_MAX,
    PROD,
    QTYPE,
    QUANT_CASES,
    SUM,
    U4,
    U8,
    ZPS,
    as_array,
    code_bytes,
    kernels,
    placed,
)

LARGEST = {F16: 65504.0, BF16: float(np.uint32(0x7F7F0000).view(np.float32)),
           F32: float(np.finfo(np.float32).max), F64: float(np.finfo(np.float64).max)}


def stored(values: list[float] | np.ndarray, dtype: int) -> np.ndarray:
    """float64 values in dtype's storage (bfloat16: the top half of float32's bits)."""
    f = np.asarray(values, np.float64)
    if dtype == BF16:
        with np.errstate(over="ignore", invalid="ignore"):
            return (f.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        return f.astype(ref.NP_DTYPES[dtype])


def wide(view: memoryview, dtype: int) -> np.ndarray:
    a = as_array(view, dtype)
    if dtype == BF16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        return a.astype(np.float64)


def nan_bits(dtype: int, n: int) -> bytes:
    width = {F64: np.uint64, F32: np.uint32}.get(dtype, np.uint16)
    return np.full(n, ref.CANONICAL_NAN_BITS[dtype], width).tobytes()


# (only float64 holds values beyond 2**1000)
SPECIALS = [(s, d) for s in ("nan", "inf", "-inf", "all-nan") for d in FLOATS] + [("beyond", F64)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("special", "dtype"), SPECIALS)
@pytest.mark.parametrize(("q", "algo"), QUANT_CASES)
def test_a_non_finite_value_poisons_its_block(impl, dtype, q, algo, special):
    n = 37
    values = np.linspace(-2.0, 3.0, n)
    if special == "all-nan":
        values[:] = np.nan
    else:
        values[n // 2] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "beyond": 2.0**1001}[
            special]
    x = placed(stored(values, dtype), 3)
    codes = placed(b"\xa5" * code_bytes(q, n), 1)  # stale bytes: every code is written
    with kernels(impl) as k:
        meta = k.quantize(codes, x, dtype, q, algo)
        assert all(math.isnan(m) for m in meta), meta
        assert codes.tobytes() == bytes(code_bytes(q, n))
        for dst in FLOATS:
            out = placed(bytes(n * ITEM[dst]), 2)
            k.dequantize(out, codes, *meta, dst, q, algo)
            assert out.tobytes() == nan_bits(dst, n)
            for op in (SUM, AVG, PROD, MIN, MAX):
                acc = placed(stored(np.arange(n, dtype=np.float64), dst), 5)
                k.dequantize_accumulate(acc, codes, *meta, op, dst, q, algo)
                assert acc.tobytes() == nan_bits(dst, n), op


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", [SUM, MIN, MAX])
def test_a_poisoned_block_keeps_the_nans_already_in_dst_for_min_and_max(impl, op):
    """The accumulate is reduce_into(dst, NaN): MIN/MAX keep a NaN of dst bit for bit."""
    mine = np.array([1.0, np.nan, 2.0], np.float32)
    mine.view(np.uint32)[1] = 0x7FC00123  # a NaN with a payload
    with kernels(impl) as k:
        acc = placed(mine, 0)
        k.dequantize_accumulate(acc, placed(bytes(3), 0), math.nan, 0.0, op, F32, 0, MIN_MAX)
        want = [0x7FC00000, 0x7FC00123 if op != SUM else 0x7FC00000, 0x7FC00000]
        assert np.frombuffer(acc, np.uint32).tolist() == want


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [F16, BF16, F32])
@pytest.mark.parametrize(("q", "algo"), QUANT_CASES)
def test_the_codes_of_a_range_at_the_dtypes_largest_value_decode_finite(impl, dtype, q, algo):
    """ZERO_POINT_SCALE's zero point puts the end codes up to half a step beyond the range:
    with the range's end at the dtype's largest value, that code is left out (a whole step
    from that end instead), and no value comes back infinite; MIN_MAX stays as it was."""
    big = LARGEST[dtype]
    values = np.array([-big, big, -big / 3, 0.0, big / 7, -big])
    n = len(values)
    x = stored(values, dtype)
    span, qmax = 2 * big, ref.QMAX[q]
    with kernels(impl) as k:
        codes = placed(bytes(code_bytes(q, n)), 0)
        meta = k.quantize(codes, placed(x, 0), dtype, q, algo)
        out = placed(bytes(x.nbytes), 0)
        k.dequantize(out, codes, *meta, dtype, q, algo)
    y = wide(out, dtype)
    assert np.isfinite(y).all(), y
    assert (np.abs(y - wide(placed(x, 0), dtype)) <= span / qmax * (1 + 2**-7)).all()
    got = set(as_array(codes, q, n).tolist())
    for end in (0, qmax):  # -big and big take the end codes, unless they decode infinite
        assert (end in got) == bool(np.isfinite(decoded(end, meta, dtype, q, algo))), end
    if algo == ZPS and q == U8:  # zp = 128: code 0 is half a step (0.4 %) past -big
        assert 0 not in got


def decoded(code: int, meta: tuple[float, float], dtype: int, q: int, algo: int) -> float:
    """What the reference decodes ``code`` to (widened to float64)."""
    raw = ref.pack4(np.array([code])) if q == U4 else np.array([code], QTYPE[q])
    out = placed(bytes(ITEM[dtype]), 0)
    ref.dequantize(out, raw, meta[0], meta[1], dtype, q, algo)
    return float(wide(out, dtype)[0])


@pytest.mark.parametrize("impl", IMPLS)
def test_values_within_limits_are_not_poisoned(impl):
    x = np.array([-(2.0**1000), 2.0**1000, 1e-300, 0.0])
    with kernels(impl) as k:
        codes = placed(bytes(4), 0)
        assert k.quantize(codes, placed(x, 0), F64, 0, MIN_MAX) == (-(2.0**1000), 2.0**1000)
        assert as_array(codes, 0).tolist() == [0, 255, 128, 128]
        assert k.minmax(placed(np.array([np.nan, np.inf], np.float32), 0), F32) == (0.0, 0.0)


def test_the_front_door_passes_a_poisoned_blocks_metadata_and_refuses_others():
    out = np.zeros(4, np.float32)
    _ops.dequantize(out, bytes(4), math.nan, math.nan, F32, 0, MIN_MAX)
    assert np.isnan(out).all()
    _ops.dequantize_accumulate(out, bytes(2), math.nan, 1.0, SUM, F32, U4, MIN_MAX)
    for bad in ((math.inf, 1.0), (0.0, math.nan), (0.0, -math.inf), ("x", 1.0)):
        with pytest.raises(pccl.InvalidUsageError, match="metadata"):
            _ops.dequantize(out, bytes(4), *bad, F32, 0, MIN_MAX)
