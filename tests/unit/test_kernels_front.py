"""Kernel tests, the front door (``_compute/ops.py``): which implementation runs, argument
checks, and large jobs split over two threads. Harness: ``kernel_harness``."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from pccl_aio._compute import ops as _ops
from pccl_aio._compute import reference as ref
from pccl_aio._errors import InvalidUsageError
from pccl_aio._types import TENSOR_DTYPES
from tests.unit.kernel_harness import (
    BF16,
    F32,
    F64,
    ITEM,
    MIN_MAX,
    NO_EXT,
    SUM,
    U4,
    U8,
    U16,
    cy,
    rand_values,
)

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
    code = "from pccl_aio._compute import ops; print(ops.IMPLEMENTATION)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    if forced or not _cython_builds():
        assert out == "numpy"
    else:
        assert out == "cython"


def _cython_builds() -> bool:
    try:
        import pccl_aio._kernels  # noqa: F401
    except ImportError:
        return False
    return True


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
    lambda: _ops.dequantize(np.zeros(4, np.float32), np.zeros(4, np.uint8), 1.0, np.nan, F32, U8,
                            1),  # (a NaN p0 is a poisoned block's: test_kernels_nonfinite.py)
    lambda: _ops.dequantize(np.zeros(4, np.float32), np.zeros(4, np.uint8), np.inf, 1.0, F32, U8,
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


@pytest.mark.parametrize(("call", "message"), [
    (lambda: _ops.minmax(np.zeros(4, np.int32), 5),
     "dtype must be float16, bfloat16, float32 or float64, not int32"),
    (lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.float32), F32, 4, MIN_MAX),
     "quantized dtype must be uint8, uint16 or uint4, not uint32"),
    (lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.float32), F32, 17, MIN_MAX),
     "quantized dtype must be uint8, uint16 or uint4, not 17"),
    (lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.float32), F32, U8, 0),
     "algorithm NONE does not quantize"),
    (lambda: _ops.quantize(np.zeros(4, np.uint8), np.zeros(4, np.float32), F32, U8, 3),
     "unknown quantization algorithm 3; expected one of NONE, MIN_MAX, ZERO_POINT_SCALE"),
    (lambda: _ops.dequantize(np.zeros(4, np.int32), np.zeros(4, np.uint8), 0.0, 1.0, 5, U8, 1),
     "dst_dtype must be float16, bfloat16, float32 or float64, not int32"),
    (lambda: _ops.dequantize_accumulate(np.zeros(4, np.float32), np.zeros(4, np.uint8), 0.0,
                                        1.0, 7, F32, U8, 1),
     "unknown reduce op 7; expected one of SUM, AVG, PROD, MAX, MIN"),
    (lambda: _ops.reduce_into(np.zeros(4, np.float32), np.zeros(4, np.float32), SUM, 12),
     "unknown dtype 12"),
    (lambda: _ops.quantize(np.zeros(2, np.uint8), np.zeros(4, np.float32), F32, 12, 2),
     "uint4 quantization supports MIN_MAX only, not ZERO_POINT_SCALE"),
    (lambda: _ops.quantize(np.zeros(3, np.uint8), np.zeros(4, np.float32), F32, 12, MIN_MAX),
     "length mismatch: dst_q has 3 bytes, 4 codes need 2"),
    (lambda: _ops.dequantize(np.zeros(5, np.float32), np.zeros(2, np.uint8), 0.0, 1.0, F32, 12,
                             MIN_MAX),
     "length mismatch: src_q has 2 bytes, 5 elements need 3"),
    (lambda: _ops.dequantize(np.zeros(4, np.float32), np.zeros(2, np.uint8), 0.0, 1.0, F32, 12,
                             2),
     "uint4 quantization supports MIN_MAX only"),
])
def test_ops_errors_name_dtypes_and_ops(call: Any, message: str) -> None:
    with pytest.raises(InvalidUsageError) as err:
        call()
    assert message in str(err.value)


def test_tables_derive_from_the_dtype_table() -> None:
    assert {int(dt): dt.itemsize for dt in TENSOR_DTYPES} == _ops._ITEMSIZE
    assert {d: np.dtype(t).itemsize for d, t in ref.NP_DTYPES.items()} == _ops._ITEMSIZE
    assert ref.NP_DTYPES[BF16] is np.uint16 and ref.NP_DTYPES[F32] is np.float32


# ---- large jobs split over two threads -----------------------------------------------------


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
    for qd in (U8, U4):  # uint4: the cut (64 elements apart) falls on a whole byte of codes
        q = np.empty(n if qd == U8 else (n + 1) // 2, np.uint8)
        meta = _ops.quantize(q, b, dtype, qd, MIN_MAX)
        got, want = a.copy(), a.copy()
        _ops.dequantize_accumulate(got, q, *meta, 0, dtype, qd, MIN_MAX)
        impl.dequantize_accumulate(memoryview(want).cast("B"), memoryview(q).cast("B"), *meta,
                                   0, dtype, qd, MIN_MAX)
        assert got.tobytes() == want.tobytes()
        _ops.dequantize(got, q, *meta, dtype, qd, MIN_MAX)
        impl.dequantize(memoryview(want).cast("B"), memoryview(q).cast("B"), *meta, dtype, qd,
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
