"""Counts in messages: ``1 peer``, ``2 peers``."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an ``s`` unless ``n`` is 1: ``plural(1, "key")`` is
    ``1 key``, ``plural(3, "key")`` is ``3 keys``."""
    return f"{n} {word}{'' if n == 1 else 's'}"
