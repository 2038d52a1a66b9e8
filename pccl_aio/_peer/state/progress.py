"""Progress of a shared-state fetch: the ``progress=`` callback of ``sync_shared_state``.

Rules: ``progress(done_bytes, total_bytes)`` is called only when this peer fetches more than
``PROGRESS_MIN_BYTES`` in one sync; ``total_bytes`` is what it fetches (``SyncInfo.rx_bytes``
once it succeeds). Calls come from the event loop thread as bytes arrive, at most every
``PROGRESS_INTERVAL`` seconds, with ``done`` rising and below ``total``; once every byte
arrived and matched its elected hash, one last call has ``done == total``. A failed fetch
makes no last call. A range that failed half-way is resumed where it stopped (what
arrived is kept and counted once; ``done`` never goes back). A callback that raises is logged
once at WARNING and not called again; the sync goes on.

``progress_bar`` makes such a callback that draws a tqdm bar.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final, TypeAlias

from ..._errors import InvalidUsageError

__all__ = ["PROGRESS_INTERVAL", "PROGRESS_MIN_BYTES", "Meter", "ProgressFn", "check",
           "progress_bar"]

PROGRESS_MIN_BYTES: Final = 4 << 20  # a fetch of at most this many bytes reports nothing
PROGRESS_INTERVAL: Final = 0.1  # s between two calls, at least

ProgressFn: TypeAlias = Callable[[int, int], None]

log = logging.getLogger("pccl_aio.state")


def check(progress: object) -> ProgressFn | None:
    """``progress`` itself if it is None or callable; else ``InvalidUsageError``."""
    if progress is not None and not callable(progress):
        raise InvalidUsageError(
            f"progress must be a callable (done_bytes, total_bytes) or None, "
            f"not {type(progress).__name__}")
    return progress


class Meter:
    """Counts the bytes of one fetch of ``total`` bytes and reports them to ``fn``: ``add``
    as bytes arrive (a negative count takes back those of a failed range), ``finish`` once
    the fetch succeeded. Nothing is reported when ``fn`` is None or ``total`` is at most
    ``PROGRESS_MIN_BYTES``."""

    __slots__ = ("_count", "_fn", "_last", "_next", "extra", "total")

    def __init__(self, fn: ProgressFn | None, total: int,
                 extra: dict[str, Any] | None = None) -> None:
        self._fn = fn if total > PROGRESS_MIN_BYTES else None
        self.total = total
        self.extra = extra  # ``extra=`` of the warning about a callback that raised
        self._count = 0  # bytes received and not taken back
        self._last = 0  # the last ``done`` reported
        self._next = 0.0  # monotonic time of the next report, at the earliest

    @property
    def active(self) -> bool:
        """Reports still go out (a callback was given, the fetch is large, it never raised)."""
        return self._fn is not None

    def add(self, nbytes: int) -> None:
        self._count += nbytes
        if self._fn is None or not self._last < self._count < self.total:
            return
        now = time.monotonic()
        if now >= self._next:
            self._next = now + PROGRESS_INTERVAL
            self._last = self._count
            self._call(self._count)

    def finish(self) -> None:
        """The last report: ``done == total``."""
        if self._fn is not None:
            self._last = self.total
            self._call(self.total)
        self._fn = None

    def _call(self, done: int) -> None:
        fn = self._fn
        assert fn is not None
        try:
            fn(done, self.total)
        except Exception:
            self._fn = None
            log.warning("the progress callback %r raised; it is not called again in this sync",
                        fn, exc_info=True, extra=self.extra)


def progress_bar(desc: str = "shared state", **options: Any) -> ProgressFn:
    """A ``progress=`` callback for ``sync_shared_state`` that draws a tqdm bar of bytes.

    The bar appears at the first call (a fetch too small to report shows none) and is closed
    by the last one (``done == total``); the same callback may serve every sync. Without tqdm
    installed it draws nothing. By default the bar goes to stderr and is hidden when stderr
    is not a terminal (``disable=None``); ``options`` go to ``tqdm.tqdm`` (``file=``,
    ``position=``...). Called from the event loop thread, as every ``progress`` callback.
    """
    bar: Any = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            bar = tqdm(**{"desc": desc, "unit": "B", "unit_scale": True, "unit_divisor": 1024,
                          "disable": None, "dynamic_ncols": True, **options, "total": total})
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
            bar = None

    return update
