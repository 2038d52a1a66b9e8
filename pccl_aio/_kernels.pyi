"""Type stub of the Cython kernels (``_kernels.pyx``); the contract is in ``_kernels_py``.

Buffers are 1-D C-contiguous byte buffers (``memoryview(x).cast("B")``, bytearray, uint8
arrays); the kernels do not check lengths, dtypes or ops (``_ops`` does).
"""

from typing_extensions import Buffer

def reduce_into(dst: Buffer, src: Buffer, op: int, dtype: int) -> None: ...
def divide(dst: Buffer, divisor: int, dtype: int) -> None: ...
def minmax(src: Buffer, dtype: int) -> tuple[float, float]: ...
def quantize(
    dst_q: Buffer, src: Buffer, src_dtype: int, q_dtype: int, algo: int
) -> tuple[float, float]: ...
def dequantize(
    dst: Buffer, src_q: Buffer, p0: float, p1: float, dst_dtype: int, q_dtype: int, algo: int
) -> None: ...
def dequantize_accumulate(
    dst: Buffer,
    src_q: Buffer,
    p0: float,
    p1: float,
    op: int,
    dst_dtype: int,
    q_dtype: int,
    algo: int,
) -> None: ...
def _set_simd(level: int) -> int: ...
def _f32_to_f16(dst: Buffer, src: Buffer) -> None: ...
def _f16_to_f32(dst: Buffer, src: Buffer) -> None: ...
