"""Fixtures shared by every test directory (helpers live in ``tests/helpers.py``)."""

import os
import tempfile

from pccl_aio._master.kept import STATE_DIR_ENV
from tests.helpers import master, peers

__all__ = ["master", "peers"]

# A master with a run secret keeps a master secret in its state folder (``_master/kept.py``):
# the suite's masters, in process or not, keep theirs in a folder of the test run's own
# (children inherit the environment), never in the user's.
os.environ.setdefault(STATE_DIR_ENV, tempfile.mkdtemp(prefix="pccl_aio_state_"))
