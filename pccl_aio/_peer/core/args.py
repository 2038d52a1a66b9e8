"""Argument checks of the public peer API, sans-IO: each returns the normalised value or
raises ``InvalidUsageError`` (before anything is sent)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._errors import InvalidUsageError
from ..._types import DataType, QuantAlgo, Quantization, ReduceOp
from .buffers import Buffer, as_buffer

_U64 = 2**64


def buffers(src: Any, dst: Any) -> tuple[Buffer, Buffer, bool]:
    """(src, dst, in place) of an all-reduce; InvalidUsageError for mismatched or partly
    overlapping buffers."""
    if dst is None or dst is src:
        s = as_buffer(src, writable=True, what="src")
        return s, s, True
    s = as_buffer(src, writable=False, what="src")
    d = as_buffer(dst, writable=True, what="dst")
    if s.dtype != d.dtype or s.count != d.count:
        raise InvalidUsageError(
            f"src ({s.count} x {s.dtype.label}) and dst ({d.count} x {d.dtype.label}) differ")
    if s.overlaps(d):
        if s.address != d.address:
            raise InvalidUsageError("src and dst overlap partially")
        return s, d, True
    return s, d, False


#: The reduce-op check, shared with the kernels' front (``_compute/ops.py``).
op = ReduceOp.parse


def quantization(q: Any, dtype: DataType) -> Quantization | None:
    if q is None:
        return None
    if not isinstance(q, Quantization):
        raise InvalidUsageError(f"quantization must be a Quantization, not {type(q).__name__}")
    if q.algo == QuantAlgo.NONE:
        return None
    if not dtype.is_float:
        raise InvalidUsageError(f"quantization needs a float16/bfloat16/float32/float64 "
                                f"tensor, not {dtype.label}")
    return q


def tag(tag: Any) -> int:
    if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag < _U64:
        raise InvalidUsageError(f"tag must be an int in [0, 2**64), not {tag!r}")
    return tag


def positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidUsageError(f"{name} must be a positive int, not {value!r}")
    return value


def multi(tensors: Sequence[Any], first_tag: Any, quant: Any, restore: Any
          ) -> tuple[list[Buffer], list[int], dict[int, Quantization | None]]:
    """``all_reduce_multiple_with_retry``'s tensors as in-place buffers, their tags
    (``first_tag + i``) and each tag's quantization."""
    if not isinstance(restore, bool):
        raise InvalidUsageError(f"restore_on_abort must be True or False, not {restore!r}")
    if not tensors:
        raise InvalidUsageError("no tensors given")
    bufs = [buffers(t, None)[0] for t in tensors]
    tags = [tag(first_tag + i) for i in range(len(bufs))]
    return bufs, tags, {t: quantization(quant, b.dtype) for t, b in zip(tags, bufs)}


def gathered(src: Any, dst: Any, world: int, rank: int) -> tuple[Buffer, Buffer, bool]:
    """(src, dst, copy_own) of an all-gather into ``dst`` of ``world`` x ``src``'s count;
    ``src`` may be exactly this rank's slot of ``dst`` (then nothing is copied)."""
    s = as_buffer(src, writable=False, what="src")
    d = as_buffer(dst, writable=True, what="dst")
    _same_dtype(s, d)
    if d.count != world * s.count:
        raise InvalidUsageError(f"dst holds {d.count} elements; an all-gather of {s.count} "
                                f"per rank in a group of {world} needs {world * s.count}")
    if s.overlaps(d):
        if s.address != d.address + rank * s.view.nbytes:
            raise InvalidUsageError(f"src overlaps dst but is not its slot of rank {rank}")
        return s, d, False
    return s, d, True


def scattered(src: Any, dst: Any, world: int) -> tuple[Buffer, Buffer]:
    """(src, dst) of a reduce-scatter of ``world`` x ``dst``'s count from ``src``."""
    s = as_buffer(src, writable=False, what="src")
    d = as_buffer(dst, writable=True, what="dst")
    _same_dtype(s, d)
    if s.count != world * d.count:
        raise InvalidUsageError(f"src holds {s.count} elements; a reduce-scatter of "
                                f"{d.count} per rank in a group of {world} needs "
                                f"{world * d.count}")
    if s.overlaps(d):
        raise InvalidUsageError("src and dst of a reduce-scatter overlap")
    return s, d


def root(value: Any, world: int) -> int:
    """A broadcast's root rank, in [0, ``world``)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < world:
        raise InvalidUsageError(f"root must be a rank in [0, {world}), not {value!r}")
    return value


def _same_dtype(s: Buffer, d: Buffer) -> None:
    if s.dtype != d.dtype:
        raise InvalidUsageError(f"src ({s.dtype.label}) and dst ({d.dtype.label}) differ")
