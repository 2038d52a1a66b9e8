"""The base of every control-plane wire message (``messages.py``, ``collective.py``,
``recovery.py``)."""

from __future__ import annotations

import msgspec

__all__ = ["Msg"]


class Msg(msgspec.Struct, array_like=True, frozen=True, gc=False, tag_field="t"):
    """Base of every wire message: a msgpack array whose first item is the tag."""
