"""The launcher's count of the run's outer steps (its progress bar's total, and the last
quarter where it kills nobody) follows the latest step line: the first ones of streaming and
async DiLoCo say too little of the run's pace (a fragment's sync, a step applied late)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from pccl_aio._launch.record import Record
from pccl_aio._launch.runner import Launcher
from pccl_aio._launch.start import Config


def launcher(tmp_path: Path, rec: Record, budget: int) -> Launcher:
    cfg = Config(Path("x.py"), 3, 2.0, tmp_path, 1, None, ["--inner-steps", str(budget)])
    bar = SimpleNamespace(total=None, n=0, refresh=lambda: None,
                          update=lambda k: setattr(bar, "n", bar.n + k))
    return Launcher(cfg, rec, bar)


def test_the_total_follows_the_latest_pace(tmp_path: Path,
                                           csv_record: Record) -> None:
    run = launcher(tmp_path, csv_record, 1000)
    run._advance(1, 17, 3, float("nan"))  # a streaming fragment: 17 inner steps in
    assert run.total == 59 and run.bar.total == 59
    run._advance(3, 50, 3, float("nan"))  # then one outer step per 50/3 inner steps
    assert run.total == 60 and run.bar.total == 60 and run.bar.n == 3
    run._advance(30, 500, 3, 1.5)
    assert run.total == 60 and run.outer == 30 and run.val == 1.5


def test_no_kill_in_the_last_quarter_of_the_latest_total(tmp_path: Path,
                                                         csv_record: Record) -> None:
    run = launcher(tmp_path, csv_record, 1000)
    run._active = lambda: [1, 2, 3]  # type: ignore[method-assign]
    run._advance(1, 100, 3, float("nan"))  # an async step applied late: 10 outer steps?
    assert run.total == 10
    run._advance(8, 160, 3, float("nan"))  # no: 50 of 20 inner steps; step 8 is early
    assert run.total == 50 and run._may_kill()
    run._advance(40, 800, 3, float("nan"))  # the last quarter
    assert not run._may_kill()
