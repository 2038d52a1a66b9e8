"""Fixtures shared by every test directory (helpers live in ``tests/helpers.py``)."""

from tests.helpers import master, peers

__all__ = ["master", "peers"]
