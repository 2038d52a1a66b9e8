"""Work objects of the ``pccl_aio`` process group: a collective in flight, as torch sees it.

``Work.wait()`` blocks the calling thread until the collective ended and raises pccl_aio's
typed errors (``PeerLostError``...) as they are. ``get_future()`` is a ``torch.futures.Future``
completed when it ends (DDP's reducer chains on it), even if nobody calls ``wait()``; a
failure completes it with an error torch's C++ side sees as one (its ``value()`` throws, so
``backward()`` raises ``RuntimeError`` naming the typed error, as with gloo). A Python
``Future.set_exception`` would not do: it stores the exception as the future's *value*, and
DDP's reducer then took that object for the bucket's tensors (wrong gradients, or a
segfault reading a tensor list that is empty). ``settled()`` is the Python-side future
(value, or the exception object) for callers in this package.

Each collective's end is signalled on the communicator's loop thread
(``add_done_callback``): a work whose ``finish`` is trivial (``inline``: an all-reduce hands
back its tensors) completes its futures there, one thread hop from the loop to the waiting
caller as with gloo; the others are handed to the group's ``Completions`` thread, which runs
``finish`` (copies outputs back) off the loop. Cancelling is not offered (torch has no cancel).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
from torch._C._distributed_c10d import Work as _C10dWork

from .._errors import PcclTimeoutError

__all__ = ["Completions", "Ended", "Work", "done", "joined"]

Finish = Callable[[], Any]  # after the collective: the future's value (copies outputs back)
Typed = Callable[[BaseException], BaseException]  # the error the caller sees for one raised


class Ended(Protocol):
    """A blocking handle (a collective's, a transfer's), as a work waits on it."""

    def add_done_callback(self, fn: Callable[[Any], None]) -> None: ...

    def result(self) -> Any: ...


class Work(_C10dWork):
    """One collective launched on the group (or several, ``wait`` waits for all);
    ``typed`` maps a collective's error to the one raised (the group's membership check)."""

    def __init__(self, handles: Sequence[Ended], finish: Finish,
                 completions: Completions | None, inline: bool = False,
                 typed: Typed | None = None) -> None:
        super().__init__()
        self._settled: torch.futures.Future[Any] = torch.futures.Future()
        self._future: torch.futures.Future[Any] | None = None  # (made by ``get_future``)
        item = (handles, finish, self._settled, typed)
        if completions is None or not handles:
            _complete(*item)  # (nothing in flight: done now)
            return
        left = len(handles)  # (decremented on the loop thread, or for ``Joined`` works on
        lock = threading.Lock()  # the threads theirs end on)

        def ended(_: Any) -> None:
            nonlocal left
            with lock:
                left -= 1
                last = left == 0
            if last:
                _complete(*item) if inline else completions.add(*item)

        for h in handles:
            h.add_done_callback(ended)

    #: the wait when ``wait`` names none (seconds; None: none): the by-name group's
    #: ``init_process_group`` timeout, as gloo applies it (``fixed.py``)
    default_timeout: float | None = None

    def wait(self, timeout: Any = None) -> bool:
        """Block until it ended; raises its typed error (``PeerLostError``, ...).
        ``timeout`` (a ``timedelta`` or seconds; zero or None: ``default_timeout``):
        ``PcclTimeoutError`` if it has not ended by then (it goes on; a later ``wait`` may
        still succeed)."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        seconds = seconds or self.default_timeout
        if seconds and not self._settled.done():
            ended = threading.Event()
            self._settled.add_done_callback(lambda _: ended.set())
            if not ended.wait(float(seconds)):
                raise PcclTimeoutError(f"the collective did not end within {seconds:g} s "
                                       "(its wait's timeout or the group's)")
        value = self._settled.wait()  # (the value: the result, or the error object)
        if self._future is not None:  # (completed by a callback of ``settled``: done too
            with contextlib.suppress(RuntimeError):  # once this returns; torch's wrapping
                self._future.wait()  # of the typed error)
        if isinstance(value, BaseException):
            raise value
        return True

    def is_completed(self) -> bool:
        return self._settled.done()

    def is_success(self) -> bool:
        return self._settled.done() and not isinstance(self._settled.value(), BaseException)

    def exception(self) -> BaseException | None:
        if not self._settled.done():
            return None
        value = self._settled.value()
        return value if isinstance(value, BaseException) else None

    def get_future(self) -> torch.futures.Future[Any]:
        if self._future is None:  # (a chain on ``settled``: made on demand, it is one
            self._future = self._settled.then(_unwrap)  # fewer future per collective)
        return self._future

    def settled(self) -> torch.futures.Future[Any]:
        """Completed when it ended with the result, or with the error object itself (not
        raised): for chaining in Python without torch's ``RuntimeError`` wrapping."""
        return self._settled


class Joined:
    """A work as a handle another work waits on (``joined``)."""

    def __init__(self, work: Work) -> None:
        self._work = work

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._work.settled().add_done_callback(lambda _: fn(self))

    def result(self) -> Any:
        value = self._work.settled().value()
        if isinstance(value, BaseException):
            raise value
        return value


def joined(works: Sequence[Work], completions: Completions) -> Work:
    """One work for ``works`` (torch's coalescing): done when all are, with the first
    error of theirs."""
    return Work([Joined(w) for w in works], lambda: None, completions, inline=True)


def done(value: Any) -> Work:
    """A work already completed with ``value`` (a call with nothing to do)."""
    return Work([], lambda: value, None)


def _unwrap(settled: torch.futures.Future[Any]) -> Any:
    """``get_future()``'s value: the result, or the error raised (torch's C++ side then
    holds it as the future's error)."""
    value = settled.value()
    if isinstance(value, BaseException):
        raise value
    return value


Item = tuple[Sequence[Ended], Finish, "torch.futures.Future[Any]", Typed | None]


class Completions:
    """A daemon thread completing the futures of ended collectives (``finish`` off the loop)."""

    def __init__(self, name: str = "pccl_aio torch completions") -> None:
        self._queue: queue.SimpleQueue[Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, handles: Sequence[Ended], finish: Finish,
            settled: torch.futures.Future[Any], typed: Typed | None = None) -> None:
        self._queue.put((handles, finish, settled, typed))

    def close(self, wait: float = 10.0) -> None:
        """Stop the thread once what is queued is done; waits for it (``wait`` s at most),
        so that no tensor it held is freed by it while the interpreter shuts down (torch
        aborts the process then)."""
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(wait)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            _complete(*item)
            del item  # (not held, with its tensors, while waiting for the next)


def _complete(handles: Sequence[Ended], finish: Finish,
              settled: torch.futures.Future[Any], typed: Typed | None = None) -> None:
    """Complete ``settled`` with ``finish()``, or with the first handle's error object
    (every handle has ended: ``result()`` does not block)."""
    try:
        for h in handles:
            h.result()
        value = finish()
    except BaseException as exc:  # (the caller's wait() raises it)
        settled.set_result(typed(exc) if typed is not None else exc)
    else:
        settled.set_result(value)
