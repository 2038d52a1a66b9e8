"""Kernel tests, reduce and divide: Cython == numpy reference byte for byte, reference ==
numpy semantics (wrapping integers, float16/bfloat16 rounding, NaN rules). Harness:
``kernel_harness``."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pccl_aio._compute import reference as ref
from tests.unit.kernel_harness import (
    AVG,
    BF16,
    CY_IMPLS,
    F16,
    F32,
    F64,
    FLOATS,
    IMPLS,
    MAX,
    MIN,
    PROD,
    SETTINGS,
    SUM,
    as_array,
    cy,
    kernels,
    offsets,
    placed,
    rand_values,
    seeds,
    sizes,
)

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
def test_copies_copy_every_byte(impl: str, n: int, seed: int, doff: int,
                                       soff: int) -> None:
    """The in-place backup's copy (streaming stores after a head that aligns dst, a tail
    copied plainly) and the plain copy equal a copy, for any length and (mis)alignment; src
    is untouched."""
    data = np.random.default_rng(seed).integers(0, 256, n, np.uint8).tobytes()
    src, dst, plain = placed(data, soff), placed(bytes(n), doff), placed(bytes(n), doff)
    with kernels(impl) as k:
        k.stream_copy(dst, src)
        k.copy(plain, src.toreadonly())  # ops.copy's large halves (a memmove)
        if impl != "numpy" and n:  # the entry point keeps a short src in bounds
            with pytest.raises(ValueError):
                k.copy(plain, src[:-1])
    assert dst.tobytes() == data == plain.tobytes()
    assert src.tobytes() == data


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
