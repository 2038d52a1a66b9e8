"""Fixtures shared by every test directory (helpers live in ``tests/helpers.py``)."""

import asyncio
import gc
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import uvloop

from pccl_aio._master.kept import STATE_DIR_ENV
from tests.helpers import master, peers

__all__ = ["master", "peers"]

# A master with a run secret keeps a master secret in its state folder (``_master/kept.py``):
# the suite's masters, in process or not, keep theirs in a folder of the test run's own
# (children inherit the environment), never in the user's.
os.environ.setdefault(STATE_DIR_ENV, tempfile.mkdtemp(prefix="pccl_aio_state_"))


# ---- the in-process suite on both event loops, unhandled loop errors fail the test ----------

IN_PROCESS = {"unit", "integration"}  # (the process tests drive subprocesses: one loop)
LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


def pytest_asyncio_loop_factories(config: Any, item: pytest.Item) -> dict[str, Any]:
    """Every in-process async test runs on uvloop (what the library runs on by default)
    and on the stock asyncio loop; the others on the stock loop."""
    rel = Path(str(item.path)).relative_to(Path(__file__).parent)
    return LOOPS if rel.parts[0] in IN_PROCESS else {"asyncio": asyncio.new_event_loop}


@pytest.fixture(autouse=True)
async def _unhandled_loop_errors(request: pytest.FixtureRequest) -> Any:
    """Fail an async test if its loop saw an exception nobody handled (a callback's, a
    task's error never retrieved: reported when the task is collected, hence a collection
    of the youngest generation, where such a task and its traceback's cycle sit)."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, ctx: seen.append(ctx))
    yield
    if asyncio.iscoroutinefunction(getattr(request.node, "function", None)):
        gc.collect(0)
    loop.set_exception_handler(None)
    if seen:
        pytest.fail("unhandled exceptions on the test's event loop: " + "; ".join(
            f"{c.get('message')} {c.get('exception')!r} {c.get('future', '')!r}"
            for c in seen), pytrace=False)
