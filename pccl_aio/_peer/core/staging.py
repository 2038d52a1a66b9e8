"""Device tensors (CUDA) staged through reusable host buffers, device-agnostic (sans-IO).

A collective works on host memory. ``stage(x, pool, load)`` gives a torch tensor on another
device a host twin from ``pool`` (pinned where the device can use pinned memory), filled with
``x``'s bytes when ``load``; ``Staged.store()`` writes the twin's bytes back into ``x`` once the
collective succeeded, so a failed in-place collective leaves ``x`` untouched without any
backup; ``release()`` returns the twin. Copies are issued on a side stream where the device
has streams and waited for before the collective starts or the call returns. Only the devices
in ``DEVICES`` are staged; another non-CPU device is an ``InvalidUsageError``. Nothing here
touches torch unless a tensor is on such a device (``needs``).
"""

from __future__ import annotations

import sys
from typing import Any

from ..._errors import InvalidUsageError

__all__ = ["DEVICES", "HostPool", "Staged", "Stages", "needs", "pinnable", "stage", "twin"]

#: Device types staged through host memory (a test adds "cpu" to run the path without a GPU).
DEVICES = frozenset({"cuda"})


def needs(x: Any) -> bool:
    """``x`` is a torch tensor on a device this stages; ``InvalidUsageError`` for another
    device that is not the CPU."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return False
    if x.device.type in DEVICES:
        return True
    if x.device.type != "cpu":
        raise InvalidUsageError(f"a tensor on {x.device}: pccl_aio takes CPU tensors and "
                                f"stages {', '.join(sorted(DEVICES))} ones through host memory")
    return False


def twin(x: Any) -> Any:
    """A host tensor of ``x``'s dtype and shape (pinned where the device can use it), kept
    by its owner (a shared state's entry) across calls."""
    import torch

    return torch.empty(x.shape, dtype=x.dtype, pin_memory=pinnable(x))


class HostPool:
    """Host buffers kept for reuse, by size (pinned when the device supports it); at most
    ``keep`` of them."""

    def __init__(self, keep: int = 8) -> None:
        self._free: list[Any] = []
        self._keep = keep

    def take(self, nbytes: int, pinned: bool) -> Any:
        """A uint8 CPU tensor of ``nbytes`` (its contents stale)."""
        for i, b in enumerate(self._free):
            if b.numel() == nbytes and bool(b.is_pinned()) == pinned:
                return self._free.pop(i)
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)

    def give(self, b: Any) -> None:
        self._free.append(b)
        del self._free[: max(0, len(self._free) - self._keep)]


class Staged:
    """A device tensor and its host twin (``host``: same dtype and shape, on the CPU)."""

    def __init__(self, x: Any, pool: HostPool, load: bool) -> None:
        import torch

        self.device, self._pool = x, pool
        pinned = pinnable(x)
        nbytes = x.numel() * x.element_size()
        self._raw = pool.take(nbytes, pinned)
        self.host = self._raw.view(x.dtype).view(x.shape) if nbytes else torch.empty(
            x.shape, dtype=x.dtype)
        self._stream = _side_stream(x)
        if load:
            self._copy(self.host, x)

    def store(self) -> None:
        """The collective succeeded: its result (in ``host``) into the device tensor."""
        self._copy(self.device, self.host)

    def release(self) -> None:
        if self._raw is not None:
            self._pool.give(self._raw)
            self._raw = None

    def _copy(self, dst: Any, src: Any) -> None:
        if self._stream is None:
            dst.copy_(src)
            return
        self._stream.wait_stream(_current_stream(self.device))  # after the device's writes
        with _stream_ctx(self._stream):
            dst.copy_(src, non_blocking=True)
        self._stream.synchronize()


def stage(x: Any, pool: HostPool, load: bool) -> Staged | None:
    """``x``'s host twin if ``x`` is on a staged device (``needs``), else None."""
    return Staged(x, pool, load) if needs(x) else None


def pinnable(x: Any) -> bool:
    """Can ``x``'s device use pinned host memory (page-locked copies)?"""
    return bool(x.device.type == "cuda")


_STREAMS: dict[str, Any] = {}  # device -> its copy stream


def _side_stream(x: Any) -> Any:
    if x.device.type != "cuda":
        return None
    key = str(x.device)
    if key not in _STREAMS:
        import torch

        _STREAMS[key] = torch.cuda.Stream(device=x.device)  # type: ignore[no-untyped-call]
    return _STREAMS[key]


def _current_stream(x: Any) -> Any:
    import torch

    return torch.cuda.current_stream(x.device)


def _stream_ctx(stream: Any) -> Any:
    import torch

    return torch.cuda.stream(stream)


class Stages:
    """The staged tensors of one collective: ``host(x, load, out)`` gives the twin to run on
    (or ``x`` itself on the CPU); ``done(ok)`` stores the outputs on success and releases."""

    def __init__(self, pool: HostPool) -> None:
        self._pool = pool
        self._all: list[Staged] = []
        self._outs: list[Staged] = []

    def host(self, x: Any, load: bool, out: bool) -> Any:
        st = stage(x, self._pool, load)
        if st is None:
            return x
        self._all.append(st)
        if out:
            self._outs.append(st)
        return st.host

    def __bool__(self) -> bool:
        return bool(self._all)

    def done(self, ok: bool) -> None:
        try:
            if ok:
                for st in self._outs:
                    st.store()
        finally:
            for st in self._all:
                st.release()
            self._all, self._outs = [], []
