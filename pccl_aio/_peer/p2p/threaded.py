"""``TransferHandle`` of the blocking facade (``pccl_aio.blocking``): a send or receive
launched on a communicator's loop thread, waited for from any thread."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

from ..._errors import InvalidUsageError
from ..._net.loopthread import LoopThread
from ..._types import TransferInfo
from .calls import TransferHandle as AsyncTransfer

__all__ = ["TransferHandle", "launch", "post"]


class TransferHandle:
    """A ``send_async``/``recv_async`` in flight: ``wait()`` blocks for its
    ``TransferInfo`` or raises, as the async handle."""

    def __init__(self, runner: LoopThread,
                 launched: concurrent.futures.Future[AsyncTransfer]) -> None:
        self._runner, self._launched = runner, launched
        #: callbacks added before a posted launch ran (registered by it, in the same loop
        #: callback, so a post and its work's callback wake the loop thread once); None after
        self._early: list[Callable[[TransferHandle], None]] | None = None
        self._lock = threading.Lock()

    def _registered(self) -> None:
        """On the loop thread, once the launch ran: register the early callbacks."""
        with self._lock:
            early, self._early = self._early, None
        for fn in early or ():
            self._register(fn)

    def _register(self, fn: Callable[[TransferHandle], None]) -> None:
        if self._launched.exception() is not None:
            fn(self)
        else:
            self._handle.add_done_callback(lambda _: fn(self))

    @property
    def _handle(self) -> AsyncTransfer:
        return self._launched.result()  # (blocks until a posted launch ran; raises its error)

    def launched(self) -> bool:
        """Its launch ran on the loop thread (a posted one may not have yet)."""
        return self._launched.done()

    def done(self) -> bool:
        """It ended: ``wait()`` will not block."""
        if not self._launched.done():
            return False
        return self._launched.exception() is not None or self._handle.done()

    def wait(self, timeout: float | None = None) -> TransferInfo:
        """Block until it ended (``PcclTimeoutError`` after ``timeout`` s: withdrawn)."""
        return self._runner.call(self._handle.wait(timeout))

    def add_done_callback(self, fn: Callable[[TransferHandle], None]) -> None:
        """Call ``fn(handle)`` on the loop thread once it ended (keep it short)."""
        with self._lock:
            if self._early is not None:
                self._early.append(fn)
                return
        self._runner.loop.call_soon_threadsafe(self._register, fn)

    def result(self) -> TransferInfo:
        """The outcome once ``done()``; ``InvalidUsageError`` before. Never blocks."""
        if not self._launched.done():
            raise InvalidUsageError("the transfer is still being launched (wait() for it)")
        return self._handle.result()

    def cancel(self) -> None:
        """Withdraw it (see the async handle's ``cancel``)."""
        if self._launched.exception() is not None:
            return

        async def cancel() -> None:
            self._handle.cancel()

        self._runner.call(cancel())


def launch(runner: LoopThread, make: Callable[[], AsyncTransfer]) -> TransferHandle:
    """Run ``make()`` on the loop thread and wait for it (its errors raise here)."""

    async def made() -> AsyncTransfer:
        return make()

    done: concurrent.futures.Future[AsyncTransfer] = concurrent.futures.Future()
    done.set_result(runner.call(made()))
    return TransferHandle(runner, done)


def post(runner: LoopThread, make: Callable[[], AsyncTransfer]) -> TransferHandle:
    """Queue ``make()`` on the loop thread without waiting (for threads that must not block;
    posts from one thread keep their order); its errors surface through the handle."""
    launched: concurrent.futures.Future[AsyncTransfer] = concurrent.futures.Future()
    handle = TransferHandle(runner, launched)
    handle._early = []

    def run() -> None:
        try:
            launched.set_result(make())
        except BaseException as exc:  # (reported through the handle)
            launched.set_exception(exc)
        handle._registered()

    runner.loop.call_soon_threadsafe(run)
    return handle
