"""``AllReduceHandle``: an all-reduce in flight, as ``all_reduce_async`` returns it."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol

from ..._errors import InvalidUsageError, PcclError, PcclTimeoutError, PeerLostError
from ..._types import ReduceInfo
from .. import deadline
from .collective import Collective


class CollectiveHandle(Protocol):
    """What every collective's handle offers (an all-reduce's, an all-to-all's)."""

    @property
    def tag(self) -> int: ...

    def done(self) -> bool: ...

    async def started(self) -> bool: ...

    async def wait(self, timeout: float | None = None) -> ReduceInfo: ...

    def add_done_callback(self, fn: Callable[[Any], None]) -> None: ...

    def result(self) -> ReduceInfo: ...

    def cancel(self) -> bool: ...


class AllReduceHandle(Awaitable[ReduceInfo]):
    """A collective in flight (an all-reduce, or any ``*_async`` call's); ``await handle``
    (or ``await handle.wait()``) gives its ``ReduceInfo`` or raises.

    Cancelling the awaiting task, or ``cancel()``, aborts the collective for the whole group
    (the others get ``PeerLostError``); the communicator stays usable.
    """

    def __init__(self, coll: Collective, check: Callable[[], None],
                 awaiting: Callable[[Collective], None]) -> None:
        self._coll = coll
        self._check = check  # raises InvalidUsageError off the owning event loop
        self._awaiting = awaiting  # tells the master the caller now waits on it
        self._cancelled = False

    @property
    def tag(self) -> int:
        """The tag the collective was launched with."""
        return self._coll.tag

    def done(self) -> bool:
        """The collective ended (completed, aborted or rejected)."""
        return self._coll.future.done()

    async def started(self) -> bool:
        """Wait until the master started the collective (data is flowing).

        Returns False if it ended without starting (rejected, aborted while voting).
        Cancelling this wait does not affect the collective.
        """
        self._check()
        self._awaiting(self._coll)
        try:
            await asyncio.shield(self._coll.started)
        except asyncio.CancelledError:
            if self._coll.started.cancelled():
                return False
            raise
        return True

    async def wait(self, timeout: float | None = None) -> ReduceInfo:
        """Block until the collective ended; same as ``await handle``.

        ``timeout``: seconds; on expiry the collective is aborted for the group, this waits
        for the master's verdict (an in-place input is restored by then) and raises
        ``PcclTimeoutError`` (or returns the result, if it completed meanwhile).
        """
        return await self._wait(deadline.check(timeout))

    def add_done_callback(self, fn: Callable[[AllReduceHandle], None]) -> None:
        """Call ``fn(handle)`` on the owning event loop once the collective ended (soon, if it
        already has); ``result()`` then gives its outcome without waiting. Like ``wait()``, it
        tells the master the caller waits on the collective (deadlock detection counts it).
        """
        self._check()
        self._awaiting(self._coll)
        self._coll.future.add_done_callback(lambda _: fn(self))

    def result(self) -> ReduceInfo:
        """The ``ReduceInfo`` of a collective that ended, or its error (``PeerLostError``,
        ...; ``asyncio.CancelledError`` if ``cancel()`` aborted it); ``InvalidUsageError`` if
        it is still running. Never blocks; callable from any thread once ``done()``."""
        fut = self._coll.future
        if not fut.done():
            raise InvalidUsageError(f"{self._what} is still running (wait() for it)")
        exc = fut.exception()
        if exc is None:
            return fut.result()
        if self._cancelled and isinstance(exc, PeerLostError):
            raise asyncio.CancelledError(f"{self._what} cancelled") from exc
        raise detached(exc)

    def cancel(self) -> bool:
        """Abort the collective for the group; False if it already ended.

        Awaiting the handle then raises ``asyncio.CancelledError`` once the master's verdict
        arrived (an in-place input is restored by then), or returns the result if the
        collective completed before the abort reached the others.
        """
        self._check()
        if self._coll.future.done():
            return False
        if not self._coll.cancelled:
            self._coll.cancel()
        self._cancelled = True
        return True

    @property
    def _what(self) -> str:
        """The collective, in messages: ``all-reduce tag 3``."""
        return f"{self._coll.kind.label} tag {self._coll.tag}"

    def __await__(self) -> Generator[Any, None, ReduceInfo]:
        return self._wait(None).__await__()

    async def _wait(self, timeout: float | None) -> ReduceInfo:
        self._check()
        coll = self._coll
        self._awaiting(coll)
        what = self._what
        verdict: PcclError
        try:
            return await deadline.within(asyncio.shield(coll.future), timeout, what)
        except asyncio.CancelledError:
            if not coll.future.done() and not coll.cancelled:
                coll.cancel()
            raise
        except PeerLostError as exc:
            if self._cancelled:
                raise asyncio.CancelledError(f"{what} cancelled") from detached(exc)
            verdict = exc
        except PcclTimeoutError as exc:
            if not coll.future.done():  # our deadline, not the collective's verdict
                if not coll.cancelled:
                    coll.cancel()
                await asyncio.wait([coll.future])  # the verdict: the input is restored
                fut = coll.future
                if fut.cancelled() or fut.exception() is not None:
                    raise exc from None
                return fut.result()  # it completed after all
            verdict = exc
        except PcclError as exc:
            verdict = exc
        raise detached(verdict)  # (outside the handler: no implicit context)


def detached(exc: BaseException) -> BaseException:
    """The verdict ``exc`` (kept by the collective's future) to raise to a caller: a copy,
    and ``exc`` itself without the frames it took on its way to the caller. Those frames hold
    the collective (and the caller's handle), which holds ``exc``: raised as is, the
    collective, its input's backup and buffers would wait in that cycle for a pass of the
    garbage collector. ``exc`` itself if it cannot be copied."""
    exc.__traceback__ = None
    try:
        out = copy.copy(exc)
    except Exception:  # (a subclass whose arguments do not rebuild it)
        return exc
    out.__cause__, out.__context__ = exc.__cause__, exc.__context__
    out.__suppress_context__ = exc.__suppress_context__
    return out
