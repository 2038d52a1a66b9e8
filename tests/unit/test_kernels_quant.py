"""Kernel tests, quantization: minmax, quantize, dequantize and the fused accumulate;
Cython == reference byte for byte, and the reference's error bounds (non-finite values:
``test_kernels_nonfinite.py``). Harness: ``kernel_harness``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pccl_aio._compute import reference as ref
from tests.unit.kernel_harness import (
    BF16,
    CY_IMPLS,
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
    SETTINGS,
    SUM,
    U4,
    U16,
    ZPS,
    as_array,
    code_bytes,
    kernels,
    offsets,
    placed,
    rand_values,
    seeds,
    sizes,
)

# ---- quantization -----------------------------------------------------------------------

def quantize_case(rng: np.random.Generator, dtype: int, n: int, specials: bool) -> np.ndarray:
    """Float data of dtype (storage type), with or without non-finite/huge values."""
    x = rand_values(rng, dtype, n)
    if dtype == F64 and specials:
        x[rng.random(n) < 0.05] = rng.choice([1e305, -1e305, 2.0**1000, 3e-320])
    if not specials:
        wide = widened(x, dtype)
        bad = ~np.isfinite(wide) | (np.abs(wide) > 1e300)
        x[bad] = x.dtype.type(0)
    return x


@pytest.mark.cython
@pytest.mark.parametrize("impl", CY_IMPLS)
@SETTINGS
@given(dtype=st.sampled_from(FLOATS), qa=st.sampled_from(QUANT_CASES), n=sizes, seed=seeds,
       off=offsets, specials=st.booleans())
def test_quantize_matches_reference(impl: str, dtype: int, qa: tuple[int, int], n: int,
                                    seed: int, off: int, specials: bool) -> None:
    q, algo = qa
    rng = np.random.default_rng(seed)
    x = quantize_case(rng, dtype, n, specials)
    nq = code_bytes(q, n)
    codes, expected_codes = placed(bytes(nq), off), placed(bytes(nq), 0)
    expected_meta = ref.quantize(expected_codes, placed(x, 0), dtype, q, algo)
    with kernels(impl) as k:
        assert k.minmax(placed(x, off), dtype) == ref.minmax(placed(x, 0), dtype)
        meta = k.quantize(codes, placed(x, off), dtype, q, algo)
        assert codes.tobytes() == expected_codes.tobytes()
        assert np.array(meta).tobytes() == np.array(expected_meta).tobytes()
        for dst_dtype in FLOATS:  # dequantize and the fused accumulate, every op
            got, expected = placed(bytes(n * ITEM[dst_dtype]), off), placed(
                bytes(n * ITEM[dst_dtype]), 0)
            k.dequantize(got, codes, *meta, dst_dtype, q, algo)
            ref.dequantize(expected, codes, meta[0], meta[1], dst_dtype, q, algo)
            assert got.tobytes() == expected.tobytes()
            acc = rand_values(rng, dst_dtype, n)
            for op in (SUM, PROD, MIN, MAX):
                got, expected = placed(acc, off), placed(acc, 0)
                k.dequantize_accumulate(got, codes, *meta, op, dst_dtype, q, algo)
                ref.dequantize_accumulate(expected, codes, meta[0], meta[1], op, dst_dtype, q,
                                          algo)
                assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(dtype=st.sampled_from(FLOATS), qa=st.sampled_from(QUANT_CASES), n=st.integers(0, 300),
       seed=seeds, op=st.sampled_from([SUM, MIN, MAX]))
def test_fused_accumulate_is_dequantize_then_reduce(impl: str, dtype: int, qa: tuple[int, int],
                                                    n: int, seed: int, op: int) -> None:
    q, algo = qa
    rng = np.random.default_rng(seed)
    x, acc = quantize_case(rng, dtype, n, True), rand_values(rng, dtype, n)
    codes = placed(bytes(code_bytes(q, n)), 0)
    with kernels(impl) as k:
        meta = k.quantize(codes, placed(x, 0), dtype, q, algo)
        values, fused, separate = placed(acc, 0), placed(acc, 0), placed(acc, 0)
        k.dequantize(values, codes, *meta, dtype, q, algo)
        k.reduce_into(separate, values, op, dtype)
        k.dequantize_accumulate(fused, codes, *meta, op, dtype, q, algo)
    assert fused.tobytes() == separate.tobytes()


# half an ulp, relative, of the destination's rounding (float16/bfloat16 go through float32)
REL = {F64: 0.0, F32: 2.0**-24, F16: 2.0**-24 + 2.0**-11, BF16: 2.0**-24 + 2.0**-8}
TINY = {F64: 0.0, F32: 2.0**-150, F16: 2.0**-25 + 2.0**-150, BF16: 2.0**-134}


def widened(x: np.ndarray, dtype: int) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        if dtype == BF16:
            return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return x.astype(np.float64)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@example(dtype=F64, qa=(U16, ZPS), n=1, seed=1294, dst="src")  # a 1e-304 range
@given(dtype=st.sampled_from(FLOATS), qa=st.sampled_from(QUANT_CASES), n=st.integers(1, 300),
       seed=seeds, dst=st.sampled_from(["src", F64]))
def test_quantization_error_is_half_a_step(impl: str, dtype: int, qa: tuple[int, int], n: int,
                                           seed: int, dst: Any) -> None:
    """|D(q(x)) - x| <= step / 2 + 2**-40 (|lo| + |hi|) + rel(dst) |D| + tiny(dst).

    step = (hi - lo) / qmax over the finite range; 2**-40 (|lo| + |hi|) bounds the float64
    roundings of the pipeline (their sum is below 2**-48 of it); rel/tiny are half an ulp
    of the destination's rounding, relative and at the subnormal end.
    """
    q, algo = qa
    dst_dtype = dtype if dst == "src" else F64
    x = quantize_case(np.random.default_rng(seed), dtype, n, False)
    wide = widened(x, dtype)
    codes, out = placed(bytes(code_bytes(q, n)), 0), placed(bytes(n * ITEM[dst_dtype]), 0)
    with kernels(impl) as k:
        meta = k.quantize(codes, placed(x, 0), dtype, q, algo)
        k.dequantize(out, codes, *meta, dst_dtype, q, algo)
    y = widened(as_array(out, dst_dtype).view(ref.NP_DTYPES[dst_dtype]), dst_dtype)
    lo, hi = float(wide.min()), float(wide.max())
    if algo == ZPS:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        assert meta[0] == hi - lo
    else:
        assert meta == (lo + 0.0, hi + 0.0)
    step = (hi - lo) / ref.QMAX[q]
    if hi - lo < ref.QUANT_MIN_SPAN:  # too narrow to scale: quantized as a constant
        step = 2 * (hi - lo)
    if not ends_finite(meta, dtype, q, algo):  # an end code left out: a step from that end
        step *= 2
    bound = step / 2 + 2.0**-40 * (abs(lo) + abs(hi)) + REL[dst_dtype] * np.abs(y) + TINY[
        dst_dtype]
    assert (np.abs(y - wide) <= bound).all(), (np.abs(y - wide) - bound).max()


def ends_finite(meta: tuple[float, float], dtype: int, q: int, algo: int) -> bool:
    """Do codes 0 and qmax decode (the reference, into ``dtype``) to finite values?"""
    ends = [0, ref.QMAX[q]]
    raw = ref.pack4(np.array(ends)) if q == U4 else np.array(ends, QTYPE[q])
    out = placed(bytes(2 * ITEM[dtype]), 0)
    ref.dequantize(out, raw, meta[0], meta[1], dtype, q, algo)
    return bool(np.isfinite(widened(as_array(out, dtype), dtype)).all())


CONSTANTS = [42.0, 43.0, 85.0, -42.0, 0.0, 0.1, -3.3e38, 1e-40, 65504.0]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("value", "dtype"), [
    (v, d) for v in CONSTANTS for d in FLOATS if not (d == F16 and abs(v) > 65504)])
@pytest.mark.parametrize(("q", "algo"), QUANT_CASES)
def test_constants_survive_exactly(impl: str, value: float, dtype: int, q: int,
                                   algo: int) -> None:
    f32 = np.full(1023, value, np.float32)
    x = (f32.view(np.uint32) >> 16).astype(np.uint16) if dtype == BF16 else f32.astype(
        ref.NP_DTYPES[dtype])
    codes, out = placed(bytes(code_bytes(q, 1023)), 0), placed(bytes(x.nbytes), 0)
    with kernels(impl) as k:
        meta = k.quantize(codes, placed(x, 0), dtype, q, algo)
        k.dequantize(out, codes, *meta, dtype, q, algo)
    assert out.tobytes() == x.tobytes()


# ---- uint4: the packing, odd counts and blocks ------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_uint4_packs_element_2i_in_the_low_nibble(impl: str) -> None:
    x = np.arange(16, dtype=np.float32)[[3, 12, 0, 15, 7, 9, 5]]  # odd count, range 0..15
    codes = placed(bytes(4), 0)
    with kernels(impl) as k:
        assert k.quantize(codes, placed(x, 0), F32, U4, MIN_MAX) == (0.0, 15.0)
        assert codes.tobytes() == bytes([3 | 12 << 4, 0 | 15 << 4, 7 | 9 << 4, 5])
        # the last byte's high nibble is padding: decoding ignores it, never reads past n
        out = placed(bytes(7 * 4), 0)
        garbage = placed(codes.tobytes()[:3] + bytes([5 | 0xF0]), 0)
        k.dequantize(out, garbage, 0.0, 15.0, F32, U4, MIN_MAX)
        assert as_array(out, F32).tolist() == x.tolist()


@pytest.mark.parametrize("impl", CY_IMPLS)
@pytest.mark.parametrize("n", [16383, 16384, 16385, 40001])
@pytest.mark.cython
def test_uint4_across_kernel_blocks_matches_reference(impl: str, n: int) -> None:
    """Lengths across the Cython kernels' 16 KiB blocks (quantize packs per block of
    16384 codes; the accumulate decodes per block of 16 KiB of dst)."""
    rng = np.random.default_rng(n)
    for dtype in FLOATS:
        x = quantize_case(rng, dtype, n, True)
        want = placed(bytes(code_bytes(U4, n)), 0)
        meta = ref.quantize(want, placed(x, 0), dtype, U4, MIN_MAX)
        with kernels(impl) as k:
            codes = placed(bytes(code_bytes(U4, n)), 3)
            got_meta = k.quantize(codes, placed(x, 1), dtype, U4, MIN_MAX)
            assert np.array(got_meta).tobytes() == np.array(meta).tobytes()  # (NaN: poisoned)
            assert codes.tobytes() == want.tobytes()
            acc = rand_values(rng, dtype, n)
            for op in (SUM, PROD, MAX):
                got, expected = placed(acc, 1), placed(acc, 0)
                k.dequantize_accumulate(got, codes, *meta, op, dtype, U4, MIN_MAX)
                ref.dequantize_accumulate(expected, want, *meta, op, dtype, U4, MIN_MAX)
                assert got.tobytes() == expected.tobytes()
