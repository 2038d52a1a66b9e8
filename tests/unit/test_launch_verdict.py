"""The launcher's summary rules: the best and final validation loss, the share of outer steps
run with company (world >= 2), kills that came due and did not happen, and ``ok`` no when the
final loss is clearly worse than the best (over 3 %) or the run never had company."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pccl_aio._launch.record import Record, parse
from pccl_aio._launch.report import summary, table
from pccl_aio._launch.runner import Launcher
from pccl_aio._launch.start import Config
from pccl_aio._launch.verdict import WORSE, judge

pytestmark = pytest.mark.timeout(30)



def record(tmp_path: Path, *steps: tuple[int, int, int, str], done: str | None = None) -> Record:
    """A record of step lines ``(seed, outer, world, val)`` and, for seed 1, a done line."""
    rec = Record(tmp_path / "r.csv")
    for seed, outer, world, val in steps:
        kind, fields = parse(f"step peer={seed} outer={outer} inner={10 * outer} world={world} "
                             f"loss=3.0 val={val} sent={100 * outer} digest=ab") or ("", {})
        assert rec.line(0.0, seed, kind, fields) is not None
    if done is not None:
        last = max(s[1] for s in steps)
        kind, fields = parse(f"done peer=1 outer={last} inner={10 * last} val={done} "
                             "digest=ab") or ("", {})
        rec.line(0.0, 1, kind, fields)
    rec.close()
    return rec


def verdict(rec: Record, **run: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    info = summary(rec, **{"churn": None, "kills": 0, "kills_not_done": None, **run})
    return (info, *judge(info))


def test_a_final_loss_over_3_percent_above_the_best_is_not_ok(tmp_path: Path) -> None:
    rec = record(tmp_path, *((s, k, 3, v) for s in (1, 2) for k, v in
                             enumerate(["4.0", "2.5", "2.0", "2.2"], 1)), done="2.2")
    info, problems, flags = verdict(rec)
    assert (info["best_val_loss"], info["best_val_outer"], info["final_val_loss"]) == (2.0, 3, 2.2)
    assert info["company_share"] == 1.0 and not flags
    assert problems == ["the final validation loss 2.2000 is 10.0 % above the run's best, 2.0000 "
                        "at outer step 3 (more than 3 %)"]
    shown = table({**info, "ok": False, "problems": problems, "failure": None})
    assert re.search(r"^ok +no: the final validation loss 2.2000 is 10.0 % above", shown, re.M)
    assert re.search(r"^final val loss +2.2 \(\+10.0 % on the best\)$", shown, re.M), shown
    assert re.search(r"^best val loss +2 \(outer step 3\)$", shown, re.M), shown


def test_within_3_percent_of_the_best_is_ok(tmp_path: Path) -> None:
    final = f"{2.0 * (1 + WORSE) - 1e-4:.4f}"
    rec = record(tmp_path, (1, 1, 2, "4.0"), (1, 2, 2, "2.0"), (1, 3, 2, "nan"), done=final)
    info, problems, flags = verdict(rec)
    assert info["best_val_loss"] == 2.0 and info["final_val_loss"] == float(final)
    assert problems == [] and flags == []


def test_the_best_counts_the_final_loss_and_steps_not_evaluated_are_skipped(
        tmp_path: Path) -> None:
    rec = record(tmp_path, (1, 1, 2, "nan"), (1, 2, 2, "3.0"), (1, 3, 2, "nan"), done="2.5")
    info, problems, _ = verdict(rec)
    assert (info["best_val_loss"], info["best_val_outer"]) == (2.5, 3) and problems == []


def test_a_run_that_never_had_company_is_not_ok(tmp_path: Path) -> None:
    rec = record(tmp_path, *((1, k, 1, "2.0") for k in (1, 2, 3)), done="2.0")
    info, problems, _ = verdict(rec)
    assert info["company_share"] == 0.0
    assert problems == ["the run never had company: world 1 at every outer step"]


def test_a_run_mostly_alone_is_flagged(tmp_path: Path) -> None:
    """The README's FSDP command ran 89 % of its outer steps with world 1: flagged, not failed.
    A step's world is the largest any of its lines gave (a replica's two shards, a peer that
    reported it before it learned of a loss)."""
    worlds = [2, 2, 1, 1, 1, 1, 1, 1, 1]
    rec = record(tmp_path, *((1, k, w, "2.0") for k, w in enumerate(worlds, 1)),
                 (2, 3, 2, "2.0"), done="2.0")
    info, problems, flags = verdict(rec)
    assert info["company_share"] == pytest.approx(3 / 9)
    assert problems == [] and flags == ["67 % of the outer steps ran alone (world 1)"]
    assert "33 % of the outer steps ran with world >= 2" in table(info)


def test_kills_not_done_are_flagged(tmp_path: Path) -> None:
    rec = record(tmp_path, (1, 1, 3, "2.0"), done="2.0")
    _, problems, flags = verdict(rec, churn=20.0, kills=0, kills_not_done=1)
    assert problems == [] and flags == ["the run ended before its first kill (SIGKILL every 20 s)"]
    _, _, flags = verdict(rec, churn=8.0, kills=3, kills_not_done=1)
    assert flags == ["1 kill came due and did not happen (the group was not whole again before "
                     "the run ended or reached its last quarter)"]
    assert verdict(rec, churn=8.0, kills=3, kills_not_done=0)[2] == []
    assert verdict(rec)[2] == []  # no churn: nothing to miss


def launcher(tmp_path: Path, rec: Record, churn: float | None, budget: int = 1000
             ) -> Launcher:
    cfg = Config(Path("x.py"), 3, churn, tmp_path, 1, None, ["--inner-steps", str(budget)])
    bar = SimpleNamespace(total=None, n=0, refresh=lambda: None,
                          update=lambda k: setattr(bar, "n", bar.n + k))
    return Launcher(cfg, rec, bar)


def test_the_first_kill_is_not_done_when_the_run_ends_before_it(tmp_path: Path,
                                                                csv_record: Record) -> None:
    run = launcher(tmp_path, csv_record, 20.0)
    assert run.schedule(None, 0.0) is None  # no step yet: the clock waits for step 1
    run.outer = 1
    assert run.schedule(None, 5.0) == 25.0 and not run.due
    assert run.kills_not_done == 1  # the run ends here: before its first kill


def test_a_kill_due_and_not_done_counts_one_withheld_ones_do_not(tmp_path: Path,
                                                                 csv_record: Record) -> None:
    run = launcher(tmp_path, csv_record, 2.0)
    run.outer, run.kills = 1, 1
    at = run.schedule(None, 0.0)
    assert at == 2.0 and run.kills_not_done == 0
    assert run.schedule(at, 2.5) is None and run.due  # came due: waits for a whole group
    assert run.kills_not_done == 1  # the run ends here
    run.due, run.ending = False, True  # a peer printed done: kills are withheld
    at = run.schedule(None, 3.0)
    assert run.schedule(at, 5.5) is None and not run.due and run.kills_not_done == 0
    assert launcher(tmp_path, csv_record, None).kills_not_done is None
