"""``_peer/state/progress.py``: the meter behind ``sync_shared_state(progress=)`` (threshold,
throttling on a fake clock, bytes taken back, a callback that raises) and ``progress_bar``."""

from __future__ import annotations

import io
import logging
import sys

import pytest

import pccl_aio as pccl
from pccl_aio._peer.state import progress as pr

pytestmark = pytest.mark.timeout(30)
BIG = pr.PROGRESS_MIN_BYTES + 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(pr.time, "monotonic", c)
    return c


def test_reports_are_throttled_rising_and_end_at_the_total(clock: Clock) -> None:
    calls: list[tuple[int, int]] = []
    meter = pr.Meter(lambda d, t: calls.append((d, t)), 3 * BIG)
    assert meter.active
    meter.add(10)  # the first bytes report at once
    meter.add(10)  # within the interval: nothing
    clock.now += pr.PROGRESS_INTERVAL
    meter.add(5)
    meter.add(-25)  # a failed range taken back: nothing goes down
    clock.now += pr.PROGRESS_INTERVAL
    meter.add(20)  # below what was reported: nothing
    clock.now += pr.PROGRESS_INTERVAL
    meter.add(3 * BIG - 20)  # every byte: the total waits for finish()
    meter.finish()
    meter.finish()  # once only
    assert calls == [(10, 3 * BIG), (25, 3 * BIG), (3 * BIG, 3 * BIG)]
    assert not meter.active


@pytest.mark.parametrize("total", [0, 1, pr.PROGRESS_MIN_BYTES])
def test_a_fetch_of_at_most_the_threshold_reports_nothing(clock: Clock, total: int) -> None:
    calls: list[tuple[int, int]] = []
    meter = pr.Meter(lambda d, t: calls.append((d, t)), total)
    assert not meter.active
    meter.add(total)
    meter.finish()
    assert calls == []


def test_a_callback_that_raises_is_logged_once_and_dropped(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def broken(done: int, total: int) -> None:
        calls.append(done)
        raise ValueError("no terminal")

    meter = pr.Meter(broken, BIG, {"pccl": {"peer": 3}})
    with caplog.at_level(logging.WARNING, logger="pccl_aio.state"):
        meter.add(1)
        clock.now += 1
        meter.add(1)
        meter.finish()
    assert calls == [1] and not meter.active
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert caplog.records[0].exc_info is not None and caplog.records[0].pccl == {"peer": 3}


def test_check_accepts_callables_and_none_only() -> None:
    assert pr.check(None) is None
    assert pr.check(print) is print
    for bad in ("x", 1, [print]):
        with pytest.raises(pccl.InvalidUsageError, match="progress must be a callable"):
            pr.check(bad)


def test_progress_bar_draws_bytes_and_closes_on_the_last_call() -> None:
    pytest.importorskip("tqdm")
    out = io.StringIO()
    bar = pccl.progress_bar("state", file=out, disable=False, mininterval=0)
    bar(1 << 20, 8 << 20)
    bar(8 << 20, 8 << 20)
    text = out.getvalue()
    assert "state: 100%" in text and "8.00M/8.00M" in text and text.endswith("\n"), text
    bar(2 << 20, 4 << 20)  # the same callback serves the next sync with a new bar
    bar(4 << 20, 4 << 20)
    assert out.getvalue().count("\n") == 2 and "4.00M/4.00M" in out.getvalue()


def test_progress_bar_without_tqdm_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    bar = pccl.progress_bar()
    bar(1, 2)
    bar(2, 2)


def test_the_launcher_draws_fetch_lines_and_records_only_the_last(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path
    from types import SimpleNamespace
    from typing import Any

    from pccl_aio._launch import runner
    from pccl_aio._launch.record import Record

    drawn: list[tuple[str, int, int]] = []

    def fake_bar(desc: str, **options: Any) -> pr.ProgressFn:
        return lambda done, total: drawn.append((desc, done, total))

    monkeypatch.setattr(runner, "progress_bar", fake_bar)
    record = Record(tmp_path / "r.csv")
    cfg = runner.Config(Path("x.py"), 2, None, tmp_path, 0, None, [])
    launcher = runner.Launcher(cfg, record, SimpleNamespace())
    child = runner.Child("seed 7", 7, SimpleNamespace(pid=1, returncode=None))  # type: ignore[arg-type]
    for line in ("fetch peer=3 done=1024 total=9000000", "fetch peer=3 done=bad total=1",
                 "fetch peer=3 done=9000000 total=9000000"):
        assert launcher._handle(child, "line", line + "\n") is None
    record.close()
    assert drawn == [("seed 7: shared state", 1024, 9000000),
                     ("seed 7: shared state", 9000000, 9000000)]
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert len(rows) == 2 and "fetch" in rows[1] and "done=9000000" in rows[1], rows
