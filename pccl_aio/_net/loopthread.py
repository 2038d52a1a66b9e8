"""A running event loop in a daemon thread, for the blocking facade (``pccl_aio.blocking``):
``LoopThread.call`` runs a coroutine on it and blocks the calling thread for the result."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .loops import new_loop

__all__ = ["LoopThread", "finalize", "owned"]

_T = TypeVar("_T")


class LoopThread:
    """An event loop running forever in a daemon thread; ``call`` runs a coroutine on it and
    blocks the calling thread for the result."""

    def __init__(self, name: str, wrappers: frozenset[str] = frozenset()) -> None:
        self._skip = wrappers | {__file__}  # files whose frames a traceback leaves out
        self.loop = new_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking pccl_aio call from its own event loop thread "
                               "(use the async API inside coroutines)")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop; blocks until it ends. An exception in the waiting thread
        (``KeyboardInterrupt``) cancels it, and waits until the cancellation took effect.
        The coroutine's exception is raised with a short traceback: the caller's frames,
        then the library's (not the future's nor this module's wrappers)."""
        fut = self.submit(coro)
        try:
            exc = fut.exception()
        except BaseException:
            if fut.cancel():
                with contextlib.suppress(BaseException):
                    concurrent.futures.wait([fut])
            raise
        if exc is None:
            return fut.result()
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in self._skip:
            tb = tb.tb_next  # the facade's coroutine wrappers
        del fut
        try:
            raise exc.with_traceback(tb)
        finally:
            del exc, tb

    def stop(self, last: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
        """Run ``last()`` (a close), then stop the loop and join the thread. Idempotent."""
        if self.loop.is_closed():
            return
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            if last is not None:
                with contextlib.suppress(BaseException):
                    self.call(last())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        if not self.loop.is_running():
            self.loop.close()


def finalize(runner: LoopThread, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
    runner.stop(close)


def owned(name: str, factory: Callable[[], _T], wrappers: frozenset[str] = frozenset()
          ) -> tuple[LoopThread, _T]:
    """A new loop thread and the object ``factory`` builds on it (the thread is stopped
    again if that raises)."""
    runner = LoopThread(name, wrappers)

    async def make() -> _T:
        return factory()

    try:
        return runner, runner.call(make())
    except BaseException:
        runner.stop()
        raise
