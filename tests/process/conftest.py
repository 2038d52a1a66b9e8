"""Fixtures for real-process tests (helpers live in ``tests/process/procs.py``)."""

from tests.process.procs import master_proc, procs

__all__ = ["master_proc", "procs"]
