"""Turn user tensors (torch CPU tensors, numpy arrays, buffer objects) into byte views.

The data plane works on flat ``memoryview``s of bytes plus a ``DataType``. A torch tensor is
viewed through its memory (``data_ptr()``; bfloat16 as raw 16-bit words), so torch users
need no numpy; numpy is imported only by :meth:`Buffer.numpy`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from ..._errors import InvalidUsageError
from ..._types import DTYPE_NAMES, NUMPY_STORAGE, DataType

if TYPE_CHECKING:
    import numpy as np

_BY_NAME: dict[str, DataType] = {name: dt for dt, name in DTYPE_NAMES.items()}
_SUPPORTED = ", ".join(DTYPE_NAMES.values())


@dataclasses.dataclass(frozen=True, slots=True)
class Buffer:
    """A contiguous tensor seen as bytes: ``view`` (format 'B'), element type and count,
    the object whose memory it is (kept alive here) and the address of its first byte."""

    view: memoryview
    dtype: DataType
    count: int
    owner: Any
    address: int

    def numpy(self) -> np.ndarray[Any, Any]:
        """The same memory as a numpy array (bfloat16 as uint16); imports numpy."""
        import numpy as np

        return np.frombuffer(self.view, dtype=NUMPY_STORAGE[self.dtype])

    def overlaps(self, other: Buffer) -> bool:
        """Whether the two byte ranges share a byte."""
        a, b = self.view.nbytes, other.view.nbytes
        return bool(a and b and self.address < other.address + b
                    and other.address < self.address + a)


def _dtype(name: str, what: str) -> DataType:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidUsageError(
            f"{what} has unsupported dtype {name}; supported: {_SUPPORTED}") from None


def _torch_view(t: Any, what: str) -> tuple[memoryview, DataType, int]:
    """(bytes, dtype, address) of a torch CPU tensor, without numpy."""
    dt = _dtype(str(t.dtype).removeprefix("torch."), what)
    if t.device.type != "cpu":
        raise InvalidUsageError(f"{what} on device {t.device} is not supported; move it to the CPU")
    if t.layout is not sys.modules["torch"].strided or not t.is_contiguous():
        raise InvalidUsageError(f"{what} is not contiguous")
    if t.is_neg():
        raise InvalidUsageError(f"{what} is a lazily negated view; call .resolve_neg() first")
    nbytes, address = t.numel() * t.element_size(), t.data_ptr()
    if not nbytes:
        return memoryview(bytearray(0)), dt, address
    raw = (ctypes.c_ubyte * nbytes).from_address(address)
    raw._tensor = t  # type: ignore[attr-defined]  # the view keeps the tensor alive
    return memoryview(raw).cast("B"), dt, address


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def _address(view: memoryview) -> int:
    """Address of the first byte of a contiguous buffer (read-only ones too)."""
    info = _PyBuffer()
    _get_buffer(view, ctypes.byref(info), 0)  # PyBUF_SIMPLE; raises if it fails
    try:
        return info.buf or 0
    finally:
        _release_buffer(ctypes.byref(info))


def as_buffer(x: Any, *, writable: bool, dtype: DataType | None = None,
              what: str = "tensor") -> Buffer:
    """View ``x`` as bytes; raises InvalidUsageError for bad dtype, layout or a read-only target.

    ``dtype`` overrides the element type of a raw buffer (bytearray, memoryview).
    """
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(x, torch.Tensor):
        view, dt, address = _torch_view(x, what)
    else:
        if np is not None and isinstance(x, np.ndarray):
            dt = _dtype(x.dtype.name, what)
            if not x.dtype.isnative:
                raise InvalidUsageError(f"{what} is not in native byte order")
        else:
            dt = DataType.UINT8
        try:
            mv = memoryview(x)
        except TypeError:
            raise InvalidUsageError(f"{what} of type {type(x).__name__} is not a tensor") from None
        if not mv.c_contiguous:
            raise InvalidUsageError(f"{what} is not C-contiguous")
        view = mv.cast("B") if mv.nbytes else memoryview(bytearray(0))
        address = _address(view) if mv.nbytes else 0
    if dtype is not None:
        dt = DataType.parse(dtype)
    if writable and view.readonly:
        raise InvalidUsageError(f"{what} is read-only")
    if view.nbytes % dt.itemsize:
        raise InvalidUsageError(
            f"{what} of {view.nbytes} bytes is not a whole number of {dt.label}")
    return Buffer(view, dt, view.nbytes // dt.itemsize, x, address)
