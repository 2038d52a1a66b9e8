"""What the launcher writes: the plot (PNG), the summary table and its lines about group events."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .._text import plural
from .record import Record


def title(stem: str, peers: int, churn: float | None, kills: int, joins: int) -> str:
    """The plot's title: the example, its peers and, with churn, the kills and joins."""
    head = f"{stem}: {plural(peers, 'peer')}"
    if not churn:
        return head
    return f"{head}, SIGKILL every {churn:g} s, {plural(kills, 'kill')} / {plural(joins, 'join')}"


def group_event(kind: str, fields: dict[str, str], reporter: str, victim: str | None) -> str:
    """A peer's ``lost``/``left``/``admitted``/``failed`` line in words: what happened, to
    whom when the launcher knows (``victim``, the peer it killed last) and who reports it (a
    line's ``peer=`` is the reporter's id, not the lost peer's)."""
    where = [f"world {fields['world']}" if "world" in fields else "",
             f"outer step {fields['outer']}" if "outer" in fields else "",
             " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("peer", "world", "outer"))]
    detail = "; ".join(x for x in where if x)
    if kind == "failed":
        return f"{reporter} failed{f' ({detail})' if detail else ''}"
    if kind == "admitted":
        what = "admitted newcomers"
    else:
        what = f"lost {victim}, SIGKILLed by the launcher" if victim else "lost a peer"
    return f"{what}{f' ({detail})' if detail else ''}: reported by {reporter}"


def plot(record: Record, path: Path, title: str) -> bool:
    """Two panels, validation loss against inner steps and against bytes sent per peer, with
    the mean train loss and the kills and joins; False (no file) if no step was reported."""
    series = record.series()
    if not series:
        return False
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    inner = [s[1] for s in series]
    train = [s[2] for s in series]
    evaluated = [s for s in series if not math.isnan(s[3])]
    fig = Figure(figsize=(12, 4.6), dpi=100, layout="constrained")
    by_step, by_bytes = fig.subplots(1, 2)
    by_step.plot(inner, train, color="0.65", linewidth=1, label="train (mean over peers)")
    by_step.plot([s[1] for s in evaluated], [s[3] for s in evaluated], "o-", color="C0",
                 markersize=3, label="validation")
    labelled: set[str] = set()
    n = {k: sum(m[0] == k for m in record.marks) for k in ("kill", "join")}
    for kind, at in sorted(record.marks, key=lambda m: m[1]):
        color, name = (("C3", plural(n["kill"], "SIGKILL")) if kind == "kill"
                       else ("C2", f"{plural(n['join'], 'replacement')} joined"))
        by_step.axvline(at, color=color, linestyle=":", linewidth=1,
                        label=None if kind in labelled else name)
        labelled.add(kind)
    by_step.set(xlabel="inner step of the run", ylabel="loss", title="loss against inner steps")
    by_step.legend(fontsize="small")
    mib = [s[4] / 2**20 for s in evaluated]
    by_bytes.plot(mib, [s[3] for s in evaluated], "o-", color="C0", markersize=3)
    by_bytes.set(xlabel="MiB sent per peer", ylabel="validation loss",
                 title="validation loss against bytes sent per peer")
    for ax in (by_step, by_bytes):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.savefig(path, metadata={"Title": title})  # the title's words, readable in the file
    return True


def summary(record: Record, **run: Any) -> dict[str, Any]:
    """The JSON summary: ``run`` (example, peers, churn, ...) and what the record says: the
    final validation loss (of the ``done`` lines, else the last evaluated), the best one
    (of every outer step evaluated and the final) and the share of outer steps that ran with
    world >= 2 (``company_share``)."""
    series = record.series()
    done_vals = [float(f["val"]) for f in record.done.values()
                 if f.get("val", "nan") != "nan"]
    vals = [s[3] for s in series if not math.isnan(s[3])]
    final = sum(done_vals) / len(done_vals) if done_vals else vals[-1] if vals else None
    done_outer = [int(f["outer"]) for f in record.done.values() if f.get("outer", "").isdigit()]
    outer = max([*done_outer, *(s[0] for s in series)], default=0)
    evaluated = [(s[3], s[0]) for s in series if not math.isnan(s[3])]
    best = min([*evaluated, *([(final, outer)] if final is not None else [])], default=None)
    return {**run,
            "outer_steps": outer,
            "inner_steps": max((s[1] for s in series), default=0),
            "company_share": record.company(),
            "best_val_loss": None if best is None else best[0],
            "best_val_outer": None if best is None else best[1],
            "final_val_loss": final,
            "bytes_sent_per_peer": round(series[-1][4]) if series else 0,
            "digests_agree": not record.disagreeing() if record.digests else None}


def table(summary: dict[str, Any]) -> str:
    """The summary as aligned ``name  value`` lines."""
    def show(k: str, v: Any) -> str:
        if k == "company_share" and v is not None:
            return f"{100 * v:.0f} % of the outer steps ran with world >= 2"
        if k == "best_val_loss" and v is not None:
            return f"{v:.4g} (outer step {summary.get('best_val_outer')})"
        if k == "final_val_loss" and v is not None and summary.get("best_val_loss"):
            return f"{v:.4g} ({100 * (v / summary['best_val_loss'] - 1):+.1f} % on the best)"
        if k == "ok":
            why = summary.get("problems") or ([] if summary.get("failure") is None else
                                              ["the run failed (below)"])
            return "yes" if v else "no" + (": " + "; ".join(why) if why else "")
        if isinstance(v, bool):
            return "yes" if v else "NO"
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, list):
            return "; ".join(map(str, v)) or "-"
        return "-" if v is None else str(v)

    rows = [(k.replace("_", " "), show(k, v)) for k, v in summary.items()
            if k not in ("problems", "best_val_outer")]
    if summary.get("churn"):
        rows = [(k, f"SIGKILL every {v} s" if k == "churn" else v) for k, v in rows]
    rows = [(k, f"{v} ({int(v) / 2**20:.2f} MiB)" if k.startswith("bytes") else v)
            for k, v in rows]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
