"""Enums with stable wire values, the one dtype table, and the result records of the API."""

from __future__ import annotations

import dataclasses
import enum
import operator
import sys
from typing import SupportsIndex, TypeVar, cast

import msgspec

from ._errors import InvalidUsageError

__all__ = [
    "DTYPE_ITEMSIZE",
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "MIN_MAX_ONLY",
    "NUMPY_STORAGE",
    "QUANTIZED_DTYPES",
    "QUANT_BITS",
    "TENSOR_DTYPES",
    "DataType",
    "QuantAlgo",
    "Quantization",
    "ReduceInfo",
    "ReduceOp",
    "SyncInfo",
    "SyncStrategy",
    "TopologyInfo",
    "TransferInfo",
]


def as_index(value: object) -> int | None:
    """``value`` as an int (int, IntEnum, numpy integer; not bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(cast("SupportsIndex", value))
    except TypeError:
        return None


_E = TypeVar("_E", bound=enum.IntEnum)


def _member(cls: type[_E], table: dict[int, _E], value: object) -> _E | None:
    """The member of ``cls`` for a member or an integer value, else None (runs per segment)."""
    if type(value) is int or type(value) is cls:  # a member hashes as its value
        return table.get(value)  # type: ignore[call-overload]
    if isinstance(value, enum.Enum):  # another enum's member: DataType.UINT16 is no algorithm
        return None
    i = as_index(value)
    return None if i is None else table.get(i)


class DataType(enum.IntEnum):
    """Element types of collectives and shared state (wire values are stable).

    ``UINT4`` is a quantization code only (``Quantization(dtype="uint4")``, two codes per
    byte): no tensor, shared-state entry or all-reduce has that dtype, and ``parse`` refuses it.
    """

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
    UINT4 = 12

    @property
    def itemsize(self) -> int:
        """Bytes per element; InvalidUsageError for UINT4 (two codes share a byte)."""
        size = DTYPE_ITEMSIZE.get(self)
        if size is None:
            raise InvalidUsageError(f"{self.label} has no itemsize: two codes share a byte")
        return size

    @property
    def is_float(self) -> bool:
        """A floating-point type (what quantization and AVG apply to)."""
        return self in FLOAT_DTYPES

    @property
    def label(self) -> str:
        """The name numpy and torch use and messages show: ``"bfloat16"``."""
        return DTYPE_NAMES.get(self) or self.name.lower()

    @classmethod
    def parse(cls, value: object) -> DataType:
        """Accept a tensor DataType, a name (``"bfloat16"``, ``"float"``...), a torch dtype,
        or a numpy dtype (not bfloat16); InvalidUsageError naming the value otherwise (and
        for UINT4, a quantization code only)."""
        if isinstance(value, DataType) and value in DTYPE_ITEMSIZE:
            return value
        found = None
        if value is DataType.UINT4 or (isinstance(value, str)
                                       and value.strip().lower() == "uint4"):
            raise InvalidUsageError("uint4 is a quantization dtype only "
                                    "(Quantization(algo=QuantAlgo.MIN_MAX, dtype='uint4'))")
        if isinstance(value, str):
            found = _BY_NAME.get(value.strip().lower())
        else:
            torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
            if torch is not None and isinstance(value, torch.dtype):
                found = _BY_NAME.get(str(value).removeprefix("torch."))
            elif np is not None and value is not None:  # (np.dtype(None) is float64)
                try:  # a numpy dtype or scalar type: numpy is loaded already
                    found = _BY_NAME.get(np.dtype(value).name)
                except TypeError:
                    pass
        if found is None:
            raise InvalidUsageError(f"unsupported dtype {value!r}; supported: "
                                    f"{', '.join(DTYPE_NAMES.values())}")
        return found


# The one dtype table: item size, float or not, and the numpy type holding the elements
# (numpy has no bfloat16: its elements are raw uint16 words there).
_TABLE: dict[DataType, tuple[int, bool, str]] = {
    DataType.UINT8: (1, False, "uint8"), DataType.INT8: (1, False, "int8"),
    DataType.UINT16: (2, False, "uint16"), DataType.INT16: (2, False, "int16"),
    DataType.UINT32: (4, False, "uint32"), DataType.INT32: (4, False, "int32"),
    DataType.UINT64: (8, False, "uint64"), DataType.INT64: (8, False, "int64"),
    DataType.FLOAT16: (2, True, "float16"), DataType.BFLOAT16: (2, True, "uint16"),
    DataType.FLOAT32: (4, True, "float32"), DataType.FLOAT64: (8, True, "float64"),
}
DTYPE_ITEMSIZE: dict[DataType, int] = {dt: row[0] for dt, row in _TABLE.items()}
FLOAT_DTYPES: frozenset[DataType] = frozenset(dt for dt, row in _TABLE.items() if row[1])
#: Lower-case names, as numpy and torch spell them.
DTYPE_NAMES: dict[DataType, str] = {dt: dt.name.lower() for dt in _TABLE}
NUMPY_STORAGE: dict[DataType, str] = {dt: row[2] for dt, row in _TABLE.items()}
#: Element types of tensors, shared state and all-reduce (every DataType but UINT4).
TENSOR_DTYPES: tuple[DataType, ...] = tuple(_TABLE)
#: Codes of a quantized all-reduce, with their width in bits. uint4 codes are packed two
#: per byte: element 2i in the low nibble, 2i+1 in the high one (0 after an odd last one).
QUANT_BITS: dict[DataType, int] = {DataType.UINT8: 8, DataType.UINT16: 16, DataType.UINT4: 4}
QUANTIZED_DTYPES: tuple[DataType, ...] = tuple(QUANT_BITS)
#: The quantized dtypes that support only MIN_MAX.
MIN_MAX_ONLY: frozenset[DataType] = frozenset({DataType.UINT4})

_ALIASES = {"float": DataType.FLOAT32, "double": DataType.FLOAT64, "half": DataType.FLOAT16,
            "bf16": DataType.BFLOAT16, "f32": DataType.FLOAT32, "f64": DataType.FLOAT64,
            "f16": DataType.FLOAT16}
_BY_NAME: dict[str, DataType] = {**{n: dt for dt, n in DTYPE_NAMES.items()}, **_ALIASES}


class CollectiveKind(enum.IntEnum):
    """What a collective does (its descriptor names it): the peers of a group must agree."""

    ALL_REDUCE = 0
    BARRIER = 1
    BROADCAST = 2
    ALL_GATHER = 3
    REDUCE_SCATTER = 4

    @property
    def label(self) -> str:
        """Its name in messages: ``all-reduce``, ``barrier``, ``broadcast``, ``all-gather``,
        ``reduce-scatter``."""
        return self.name.lower().replace("_", "-")

    @property
    def ranked(self) -> bool:
        """It is defined by the group it was launched in (a root, rank-ordered chunks, every
        member arriving): it runs only in that ring. An all-reduce runs in any."""
        return self != CollectiveKind.ALL_REDUCE


class ReduceOp(enum.IntEnum):
    """Reduction operators; AVG is SUM followed by a division by the world size."""

    SUM = 0
    AVG = 1
    PROD = 2
    MAX = 3
    MIN = 4

    @classmethod
    def parse(cls, value: object) -> ReduceOp:
        """``value`` (a ReduceOp or its int value) as a ReduceOp, else InvalidUsageError."""
        found = _member(cls, _OPS, value)
        if found is None:
            raise InvalidUsageError(
                f"unknown reduce op {value!r}; expected one of {', '.join(_OPS_BY_NAME)}")
        return found


_OPS: dict[int, ReduceOp] = {int(op): op for op in ReduceOp}
_OPS_BY_NAME = [op.name for op in ReduceOp]


class QuantAlgo(enum.IntEnum):
    """Quantization algorithms for all-reduce payloads."""

    NONE = 0
    MIN_MAX = 1
    ZERO_POINT_SCALE = 2

    @classmethod
    def parse(cls, value: object) -> QuantAlgo:
        """``value`` (a QuantAlgo or its int value) as a QuantAlgo, else InvalidUsageError."""
        found = _member(cls, _ALGOS, value)
        if found is None:
            raise InvalidUsageError(f"unknown quantization algorithm {value!r}; expected one "
                                    f"of {', '.join(a.name for a in QuantAlgo)}")
        return found


_ALGOS: dict[int, QuantAlgo] = {int(a): a for a in QuantAlgo}


class SyncStrategy(enum.IntEnum):
    """How a peer takes part in shared-state synchronisation."""

    ENFORCE_POPULAR = 0
    RECEIVE_ONLY = 1
    SEND_ONLY = 2


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Quantization:
    """Quantization of an all-reduce, keyword arguments only:
    ``Quantization(algo=QuantAlgo.MIN_MAX, dtype="uint8")`` (dtype "uint8", "uint16" or,
    with MIN_MAX only, "uint4": 15 levels, codes packed two per byte)."""

    algo: QuantAlgo
    dtype: DataType

    def __new__(cls, *args: object, **kwargs: object) -> Quantization:
        if args:  # Quantization(DataType.UINT16) once meant algo=2: never guess
            raise InvalidUsageError(
                f"Quantization takes keyword arguments only, not {args!r}: "
                "Quantization(algo=QuantAlgo.MIN_MAX, dtype='uint8')")
        return object.__new__(cls)

    def __init__(self, *, algo: QuantAlgo = QuantAlgo.MIN_MAX,
                 dtype: DataType | str = DataType.UINT8) -> None:
        four = dtype is DataType.UINT4 or (isinstance(dtype, str)
                                           and dtype.strip().lower() == "uint4")
        qd = DataType.UINT4 if four else DataType.parse(dtype)
        if qd not in QUANTIZED_DTYPES:
            raise InvalidUsageError(
                f"quantized dtype must be uint8, uint16 or uint4, not {qd.label}")
        a = QuantAlgo.parse(algo)
        if qd in MIN_MAX_ONLY and a not in (QuantAlgo.NONE, QuantAlgo.MIN_MAX):
            raise InvalidUsageError(f"{qd.label} quantization supports MIN_MAX only, not {a.name}")
        object.__setattr__(self, "algo", a)
        object.__setattr__(self, "dtype", qd)


class ReduceInfo(msgspec.Struct, frozen=True):
    """What one collective (all-reduce, broadcast, all-gather, reduce-scatter, barrier) did:
    the peer-group world size it ran with and the payload bytes this peer sent and received."""

    world_size: int
    tx_bytes: int
    rx_bytes: int


class TransferInfo(msgspec.Struct, frozen=True):
    """What one point-to-point ``send`` or ``recv`` did: the other peer's id (for a receive
    from any peer, the one that sent), the tag, and the payload bytes moved."""

    peer: int
    tag: int
    nbytes: int


class SyncInfo(msgspec.Struct, frozen=True):
    """What one shared-state sync moved, and the revision the state holds afterwards."""

    tx_bytes: int
    rx_bytes: int
    revision: int


class TopologyInfo(msgspec.Struct, frozen=True):
    """What one ``optimize_topology()`` did: the group's new ``ring`` (peer ids, in order),
    how many ordered peer pairs were ``measured`` for it (pairs measured before are kept), and
    the measured bandwidth of the ring's slowest link in bits/s (0 for a ring of one)."""

    ring: tuple[int, ...]
    measured: int
    bottleneck_bps: float
