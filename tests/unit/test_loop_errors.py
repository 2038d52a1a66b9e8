"""The suite's own rule (``tests/conftest.py``): an async test whose event loop saw an
exception nobody handled fails, on either loop, and the in-process tests run on both."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent.parent / "conftest.py").read_text()


def test_a_task_error_nobody_retrieved_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_mode = auto\n"
                     "asyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_planted='''
        import asyncio

        async def test_a_dropped_failed_task():
            async def boom():
                raise ValueError("planted")
            task = asyncio.ensure_future(boom())
            await asyncio.wait([task])
            del task

        async def test_a_callback_that_raises():
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            def bad():
                done.set_result(None)
                raise KeyError("planted")
            loop.call_soon(bad)
            await done

        async def test_a_clean_one():
            await asyncio.sleep(0)
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(["*unhandled exceptions on the test's event loop*ValueError*",
                                 "*unhandled exceptions on the test's event loop*KeyError*"],
                                consecutive=False)


def test_the_in_process_tests_run_on_both_loops(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_mode = auto\n"
                     "asyncio_default_fixture_loop_scope = function\n")
    unit = pytester.mkpydir("unit")
    (unit / "test_which.py").write_text(
        "import asyncio\n\n"
        "async def test_loop():\n"
        "    print('LOOP', type(asyncio.get_running_loop()).__module__)\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-q", "-s")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*LOOP uvloop*"], consecutive=False)
    result.stdout.fnmatch_lines(["*LOOP asyncio*"], consecutive=False)


def test_a_warning_in_a_unit_test_is_an_error() -> None:
    """``tests/unit/conftest.py``: every warning a unit test lets out fails it."""
    with pytest.raises(UserWarning, match="planted"):
        warnings.warn("planted", UserWarning, stacklevel=1)
