"""``TaskSet``: the tasks one part of the library owns, cancelled and awaited on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("pccl_aio.tasks")

_T = TypeVar("_T")


class TaskSet:
    """A supervised set of tasks: ``spawn`` keeps a strong reference until the task ends,
    logs an exception nobody retrieved, and ``close`` cancels and awaits every one.

    Unlike ``asyncio.TaskGroup``, a failing task does not cancel its siblings: the owners
    report failures through their own futures (a collective's verdict, a vote's answer).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, _T], *, name: str | None = None) -> asyncio.Task[_T]:
        """Start ``coro`` as a task of this set (on the running loop)."""
        task = asyncio.get_running_loop().create_task(coro, name=name or self.name)
        self.adopt(task)
        return task

    def adopt(self, task: asyncio.Task[Any]) -> None:
        """Own a task started elsewhere (e.g. a server's connection handler)."""
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s: task %s failed: %r", self.name, task.get_name(), exc, exc_info=exc)

    async def close(self) -> None:
        """Cancel every task (but the caller's own) and wait until all ended, including
        tasks spawned while closing. Cancelling this wait leaves the cancelled tasks to end
        on their own."""
        current = asyncio.current_task()
        while others := [t for t in self._tasks if t is not current]:
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)
