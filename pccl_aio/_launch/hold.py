"""Holding a run's master up between its phases (the demo's ``--hold``): until a time
passes, Ctrl-C, or (optionally) Enter on stdin."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import TextIO

__all__ = ["hold"]


async def hold(seconds: float, notice: str, file: TextIO, enter: bool = False) -> bool:
    """Wait ``seconds`` (the master and its status page stay up); False if Ctrl-C (SIGINT)
    ended the wait. With ``enter``, a line on stdin (Enter) ends it early too."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()

    def finish(ok: bool) -> None:
        if not done.done():
            done.set_result(ok)

    fd, watching = -1, False

    def read() -> None:
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        if b"\n" in data:
            finish(True)
        elif not data:  # no stdin (closed, /dev/null): only the time ends the wait
            loop.remove_reader(fd)

    loop.add_signal_handler(signal.SIGINT, finish, False)
    if enter:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = sys.stdin.fileno()
            loop.add_reader(fd, read)  # a regular file cannot be watched: no Enter then
            watching = True
    try:
        print(notice, file=file, flush=True)
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(done), seconds)
        return True
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if watching:
            loop.remove_reader(fd)
