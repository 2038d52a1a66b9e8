"""``all_reduce_multiple_with_retry``: many tagged all-reduces in flight, relaunched on loss.

Every decision (launch the next, relaunch an aborted one, give up) is taken synchronously in
the verdict callbacks, which run in the master's message order. All peers of a group see the
same verdicts in the same order, so they launch the same tags in the same order without any
extra coordination.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
from collections.abc import Callable
from typing import Protocol

from ..._errors import PcclError, PcclTimeoutError, PeerLostError, TooFewPeersError
from ..._types import ReduceInfo
from .. import deadline
from ..core.buffers import Buffer
from .collective import Collective

MakeCollective = Callable[[int, Buffer], Collective]  # (tag, in-place buffer) -> an attempt
OnRetry = Callable[[int, int, int, BaseException], None]  # (tag, attempt, max_attempts, why)


class Launcher(Protocol):
    """What the retry scheduler needs: launch a collective, and the group's size now."""

    def launch(self, coll: Collective) -> None: ...

    def awaiting(self, coll: Collective) -> None: ...

    @property
    def peer_group_world_size(self) -> int: ...

class MultiReduce:
    """One call of ``all_reduce_multiple_with_retry``."""

    def __init__(self, launcher: Launcher, make: MakeCollective, bufs: list[Buffer],
                 tags: list[int], max_in_flight: int, max_attempts: int,
                 on_retry: OnRetry | None = None) -> None:
        self.launcher, self.make, self.bufs, self.tags = launcher, make, bufs, tags
        self.on_retry = on_retry  # told of each relaunch (log line, counter)
        self.max_in_flight, self.max_attempts = max_in_flight, max_attempts
        self.todo = list(range(len(bufs)))
        self.inflight: dict[int, Collective] = {}
        self.infos: list[ReduceInfo | None] = [None] * len(bufs)
        self.attempts = [0] * len(bufs)
        self.error: BaseException | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self, timeout: float | None = None) -> list[ReduceInfo]:
        """Blocks until every tensor is reduced; cancelling aborts what is in flight, so does
        ``timeout`` expiring, which raises ``PcclTimeoutError`` once it all ended."""
        self._fill()
        self._maybe_done()
        try:
            await deadline.within(asyncio.shield(self.done), timeout,
                                  "all_reduce_multiple_with_retry()")
        except PcclTimeoutError as exc:
            self._abandon(exc)
            await asyncio.shield(self.done)  # the verdicts: inputs restored
            raise exc from None
        except asyncio.CancelledError:
            self._abandon(asyncio.CancelledError())
            raise
        if self.error is not None:
            raise self.error
        return [i for i in self.infos if i is not None]

    def _abandon(self, why: BaseException) -> None:
        """Launch nothing more and abort what is in flight (its verdicts still arrive)."""
        self.error = self.error or why
        for coll in list(self.inflight.values()):
            coll.cancel()
        self._maybe_done()

    def _fill(self) -> None:
        while self.todo and len(self.inflight) < self.max_in_flight and self.error is None:
            i = self.todo.pop(0)
            coll = self.make(self.tags[i], self.bufs[i])
            try:
                self.launcher.launch(coll)
            except PcclError as exc:
                self.error = exc
                return
            self.launcher.awaiting(coll)  # the caller waits on every one of them
            coll.hooks.append(functools.partial(self._on_verdict, i))
            self.inflight[i] = coll

    def _on_verdict(self, i: int, coll: Collective) -> None:
        self.inflight.pop(i, None)
        exc = coll.future.exception()
        if exc is None:
            self.infos[i] = coll.future.result()
        elif isinstance(exc, PeerLostError) and self.error is None:
            self.attempts[i] += 1
            if (size := self.launcher.peer_group_world_size) < 2:
                self.error = TooFewPeersError(f"peer group has {size} peer(s) left")
            elif self.attempts[i] >= self.max_attempts:
                self.error = exc
            else:
                bisect.insort(self.todo, i)
                if self.on_retry is not None:
                    self.on_retry(self.tags[i], self.attempts[i] + 1, self.max_attempts, exc)
        elif self.error is None:
            self.error = exc
        self._fill()
        self._maybe_done()

    def _maybe_done(self) -> None:
        idle = not self.inflight and (self.error is not None or not self.todo)
        if idle and not self.done.done():
            self.done.set_result(None)
