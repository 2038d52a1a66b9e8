"""The one choice of event loop: uvloop when installed, else the stock asyncio loop."""

from __future__ import annotations

import asyncio

__all__ = ["new_loop"]


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when it is installed (a dependency except on Windows)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
