"""``timeout=`` of the public calls: one check of the argument, one way to expire."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import TypeVar

from .._errors import InvalidUsageError, PcclTimeoutError

_T = TypeVar("_T")


def check(timeout: object, what: str = "timeout") -> float | None:
    """None, or a positive finite number of seconds; InvalidUsageError otherwise."""
    if timeout is None:
        return None
    if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
            or not math.isfinite(timeout) or timeout <= 0):
        raise InvalidUsageError(f"{what} must be None or a positive number of seconds, "
                                f"not {timeout!r}")
    return float(timeout)


async def within(aw: Awaitable[_T], timeout: float | None, what: str) -> _T:
    """Await ``aw``; after ``timeout`` seconds cancel it and raise ``PcclTimeoutError``
    naming ``what``. A ``TimeoutError`` raised by ``aw`` itself passes through unchanged."""
    if timeout is None:
        return await aw
    cm = asyncio.timeout(timeout)
    try:
        async with cm:
            return await aw
    except TimeoutError:
        if not cm.expired():
            raise
        raise PcclTimeoutError(f"{what} did not finish within {timeout:g} s") from None
