"""Enums with stable wire values and the result records of the public API."""

from __future__ import annotations

import dataclasses
import enum

import msgspec

__all__ = [
    "DTYPE_ITEMSIZE",
    "DataType",
    "QuantAlgo",
    "Quantization",
    "ReduceInfo",
    "ReduceOp",
    "SyncInfo",
    "SyncStrategy",
]


class DataType(enum.IntEnum):
    """Element types of collectives and shared state (wire values are stable)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    UINT64 = 6
    INT64 = 7
    FLOAT16 = 8
    BFLOAT16 = 9
    FLOAT32 = 10
    FLOAT64 = 11

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self >= DataType.FLOAT16

    @classmethod
    def parse(cls, value: object) -> DataType:
        """Accept a DataType, its name (``"bfloat16"``) or a numpy dtype (not bfloat16)."""
        from ._errors import InvalidUsageError

        if isinstance(value, DataType):
            return value
        if isinstance(value, str):
            key = value.strip().upper()
            aliases = {"FLOAT": "FLOAT32", "DOUBLE": "FLOAT64", "HALF": "FLOAT16",
                       "BF16": "BFLOAT16", "F32": "FLOAT32", "F64": "FLOAT64", "F16": "FLOAT16"}
            key = aliases.get(key, key)
            if key in cls.__members__:
                return cls[key]
        try:
            import numpy as np

            name = np.dtype(value).name.upper()  # type: ignore[call-overload]
            if name in cls.__members__:
                return cls[name]
        except TypeError:
            pass
        raise InvalidUsageError(f"unsupported dtype {value!r}")


DTYPE_ITEMSIZE: dict[DataType, int] = {
    DataType.UINT8: 1, DataType.INT8: 1, DataType.UINT16: 2, DataType.INT16: 2,
    DataType.UINT32: 4, DataType.INT32: 4, DataType.UINT64: 8, DataType.INT64: 8,
    DataType.FLOAT16: 2, DataType.BFLOAT16: 2, DataType.FLOAT32: 4, DataType.FLOAT64: 8,
}


class ReduceOp(enum.IntEnum):
    """Reduction operators; AVG is SUM followed by a division by the world size."""

    SUM = 0
    AVG = 1
    PROD = 2
    MAX = 3
    MIN = 4


class QuantAlgo(enum.IntEnum):
    """Quantization algorithms for all-reduce payloads."""

    NONE = 0
    MIN_MAX = 1
    ZERO_POINT_SCALE = 2


class SyncStrategy(enum.IntEnum):
    """How a peer takes part in shared-state synchronisation."""

    ENFORCE_POPULAR = 0
    RECEIVE_ONLY = 1
    SEND_ONLY = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Quantization:
    """Quantization of an all-reduce: algorithm and quantized dtype ("uint8" or "uint16")."""

    algo: QuantAlgo = QuantAlgo.MIN_MAX
    dtype: DataType | str = DataType.UINT8

    def __post_init__(self) -> None:
        from ._errors import InvalidUsageError

        object.__setattr__(self, "algo", QuantAlgo(self.algo))
        qd = DataType.parse(self.dtype)
        if qd not in (DataType.UINT8, DataType.UINT16):
            raise InvalidUsageError(f"quantized dtype must be uint8 or uint16, not {self.dtype!r}")
        object.__setattr__(self, "dtype", qd)


class ReduceInfo(msgspec.Struct, frozen=True):
    """What one all-reduce did: the peer-group world size it ran with and payload bytes moved."""

    world_size: int
    tx_bytes: int
    rx_bytes: int


class SyncInfo(msgspec.Struct, frozen=True):
    """What one shared-state sync moved, and the revision the state holds afterwards."""

    tx_bytes: int
    rx_bytes: int
    revision: int
