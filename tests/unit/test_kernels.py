"""Kernel property tests: Cython == numpy reference byte for byte, reference == numpy semantics.

Implementations under test: "numpy" (``_kernels_py``, the specification), "cython" (the
extension with its AVX2 loops when the CPU has AVX2) and "cython-scalar" (the extension's
portable loops, AVX2 switched off). Random arrays come from a numpy Generator seeded by hypothesis, so
a failure prints the seed. ``PCCL_AIO_NO_EXTENSIONS=1`` tests the numpy path only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pccl_aio._compute import front as _ops
from pccl_aio._compute import reference as ref
from pccl_aio._errors import InvalidUsageError

NO_EXT = os.environ.get("PCCL_AIO_NO_EXTENSIONS", "") not in ("", "0")
cy: ModuleType | None = None
if not NO_EXT:
    try:
        from pccl_aio._compute import _kernels as cy
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
FLOATS = (F16, BF16, F32, F64)
SUM, AVG, PROD, MAX, MIN = range(5)
MIN_MAX, ZPS = 1, 2
ITEM = {d: np.dtype(t).itemsize for d, t in ref.NP_DTYPES.items()}
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


def as_array(view: memoryview, dtype: int) -> np.ndarray:
    return np.frombuffer(view, dtype=ref.NP_DTYPES[dtype])


sizes = st.one_of(st.sampled_from([0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33]),
                  st.integers(0, 300), st.integers(4000, 4200))
offsets = st.integers(0, 7)
seeds = st.integers(0, 2**32 - 1)


# ---- implementation choice ----------------------------------------------------------

def test_implementation_follows_the_environment() -> None:
    """PCCL_AIO_NO_EXTENSIONS=1 forces numpy; PCCL_AIO_REQUIRE_EXTENSIONS=1 (CI) demands Cython."""
    if NO_EXT:
        assert _ops.IMPLEMENTATION == "numpy"
    elif os.environ.get("PCCL_AIO_REQUIRE_EXTENSIONS") == "1":
        assert _ops.IMPLEMENTATION == "cython"
    else:
        assert _ops.IMPLEMENTATION in ("cython", "numpy")


def test_implementation_follows_import() -> None:
    used = _ops.IMPLEMENTATION
    assert used == ("numpy" if NO_EXT or cy is None else "cython")


@pytest.mark.parametrize(("value", "forced"), [("1", True), ("0", False), ("", False)])
def test_environment_variable(value: str, forced: bool) -> None:
    env = {**os.environ, "PCCL_AIO_NO_EXTENSIONS": value}
    out = subprocess.run([sys.executable, "-c", "from pccl_aio._compute import front; print(front.IMPLEMENTATION)"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    if forced or not _cython_builds():
        assert out == "numpy"
    else:
        assert out == "cython"


def _cython_builds() -> bool:
    try:
        import pccl_aio._compute._kernels  # noqa: F401
    except ImportError:
        return False
    return True


# ---- reduce and divide ----------------------------------------------------------------

@pytest.mark.cython
@pytest.mark.parametrize("impl", CY_IMPLS)
@SETTINGS
@given(dtype=st.integers(0, 11), op=st.integers(0, 4), n=sizes, seed=seeds,
       doff=offsets, soff=offsets)
def test_reduce_matches_reference(impl: str, dtype: int, op: int, n: int, seed: int,
                                  doff: int, soff: int) -> None:
    rng = np.random.default_rng(seed)
    d, s = rand_values(rng, dtype, n), rand_values(rng, dtype, n)
    expected = placed(d, 0)
    ref.reduce_into(expected, placed(s, 0), op, dtype)
    got = placed(d, doff)
    with kernels(impl) as k:
        k.reduce_into(got, placed(s, soff), op, dtype)
    assert got.tobytes() == expected.tobytes()


@pytest.mark.cython
@pytest.mark.parametrize("impl", CY_IMPLS)
@SETTINGS
@given(dtype=st.integers(0, 11), divisor=st.sampled_from([1, 2, 3, 7, 8, 255, 256, 1000,
                                                          2**31 - 1]), n=sizes, seed=seeds)
def test_divide_matches_reference(impl: str, dtype: int, divisor: int, n: int,
                                  seed: int) -> None:
    d = rand_values(np.random.default_rng(seed), dtype, n)
    expected, got = placed(d, 0), placed(d, 1)
    ref.divide(expected, divisor, dtype)
    with kernels(impl) as k:
        k.divide(got, divisor, dtype)
    assert got.tobytes() == expected.tobytes()


NUMPY_OP = {SUM: np.add, AVG: np.add, PROD: np.multiply, MAX: np.maximum, MIN: np.minimum}


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(dtype=st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, F32, F64]), op=st.integers(0, 4),
       n=st.integers(0, 200), seed=seeds)
def test_reduce_is_numpy_arithmetic(impl: str, dtype: int, op: int, n: int,
                                    seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, s = rand_values(rng, dtype, n), rand_values(rng, dtype, n)
    with np.errstate(all="ignore"):
        expected = NUMPY_OP[op](d, s)  # wraps for integers; NaN compares equal below
    got = placed(d, 0)
    with kernels(impl) as k:
        k.reduce_into(got, placed(s, 0), op, dtype)
    np.testing.assert_array_equal(as_array(got, dtype), expected)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(op=st.sampled_from([SUM, PROD]), n=st.integers(0, 200), seed=seeds)
def test_float16_is_float32_then_rounded(impl: str, op: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, s = rand_values(rng, F16, n), rand_values(rng, F16, n)
    with np.errstate(all="ignore"):
        expected = NUMPY_OP[op](d.astype(np.float32), s.astype(np.float32)).astype(np.float16)
    got = placed(d, 0)
    with kernels(impl) as k:
        k.reduce_into(got, placed(s, 0), op, F16)
    np.testing.assert_array_equal(as_array(got, F16), expected)


def bf16_nearest_even(x: np.float32) -> int:
    """Independent bfloat16 rounding of a finite float32, with exact rationals."""

    def exact(b16: int) -> Fraction:  # the pattern past the largest finite one is +-2**128
        if b16 & 0x7F80 == 0x7F80:
            return Fraction(2) ** 128 * (-1 if b16 & 0x8000 else 1)
        return Fraction(float(np.uint32(b16 << 16).view(np.float32)))

    lo = int(np.float32(x).view(np.uint32)) >> 16
    value = Fraction(float(x))
    down, up = abs(value - exact(lo)), abs(exact(lo + 1) - value)
    if down != up:
        return lo if down < up else lo + 1
    return lo if lo % 2 == 0 else lo + 1


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(op=st.sampled_from([SUM, PROD]), n=st.integers(0, 40), seed=seeds)
def test_bfloat16_rounds_to_nearest_even(impl: str, op: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, s = rand_values(rng, BF16, n), rand_values(rng, BF16, n)
    wide = [a.astype(np.uint32) << np.uint32(16) for a in (d, s)]
    with np.errstate(all="ignore"):
        exact = NUMPY_OP[op](*(w.view(np.float32) for w in wide))
    got = placed(d, 0)
    with kernels(impl) as k:
        k.reduce_into(got, placed(s, 0), op, BF16)
    for value, bits in zip(exact, as_array(got, BF16), strict=True):
        if np.isnan(value):
            assert bits == 0x7FC0
        elif np.isinf(value):
            assert bits == (0xFF80 if value < 0 else 0x7F80)
        else:
            assert bits == bf16_nearest_even(value), (value, hex(bits))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("dtype", "a", "b", "op", "expected"), [
    (1, 127, 1, SUM, -128),                                 # int8 wraps
    (6, 2**64 - 1, 2, SUM, 1),                              # uint64 wraps
    (7, -(2**63), -1, SUM, 2**63 - 1),
    (2, 65535, 65535, PROD, 1),                             # uint16 * uint16 wraps, no UB
    (F32, np.inf, -np.inf, SUM, np.nan),
    (F16, 65504.0, 65504.0, SUM, np.inf),                   # f16 overflow
    (F16, 1.0, 2.0**-11, SUM, 1.0),                         # f16 tie -> even
    (F16, 1.0 + 2.0**-10, 2.0**-11, SUM, 1.0 + 2.0**-9),
    (F16, 2.0**-24, 2.0**-24, SUM, 2.0**-23),               # subnormals
    (F64, np.nan, 1.0, MIN, np.nan),
    (F32, 1.0, np.nan, MAX, np.nan),
    (F32, -0.0, 0.0, MIN, 0.0),
])
def test_examples(impl: str, dtype: int, a: Any, b: Any, op: int, expected: Any) -> None:
    t = ref.NP_DTYPES[dtype]
    got = placed(np.array([a], dtype=t), 0)
    with kernels(impl) as k:
        k.reduce_into(got, placed(np.array([b], dtype=t), 0), op, dtype)
    np.testing.assert_array_equal(as_array(got, dtype), np.array([expected], dtype=t))
    if dtype in FLOATS and op in (SUM, PROD) and np.isnan(expected):
        assert got.tobytes() == np.array([np.nan], dtype=t).tobytes()  # canonical NaN


@pytest.mark.parametrize("impl", IMPLS)
def test_bfloat16_ties_and_nan(impl: str) -> None:
    d = np.array([0x3F80, 0x3F81, 0x7F80, 0x7FC1, 0xFFA0, 0x0001], dtype=np.uint16)
    s = np.array([0x3B80, 0x3B80, 0xFF80, 0x3F80, 0x7F81, 0x0001], dtype=np.uint16)
    got = placed(d, 0)
    with kernels(impl) as k:
        k.reduce_into(got, placed(s, 0), SUM, BF16)
        assert as_array(got, BF16).tolist() == [0x3F80, 0x3F82, 0x7FC0, 0x7FC0, 0x7FC0, 0x0002]
        got = placed(d, 0)
        k.reduce_into(got, placed(s, 0), MAX, BF16)  # MIN/MAX keep an operand's NaN bits
        assert as_array(got, BF16).tolist() == [0x3F80, 0x3F81, 0x7F80, 0x7FC1, 0xFFA0, 0x0001]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_every_16_bit_pattern_round_trips(impl: str, dtype: int) -> None:
    bits = np.arange(65536, dtype=np.uint16)
    got = placed(bits, 0)
    with kernels(impl) as k:  # x + (-0.0) == x: widen, add, round back
        k.reduce_into(got, placed(np.full(65536, 0x8000, np.uint16), 0), SUM, dtype)
    nan = (bits & 0x7FFF) > (0x7C00 if dtype == F16 else 0x7F80)
    out = np.frombuffer(got, dtype=np.uint16)
    assert (out[~nan] == bits[~nan]).all()
    assert (out[nan] == (0x7E00 if dtype == F16 else 0x7FC0)).all()


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(dtype=st.integers(0, 11), op=st.integers(0, 4), n=st.integers(0, 20_000), seed=seeds,
       aoff=offsets, boff=offsets)
def test_reduce_from_is_copy_then_reduce_into(impl: str, dtype: int, op: int, n: int,
                                             seed: int, aoff: int, boff: int) -> None:
    """dst = op(a, b) in one pass gives the bits of dst = a; reduce_into(dst, b), including
    across the kernel's 16 KiB blocks; a or b may be dst itself."""
    rng = np.random.default_rng(seed)
    a, b = rand_values(rng, dtype, n), rand_values(rng, dtype, n)
    expected = placed(a, 0)
    ref.reduce_into(expected, placed(b, 0), op, dtype)
    got = placed(np.zeros_like(a), 0)
    alias = placed(a, aoff)
    alias_b = placed(b, boff)
    with kernels(impl) as k:
        k.reduce_from(got, placed(a, aoff), placed(b, boff), op, dtype)
        k.reduce_from(alias, alias, placed(b, boff), op, dtype)
        k.reduce_from(alias_b, placed(a, aoff), alias_b, op, dtype)
    assert got.tobytes() == expected.tobytes()
    assert alias.tobytes() == expected.tobytes()
    assert alias_b.tobytes() == expected.tobytes()


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(dtype=st.integers(0, 11), op=st.integers(0, 4), n=st.integers(0, 40_000), seed=seeds,
       aoff=offsets, soff=st.integers(0, 63))
def test_reduce_from_with_save_keeps_the_input(impl: str, dtype: int, op: int, n: int,
                                               seed: int, aoff: int, soff: int) -> None:
    """The in-place backup fused into the reduce: ``save`` gets a's original bytes and dst
    the same bits as without it, across the 64 KiB save blocks, also when dst is a."""
    rng = np.random.default_rng(seed)
    a, b = rand_values(rng, dtype, n), rand_values(rng, dtype, n)
    expected = placed(a, 0)
    ref.reduce_into(expected, placed(b, 0), op, dtype)
    got, alias = placed(np.zeros_like(a), 0), placed(a, aoff)
    save, save_alias = placed(bytes(a.nbytes), soff), placed(bytes(a.nbytes), soff)
    with kernels(impl) as k:
        k.reduce_from(got, placed(a, aoff), placed(b, 0), op, dtype, save)
        k.reduce_from(alias, alias, placed(b, 0), op, dtype, save_alias)
        if impl != "numpy" and a.nbytes:  # the entry point keeps a short save in bounds
            with pytest.raises(ValueError):
                k.reduce_from(got, placed(a, 0), placed(b, 0), op, dtype,
                              placed(bytes(a.nbytes - 1), 0))
    assert got.tobytes() == expected.tobytes() == alias.tobytes()
    assert save.tobytes() == a.tobytes() == save_alias.tobytes()


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(n=st.integers(0, 70_000), seed=seeds, doff=st.integers(0, 63), soff=st.integers(0, 63))
def test_stream_copy_copies_every_byte(impl: str, n: int, seed: int, doff: int,
                                       soff: int) -> None:
    """The in-place backup's copy (streaming stores after a head that aligns dst, a tail
    copied plainly) equals a plain copy, for any length and (mis)alignment; src is untouched."""
    data = np.random.default_rng(seed).integers(0, 256, n, np.uint8).tobytes()
    src, dst = placed(data, soff), placed(bytes(n), doff)
    with kernels(impl) as k:
        k.stream_copy(dst, src)
    assert dst.tobytes() == data
    assert src.tobytes() == data


def test_ops_reduce_from_splits_large_jobs_and_checks_lengths() -> None:
    n = (9 << 20) // 4 + 3  # past the 8 MiB threshold: two threads
    a = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    b = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    out = np.empty_like(a)
    _ops.reduce_from(out, a, b, SUM, F32)
    assert out.tobytes() == (a + b).tobytes()
    with pytest.raises(InvalidUsageError, match="length mismatch"):
        _ops.reduce_from(out, a[:-1], b, SUM, F32)
    with pytest.raises(InvalidUsageError, match="read-only"):
        _ops.reduce_from(np.frombuffer(bytes(8), np.uint8), bytes(8), bytes(8), SUM, U8)


@pytest.mark.cython
@pytest.mark.parametrize("impl", CY_IMPLS)
@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("op", [SUM, PROD])
def test_every_16_bit_pattern_against_reference(impl: str, dtype: int, op: int) -> None:
    every = np.arange(65536, dtype=np.uint16)
    others = [0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x3C01, 0x7BFF, 0x7C00, 0xFC00, 0x7E00,
              0x7F80, 0xFF80, 0x7FC0, 0x3F80, 0x3F81, 0xC0A5]
    for other in others:
        s = placed(np.full(65536, other, np.uint16), 0)
        got, expected = placed(every, 0), placed(every, 0)
        ref.reduce_into(expected, s, op, dtype)
        with kernels(impl) as k:
            k.reduce_into(got, s, op, dtype)
        assert got.tobytes() == expected.tobytes(), hex(other)


@pytest.mark.cython
def test_float16_conversions_are_numpys() -> None:
    """Every float16 widens, and float32 patterns (random, plus every exponent's edges and
    NaN payloads) round, exactly as numpy's casts (checked offline for all 2**32 too)."""
    assert cy is not None
    h = np.arange(65536, dtype=np.uint16)
    f = np.empty(65536, np.float32)
    cy._f16_to_f32(f, h)
    assert f.view(np.uint32).tobytes() == h.view(np.float16).astype(np.float32).view(
        np.uint32).tobytes()
    edges = (np.arange(512, dtype=np.uint32) << 23)[:, None] + np.array(
        [0, 1, 0xFFF, 0x1000, 0x1001, 0x2FFF, 0x3000, 0x7FE000, 0x7FFFFF], np.uint32)
    bits = np.concatenate([edges.ravel(), np.random.default_rng(0).integers(
        0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32)])
    out = np.empty(bits.size, np.uint16)
    cy._f32_to_f16(out, bits.view(np.float32))
    with np.errstate(all="ignore"):
        assert out.tobytes() == bits.view(np.float32).astype(np.float16).tobytes()


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(dtype=st.integers(0, 7), divisor=st.integers(1, 2**31 - 1), seed=seeds)
def test_integer_average_truncates_toward_zero(impl: str, dtype: int, divisor: int,
                                               seed: int) -> None:
    d = rand_values(np.random.default_rng(seed), dtype, 50)
    got = placed(d, 0)
    with kernels(impl) as k:
        k.divide(got, divisor, dtype)
    expected = [(abs(int(v)) // divisor) * (1 if v >= 0 else -1) for v in d]
    assert as_array(got, dtype).tolist() == expected


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_float_average_divides_in_own_type(impl: str, dtype: int) -> None:
    d = rand_values(np.random.default_rng(7), dtype, 500)
    got = placed(d, 0)
    with kernels(impl) as k:
        k.divide(got, 3, dtype)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(as_array(got, dtype), d / d.dtype.type(3))


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
@given(dtype=st.sampled_from(FLOATS), q=st.sampled_from([U8, U16]), algo=st.sampled_from(
    [MIN_MAX, ZPS]), n=sizes, seed=seeds, off=offsets, specials=st.booleans())
def test_quantize_matches_reference(impl: str, dtype: int, q: int, algo: int, n: int,
                                    seed: int, off: int, specials: bool) -> None:
    rng = np.random.default_rng(seed)
    x = quantize_case(rng, dtype, n, specials)
    codes, expected_codes = placed(bytes(n * ITEM[q]), off), placed(bytes(n * ITEM[q]), 0)
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
@given(dtype=st.sampled_from(FLOATS), q=st.sampled_from([U8, U16]), algo=st.sampled_from(
    [MIN_MAX, ZPS]), n=st.integers(0, 300), seed=seeds, op=st.sampled_from([SUM, MIN, MAX]))
def test_fused_accumulate_is_dequantize_then_reduce(impl: str, dtype: int, q: int, algo: int,
                                                    n: int, seed: int, op: int) -> None:
    rng = np.random.default_rng(seed)
    x, acc = quantize_case(rng, dtype, n, True), rand_values(rng, dtype, n)
    codes = placed(bytes(n * ITEM[q]), 0)
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
@example(dtype=F64, q=U16, algo=ZPS, n=1, seed=1294, dst="src")  # a 1e-304 range
@given(dtype=st.sampled_from(FLOATS), q=st.sampled_from([U8, U16]), algo=st.sampled_from(
    [MIN_MAX, ZPS]), n=st.integers(1, 300), seed=seeds, dst=st.sampled_from(["src", F64]))
def test_quantization_error_is_half_a_step(impl: str, dtype: int, q: int, algo: int, n: int,
                                           seed: int, dst: Any) -> None:
    """|D(q(x)) - x| <= step / 2 + 2**-40 (|lo| + |hi|) + rel(dst) |D| + tiny(dst).

    step = (hi - lo) / qmax over the finite range; 2**-40 (|lo| + |hi|) bounds the float64
    roundings of the pipeline (their sum is below 2**-48 of it); rel/tiny are half an ulp
    of the destination's rounding, relative and at the subnormal end.
    """
    dst_dtype = dtype if dst == "src" else F64
    x = quantize_case(np.random.default_rng(seed), dtype, n, False)
    wide = widened(x, dtype)
    codes, out = placed(bytes(n * ITEM[q]), 0), placed(bytes(n * ITEM[dst_dtype]), 0)
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
    step = (hi - lo) / (255 if q == U8 else 65535)
    if hi - lo < ref.QUANT_MIN_SPAN:  # too narrow to scale: quantized as a constant
        step = 2 * (hi - lo)
    bound = step / 2 + 2.0**-40 * (abs(lo) + abs(hi)) + REL[dst_dtype] * np.abs(y) + TINY[
        dst_dtype]
    assert (np.abs(y - wide) <= bound).all(), (np.abs(y - wide) - bound).max()


CONSTANTS = [42.0, 43.0, 85.0, -42.0, 0.0, 0.1, -3.3e38, 1e-40, 65504.0]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("value", "dtype"), [
    (v, d) for v in CONSTANTS for d in FLOATS if not (d == F16 and abs(v) > 65504)])
@pytest.mark.parametrize("q", [U8, U16])
@pytest.mark.parametrize("algo", [MIN_MAX, ZPS])
def test_constants_survive_exactly(impl: str, value: float, dtype: int, q: int,
                                   algo: int) -> None:
    f32 = np.full(1024, value, np.float32)
    x = (f32.view(np.uint32) >> 16).astype(np.uint16) if dtype == BF16 else f32.astype(
        ref.NP_DTYPES[dtype])
    codes, out = placed(bytes(1024 * ITEM[q]), 0), placed(bytes(x.nbytes), 0)
    with kernels(impl) as k:
        meta = k.quantize(codes, placed(x, 0), dtype, q, algo)
        k.dequantize(out, codes, *meta, dtype, q, algo)
    assert out.tobytes() == x.tobytes()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q", [U8, U16])
def test_nan_and_inf_codes(impl: str, q: int) -> None:
    x = np.array([1.0, np.nan, np.inf, -np.inf, 2.0, 0.0], np.float32)
    codes = placed(bytes(6 * ITEM[q]), 0)
    with kernels(impl) as k:
        assert k.quantize(codes, placed(x, 0), F32, q, MIN_MAX) == (0.0, 2.0)
        qmax = 255 if q == U8 else 65535
        assert as_array(codes, q).tolist() == [(qmax + 1) // 2, 0, qmax, 0, qmax, 0]
        assert k.quantize(codes, placed(x, 0), F32, q, ZPS) == (2.0, 0.0)
        assert k.minmax(placed(np.array([np.nan, np.inf], np.float32), 0), F32) == (0.0, 0.0)


# ---- _ops: argument checks ----------------------------------------------------------------

def test_ops_accepts_buffers_of_any_layout_and_dtype() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    _ops.reduce_into(a, np.ones(12, np.float32), SUM, F32)
    _ops.reduce_into(a, bytearray(np.ones(12, np.float32).tobytes()), SUM, F32)
    assert a.ravel().tolist() == [float(i + 2) for i in range(12)]
    b = bytearray(np.full(4, 9, np.int32).tobytes())
    _ops.divide(memoryview(b), 2, 5)
    assert np.frombuffer(b, np.int32).tolist() == [4] * 4
    codes = np.empty(12, np.uint8)
    meta = _ops.quantize(codes, a, F32, U8, MIN_MAX)
    out = np.empty_like(a)
    _ops.dequantize(out, codes, *meta, F32, U8, MIN_MAX)
    _ops.dequantize_accumulate(out, codes, *meta, SUM, F32, U8, MIN_MAX)
    assert _ops.minmax(a, F32) == (2.0, 13.0)
    numpy_scalars: Any = (np.int64(SUM), np.int32(F32), np.float32(meta[0]), np.uint8(MIN_MAX))
    _ops.reduce_into(a, a, numpy_scalars[0], numpy_scalars[1])
    _ops.dequantize(out, codes, numpy_scalars[2], meta[1], F32, U8, numpy_scalars[3])


@pytest.mark.parametrize("call", [
    lambda: _ops.reduce_into(np.zeros(4, np.float32), np.zeros(4, np.float32), SUM, 12),
    lambda: _ops.reduce_into(np.zeros(4, np.float32), np.zeros(4, np.float32), SUM, "f4"),  # type: ignore[arg-type]
    lambda: _ops.reduce_into(np.zeros(4, np.float32), np.zeros(4, np.float32), 5, F32),
    lambda: _ops.reduce_into(np.zeros(4, np.float32), np.zeros(3, np.float32), SUM, F32),
    lambda: _ops.reduce_into(bytearray(6), bytearray(6), SUM, F32),
    lambda: _ops.reduce_into(np.arange(10)[::2], np.arange(5), SUM, 7),
    lambda: _ops.reduce_into(np.zeros(5, np.int64), np.arange(10)[::2], SUM, 7),
    lambda: _ops.reduce_into(np.zeros((4, 4), np.float32).T, np.zeros(16, np.float32), SUM, F32),
    lambda: _ops.reduce_into(np.frombuffer(b"12345678", np.uint8), bytes(8), SUM, U8),
    lambda: _ops.reduce_into([1, 2], [3, 4], SUM, U8),  # type: ignore[arg-type]
    lambda: _ops.divide(np.zeros(4, np.float32), 0, F32),
    lambda: _ops.divide(np.zeros(4, np.float32), 2**31, F32),
    lambda: _ops.divide(np.zeros(4, np.float32), 2.0, F32),  # type: ignore[arg-type]
    lambda: _ops.divide(np.frombuffer(b"1234", np.uint8), 2, U8),
    lambda: _ops.minmax(np.zeros(4, np.int32), 5),
    lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.float32), F32, U8, 0),
    lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.float32), F32, U8, 3),
    lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.float32), F32, 4, MIN_MAX),
    lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.float32), F32, U16, MIN_MAX),
    lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.int32), 5, U8, MIN_MAX),
    lambda: _ops.quantize(bytes(4), np.zeros(4, np.float32), F32, U8, MIN_MAX),
    lambda: _ops.dequantize(np.zeros(4, np.float32), np.zeros(3, np.uint8), 0.0, 1.0, F32, U8, 1),
    lambda: _ops.dequantize(np.zeros(4, np.int32), np.zeros(4, np.uint8), 0.0, 1.0, 5, U8, 1),
    lambda: _ops.dequantize(np.zeros(4, np.float32), np.zeros(4, np.uint8), np.nan, 1.0, F32, U8,
                            1),
    lambda: _ops.dequantize(np.zeros(4, np.float32), np.zeros(4, np.uint8), 0.0, 1e308, F32, U8,
                            1),
    lambda: _ops.dequantize_accumulate(np.zeros(4, np.float32), np.zeros(4, np.uint8), 0.0, 1.0,
                                       7, F32, U8, 1),
    lambda: _ops.dequantize(np.zeros(4, np.float32), np.zeros(4, np.uint8),
                            "0", 1.0, F32, U8, 1),  # type: ignore[arg-type]
    lambda: _ops.divide(np.zeros(4, np.float32), True, F32),
])
def test_ops_rejects_bad_arguments(call: Any) -> None:
    with pytest.raises(InvalidUsageError):
        call()


# ---- large jobs split over two threads -----------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16, F64])
def test_two_thread_split_is_bit_identical(dtype: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs above PARALLEL_MIN_BYTES run in two halves on two threads; same bytes as one call."""
    monkeypatch.setattr(_ops, "KERNEL_THREADS", 2)  # exercised whatever the core count
    n = (_ops.PARALLEL_MIN_BYTES + 4096 + 6) // ITEM[dtype] + 3  # uneven, not cache-aligned
    rng = np.random.default_rng(5)
    a = rand_values(rng, dtype, n)
    b = rand_values(rng, dtype, n)
    assert a.nbytes >= _ops.PARALLEL_MIN_BYTES and _ops._split(a.nbytes, ITEM[dtype])
    impl = _ops._impl
    for op in (0, 2, 3, 4):
        got, want = a.copy(), a.copy()
        _ops.reduce_into(got, b, op, dtype)
        impl.reduce_into(memoryview(want).cast("B"), memoryview(b).cast("B"), op, dtype)
        assert got.tobytes() == want.tobytes(), op
    got, want = a.copy(), a.copy()
    _ops.divide(got, 3, dtype)
    impl.divide(memoryview(want).cast("B"), 3, dtype)
    assert got.tobytes() == want.tobytes()
    q = np.empty(n, np.uint8)
    meta = _ops.quantize(q, b, dtype, U8, MIN_MAX)
    got, want = a.copy(), a.copy()
    _ops.dequantize_accumulate(got, q, *meta, 0, dtype, U8, MIN_MAX)
    impl.dequantize_accumulate(memoryview(want).cast("B"), memoryview(q).cast("B"), *meta, 0,
                               dtype, U8, MIN_MAX)
    assert got.tobytes() == want.tobytes()
    _ops.dequantize(got, q, *meta, dtype, U8, MIN_MAX)
    impl.dequantize(memoryview(want).cast("B"), memoryview(q).cast("B"), *meta, dtype, U8,
                    MIN_MAX)
    assert got.tobytes() == want.tobytes()


def test_copy_is_exact_split_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ops, "KERNEL_THREADS", 2)
    rng = np.random.default_rng(3)
    for n in (0, 1, 1000, _ops.PARALLEL_MIN_BYTES + 77):
        src = rng.integers(0, 256, n, dtype=np.uint8)
        dst = np.zeros(n, np.uint8)
        _ops.copy(memoryview(dst), memoryview(src.tobytes()))  # a read-only source works
        assert dst.tobytes() == src.tobytes()
    with pytest.raises(InvalidUsageError, match="length mismatch"):
        _ops.copy(memoryview(bytearray(3)), memoryview(bytes(4)))
