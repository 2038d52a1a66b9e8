"""The processes of a launched run (``runner.py`` starts and follows them): ``Child``, one
of them, and how a child is started (its log file, its death with the launcher)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["Child", "die_with_parent", "open_log"]

_PR_SET_PDEATHSIG = 1


@dataclass(eq=False)
class Child:
    """One process of the run; its group id is its pid (a new session), so that a signal
    reaches whatever it started too."""

    name: str
    seed: int | None  # None: the master
    proc: asyncio.subprocess.Process
    out: IO[str] | None = None  # copy of its stdout
    err_path: Path | None = None
    replacement: bool = False
    peer: str = ""  # its peer id, once it joined
    stepped: bool = False  # printed a step line: it holds the run's state
    done: bool = False
    killed: bool = False  # SIGKILLed by churn
    stopped: bool = False  # stopped by the launcher (a replacement that came too late)
    code: int | None = None  # exit status once its exit was handled
    shard: int | None = None  # its shard within its replica (``--replica-procs``)

    def signal(self, sig: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def stderr_tail(self, lines: int = 15) -> str:
        if self.err_path is None or not self.err_path.exists():
            return ""
        text = self.err_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join("    " + t for t in text[-lines:])


def open_log(path: Path) -> IO[str]:
    """A log file of this machine, opened for writing (quick enough for the event loop)."""
    return open(path, "w", encoding="utf-8")


def die_with_parent() -> Callable[[], None] | None:
    """A preexec function that has Linux SIGKILL the child when the launcher dies, even by
    SIGKILL (no orphans); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return preexec
