"""The bases of every control-plane wire message (``messages.py``, ``collective.py``,
``recovery.py``) and of the records nested in them."""

from __future__ import annotations

import msgspec

__all__ = ["Msg", "Record"]


class Record(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Base of a record nested in a message: a msgpack array of its fields, no tag."""


class Msg(Record, frozen=True, tag_field="t"):
    """Base of every wire message: a msgpack array whose first item is the tag."""
