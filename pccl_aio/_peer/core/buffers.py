"""Turn user tensors (numpy arrays, torch CPU tensors, buffer objects) into byte views.

The data plane works on flat ``memoryview``s of bytes plus a ``DataType``; bfloat16 torch
tensors are viewed as raw 16-bit words because numpy has no bfloat16.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np

from ..._errors import InvalidUsageError
from ..._types import DataType

_NP_TO_DT: dict[str, DataType] = {
    "uint8": DataType.UINT8, "int8": DataType.INT8, "uint16": DataType.UINT16,
    "int16": DataType.INT16, "uint32": DataType.UINT32, "int32": DataType.INT32,
    "uint64": DataType.UINT64, "int64": DataType.INT64, "float16": DataType.FLOAT16,
    "float32": DataType.FLOAT32, "float64": DataType.FLOAT64,
}
_DT_TO_NP: dict[DataType, str] = {v: k for k, v in _NP_TO_DT.items()}
_DT_TO_NP[DataType.BFLOAT16] = "uint16"


@dataclasses.dataclass(frozen=True, slots=True)
class Buffer:
    """A contiguous tensor seen as bytes: ``view`` (format 'B'), element type and count."""

    view: memoryview
    dtype: DataType
    count: int
    owner: Any

    def numpy(self) -> np.ndarray[Any, Any]:
        """The same memory as a numpy array (bfloat16 as uint16)."""
        return np.frombuffer(self.view, dtype=_DT_TO_NP[self.dtype])


def _torch_view(t: Any) -> tuple[np.ndarray[Any, Any], DataType]:
    torch = sys.modules["torch"]
    if t.device.type != "cpu":
        raise InvalidUsageError(f"tensor on device {t.device} is not supported; move it to the CPU")
    if not t.is_contiguous():
        raise InvalidUsageError("tensor is not contiguous")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), DataType.BFLOAT16
    arr = t.numpy()
    return arr, _numpy_dtype(arr)


def _numpy_dtype(arr: np.ndarray[Any, Any]) -> DataType:
    try:
        return _NP_TO_DT[arr.dtype.name]
    except KeyError:
        raise InvalidUsageError(f"unsupported dtype {arr.dtype}") from None


def as_buffer(x: Any, *, writable: bool, dtype: DataType | None = None, what: str = "tensor") -> Buffer:
    """View ``x`` as bytes; raises InvalidUsageError for bad dtype, layout or a read-only target.

    ``dtype`` overrides the element type of a raw buffer (bytearray, memoryview).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        arr, dt = _torch_view(x)
    elif isinstance(x, np.ndarray):
        arr = x
        if not arr.flags.c_contiguous:
            raise InvalidUsageError(f"{what} is not C-contiguous")
        dt = _numpy_dtype(arr)
    else:
        try:
            mv = memoryview(x)
        except TypeError:
            raise InvalidUsageError(f"{what} of type {type(x).__name__} is not a tensor") from None
        if not mv.c_contiguous:
            raise InvalidUsageError(f"{what} is not C-contiguous")
        arr = np.frombuffer(mv, dtype=np.uint8) if mv.readonly else np.asarray(mv.cast("B"))
        dt = DataType.UINT8
    if dtype is not None:
        dt = DataType.parse(dtype)
    view = arr.data.cast("B") if arr.size else memoryview(bytearray(0))
    if arr.size and not arr.flags.writeable and writable:
        raise InvalidUsageError(f"{what} is read-only")
    if view.nbytes % dt.itemsize:
        raise InvalidUsageError(f"{what} of {view.nbytes} bytes is not a whole number of {dt.name}")
    return Buffer(view, dt, view.nbytes // dt.itemsize, x)
