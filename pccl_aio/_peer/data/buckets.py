"""``Buckets``: all-reduce many tensors (gradients, pseudo-gradients) through a few flat
reusable buffers, like DDP's gradient buckets.

Tensors are grouped by dtype, in order, into buckets of at most ``bucket_cap_mb`` MiB (a
larger tensor gets a bucket of its own); the flat buffers are allocated once and reused by
every call. A call copies the tensors in, all-reduces every bucket concurrently
(``all_reduce_multiple_with_retry``: a bucket aborted by a lost peer is retried on the
survivors) and copies the results back; if it raises, the tensors are left as they were.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Self

from ..._errors import InvalidUsageError
from ..._types import Quantization, ReduceInfo, ReduceOp
from ..core import staging

__all__ = ["Buckets"]


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch")


class Buckets:
    """Flat buffers for ``tensors`` (torch tensors or numpy arrays, all of one kind;
    contiguous or not). The flat buffers are host memory: CUDA tensors are copied into them
    and back (pinned buffers), so they are the staging. ``bucket_cap_mb`` bounds a bucket's
    size (DDP's default: 25). The results are bit-identical on every peer; with three or more
    peers a float sum may differ from per-tensor all-reduces in the last bits (the ring adds
    in another order)."""

    def __init__(self, tensors: Sequence[Any], bucket_cap_mb: float = 25.0) -> None:
        tensors = list(tensors)
        if not tensors:
            raise InvalidUsageError("Buckets needs at least one tensor")
        if not bucket_cap_mb > 0:
            raise InvalidUsageError(f"bucket_cap_mb must be positive, not {bucket_cap_mb!r}")
        kinds = {_is_torch(t) for t in tensors}
        if len(kinds) != 1:
            raise InvalidUsageError("Buckets takes torch tensors or numpy arrays, not a mix")
        self.torch = kinds.pop()
        self.tensors = tensors
        self.pinned = False
        cap = int(bucket_cap_mb * (1 << 20))
        # (dtype key, [(tensor index, offset, numel)]) per bucket, in order of first tensor
        plans: list[tuple[Any, list[tuple[int, int, int]], int]] = []
        open_by_dtype: dict[Any, int] = {}
        for i, t in enumerate(tensors):
            if self.torch:
                if staging.needs(t) and staging.pinnable(t):  # (another device: refused)
                    self.pinned = True  # the flat buffers stage them: pinned host memory
                n, size = t.numel(), t.element_size()
            else:
                n, size = t.size, t.itemsize
            dtype = t.dtype
            b = open_by_dtype.get(dtype)
            if b is None or (plans[b][2] + n) * size > cap:
                open_by_dtype[dtype] = b = len(plans)
                plans.append((dtype, [], 0))
            dt, items, used = plans[b]
            items.append((i, used, n))
            plans[b] = (dt, items, used + n)
        self.layout = [items for _, items, _ in plans]
        self.flat = [self._empty(dt, used) for dt, _, used in plans]
        self._params: list[Any] | None = None  # grads_of: the tensors are their .grad

    @classmethod
    def grads_of(cls, parameters: Any, bucket_cap_mb: float = 25.0) -> Self:
        """Buckets for the gradients of ``parameters`` (a ``torch.nn.Module`` or an iterable
        of parameters; those with ``requires_grad``). Each call reads every ``p.grad`` afresh,
        so ``zero_grad(set_to_none=True)`` is fine; a missing gradient (a parameter unused this
        step) is all-reduced as zeros and left as such in ``p.grad``."""
        import torch

        if isinstance(parameters, torch.nn.Module):
            parameters = parameters.parameters()
        params = [p for p in parameters if p.requires_grad]
        buckets = cls(params, bucket_cap_mb)
        buckets._params = params
        return buckets

    def _grads(self) -> None:
        if self._params is not None:
            for p in self._params:
                if p.grad is None:
                    p.grad = p.detach().new_zeros(p.shape)
            self.tensors = [p.grad for p in self._params]

    def _empty(self, dtype: Any, n: int) -> Any:
        if self.torch:
            import torch

            return torch.empty(n, dtype=dtype, pin_memory=self.pinned)
        import numpy as np

        return np.empty(n, dtype=dtype)

    def _pack(self) -> None:
        for flat, items in zip(self.flat, self.layout):
            for i, off, n in items:
                t = self.tensors[i]
                if self.torch:
                    flat[off:off + n].copy_(t.detach().reshape(-1))
                else:
                    flat[off:off + n] = t.reshape(-1)

    def _unpack(self) -> None:
        for flat, items in zip(self.flat, self.layout):
            for i, off, n in items:
                t = self.tensors[i]
                if self.torch:
                    t.detach().copy_(flat[off:off + n].view(t.shape))
                else:
                    t[...] = flat[off:off + n].reshape(t.shape)

    async def all_reduce(self, comm: Any, *, op: ReduceOp = ReduceOp.SUM, first_tag: int = 0,
                         max_in_flight: int = 8, quantization: Quantization | None = None,
                         timeout: float | None = None) -> list[ReduceInfo]:
        """All-reduce every tensor through the buckets on ``comm`` (a ``Communicator``);
        tags ``first_tag`` .. ``first_tag + len(flat) - 1``. Blocks until every bucket is
        done; raises as ``all_reduce_multiple_with_retry`` (the tensors then unchanged).
        Cancelling aborts the buckets in flight for the group."""
        self._grads()
        self._pack()
        infos: list[ReduceInfo] = await comm.all_reduce_multiple_with_retry(
            self.flat, op=op, first_tag=first_tag, max_in_flight=max_in_flight,
            quantization=quantization, timeout=timeout)
        self._unpack()
        return infos

    def all_reduce_blocking(self, comm: Any, *, op: ReduceOp = ReduceOp.SUM,
                            first_tag: int = 0, max_in_flight: int = 8,
                            quantization: Quantization | None = None,
                            timeout: float | None = None) -> list[ReduceInfo]:
        """Deprecated: use ``pccl_aio.blocking.Buckets``, whose ``all_reduce(comm)`` blocks
        (the same name in both APIs). Kept so that existing code runs; it warns
        (``DeprecationWarning``) and does what that ``all_reduce`` does."""
        warnings.warn("Buckets.all_reduce_blocking(comm) is deprecated: use "
                      "pccl_aio.blocking.Buckets and its all_reduce(comm)", DeprecationWarning,
                      stacklevel=2)
        return self._reduce_blocking(comm, op, first_tag, max_in_flight, quantization, timeout)

    def _reduce_blocking(self, comm: Any, op: ReduceOp, first_tag: int, max_in_flight: int,
                         quantization: Quantization | None,
                         timeout: float | None) -> list[ReduceInfo]:
        """``all_reduce`` on a ``pccl_aio.blocking.Communicator``, blocking this thread."""
        self._grads()
        self._pack()
        infos: list[ReduceInfo] = comm.all_reduce_multiple_with_retry(
            self.flat, op=op, first_tag=first_tag, max_in_flight=max_in_flight,
            quantization=quantization, timeout=timeout)
        self._unpack()
        return infos
