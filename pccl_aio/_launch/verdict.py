"""The launcher's verdict on what a run trained, from its summary (``report.summary``): the
problems that make it not ok (``ok no``, exit status 1) and what it flags without failing.

A run is not ok when its final validation loss is clearly worse than its own best (more than
``WORSE`` above it: the training got undone on the way, e.g. after a joiner came in) or when it
never had company (world 1 at every outer step: nothing was averaged). It is flagged when most
of its outer steps ran alone (less than ``COMPANY`` of them with world >= 2) and, with churn,
when a kill that came due did not happen because the run ended first (or none happened)."""

from __future__ import annotations

from typing import Any

__all__ = ["COMPANY", "WORSE", "judge"]

WORSE = 0.03  # "clearly worse": the final validation loss more than 3 % above the best
COMPANY = 0.5  # flagged below this share of outer steps run with world >= 2


def judge(summary: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(problems, flags)`` of a run's summary, each a list of sentences; ``ok`` needs no
    problem. Keys read: ``best_val_loss``, ``best_val_outer``, ``final_val_loss``,
    ``company_share``, ``churn``, ``kills``, ``kills_not_done``."""
    problems: list[str] = []
    flags: list[str] = []
    best, final = summary.get("best_val_loss"), summary.get("final_val_loss")
    if best is not None and final is not None and final > best * (1 + WORSE):
        problems.append(f"the final validation loss {final:.4f} is {100 * (final / best - 1):.1f}"
                        f" % above the run's best, {best:.4f} at outer step "
                        f"{summary.get('best_val_outer')} (more than {100 * WORSE:g} %)")
    share = summary.get("company_share")
    if share == 0:
        problems.append("the run never had company: world 1 at every outer step")
    elif share is not None and share < COMPANY:
        flags.append(f"{100 * (1 - share):.0f} % of the outer steps ran alone (world 1)")
    missed = summary.get("kills_not_done") or 0
    if summary.get("churn") and missed:
        flags.append(f"the run ended before its first kill (SIGKILL every {summary['churn']:g} s)"
                     if not summary.get("kills") else
                     f"{missed} kill{'s' * (missed != 1)} came due and did not happen (the "
                     "group was not whole again before the run ended or reached its last "
                     "quarter)")
    return problems, flags
