"""Work objects of the ``pccl_aio`` process group: a collective in flight, as torch sees it.

``Work.wait()`` blocks the calling thread until the collective ended and raises pccl_aio's
typed errors (``PeerLostError``...) as they are; ``get_future()`` is a ``torch.futures.Future``
completed when it ends (DDP's reducer chains on it), even if nobody calls ``wait()``. Each
collective's end is signalled on the communicator's loop thread (``add_done_callback``): a
work whose ``finish`` is trivial (``inline``: an all-reduce hands back its tensors) completes
its future there, one thread hop from the loop to the waiting caller as with gloo; the others
are handed to the group's ``Completions`` thread, which runs ``finish`` (copies outputs back)
off the loop. Cancelling is not offered (torch has no cancel).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch._C._distributed_c10d import Work as _C10dWork

from ..blocking import AllReduceHandle

__all__ = ["Completions", "Work", "done"]

Finish = Callable[[], Any]  # after the collective: the future's value (copies outputs back)


class Work(_C10dWork):
    """One collective launched on the group (or several, ``wait`` waits for all)."""

    def __init__(self, handles: list[AllReduceHandle], finish: Finish,
                 completions: Completions | None, inline: bool = False) -> None:
        super().__init__()
        self._future: torch.futures.Future[Any] = torch.futures.Future()
        if completions is None or not handles:
            _complete(handles, finish, self._future)  # (nothing in flight: done now)
            return
        item = (handles, finish, self._future)
        left = len(handles)  # (decremented on the loop thread only)

        def ended(_: AllReduceHandle) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                _complete(*item) if inline else completions.add(*item)

        for h in handles:
            h.add_done_callback(ended)

    def wait(self, timeout: Any = None) -> bool:
        """Block until it ended; raises its typed error (``PeerLostError``, ...)."""
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:
            return False
        return True

    def exception(self) -> BaseException | None:
        try:
            self._future.value()
        except Exception as exc:
            return exc
        return None

    def get_future(self) -> torch.futures.Future[Any]:
        return self._future


def done(value: Any) -> Work:
    """A work already completed with ``value`` (a call with nothing to do)."""
    return Work([], lambda: value, None)


class Completions:
    """A daemon thread completing the futures of ended collectives (``finish`` off the loop)."""

    def __init__(self, name: str = "pccl_aio torch completions") -> None:
        self._queue: queue.SimpleQueue[tuple[list[AllReduceHandle], Finish,
                                             torch.futures.Future[Any]] | None] = (
            queue.SimpleQueue())
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, handles: list[AllReduceHandle], finish: Finish,
            future: torch.futures.Future[Any]) -> None:
        self._queue.put((handles, finish, future))

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            _complete(*item)


def _complete(handles: list[AllReduceHandle], finish: Finish,
              future: torch.futures.Future[Any]) -> None:
    """Complete ``future`` with ``finish()``, or with the first handle's error (every handle
    has ended: ``result()`` does not block)."""
    try:
        for h in handles:
            h.result()
        value = finish()
    except BaseException as exc:  # (the caller's wait() raises it)
        future.set_exception(exc)
    else:
        future.set_result(value)
