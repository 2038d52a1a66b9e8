"""What the launcher keeps of a run: every protocol line of every peer as a CSV row (of a
fetch's ``fetch`` lines, the last), the digests of each outer step, and the series the plot
and the summary are made of.

The line protocol of the examples: ``kind key=value ...``, one event per line (see
``pccl_aio.launch``). Lines of other kinds (banners, warnings) are not rows.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

KINDS = frozenset({"joined", "step", "waiting", "admitted", "lost", "left", "failed", "fetch",
                   "done"})
COLUMNS = ("time", "kind", "seed", "shard", "peer", "outer", "inner", "world", "loss", "val",
           "sent", "digest", "detail")
_STEP_KEYS = ("peer", "outer", "inner", "world", "loss", "val", "sent", "digest")


def parse(text: str) -> tuple[str, dict[str, str]] | None:
    """``(kind, fields)`` of a protocol line, or None for a line of no known kind. A word
    without ``=`` continues the previous value (an error message with spaces)."""
    words = text.split()
    if not words or words[0] not in KINDS:
        return None
    fields: dict[str, str] = {}
    last = ""
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if eq and key.isidentifier():
            fields[key], last = value, key
        elif last:
            fields[last] += " " + word
    return words[0], fields


@dataclass(frozen=True)
class Step:
    """One ``step`` line: peer process ``seed`` (of shard ``shard`` when a replica has
    several processes) finished outer step ``outer``."""

    time: float  # seconds since the launcher started
    seed: int
    shard: int | None
    peer: str
    outer: int
    inner: int
    world: int
    loss: float
    val: float  # nan when not evaluated at this step
    sent: int  # cumulative bytes this process sent since it started
    digest: str


def _step(time: float, seed: int, shard: int | None, f: dict[str, str]) -> Step:
    """A Step from the fields of a step line; ValueError or KeyError if one is missing or bad."""
    return Step(time, seed, shard, f["peer"], int(f["outer"]), int(f["inner"]), int(f["world"]),
                float(f["loss"]), float(f["val"]), int(f["sent"]), f["digest"])


@dataclass
class Record:
    """The run so far; rows go to ``csv_path`` as they come (flushed: a crash keeps them)."""

    csv_path: Path
    steps: list[Step] = field(default_factory=list)
    # (outer step, shard) -> the digests reported: every replica's process of a shard holds
    # the same part of the model (shard None: a replica is one process)
    digests: dict[tuple[int, int | None], set[str]] = field(
        default_factory=lambda: defaultdict(set))
    # (seed, shard) -> the fields of its ``done`` line
    done: dict[tuple[int, int | None], dict[str, str]] = field(default_factory=dict)
    marks: list[tuple[str, int]] = field(default_factory=list)  # (kill|join, inner step)
    malformed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(self.csv_path, "w", newline="", encoding="utf-8")  # noqa: SIM115
        self._csv = csv.writer(self._file)
        self._csv.writerow(COLUMNS)

    def row(self, time: float, kind: str, seed: int | None, fields: dict[str, str],
            detail: str = "", shard: int | None = None) -> None:
        """One CSV row; ``fields`` fills the columns it names, the rest goes to ``detail`` (so
        does a ``world`` that is not a number, such as ``2->3`` of an ``admitted`` line)."""
        own = {k: v for k, v in fields.items()
               if k in COLUMNS and k not in ("time", "kind", "seed", "detail")
               and k != "shard" and (k != "world" or v.isdigit())}
        extra = ([f"{k}={v}" for k, v in fields.items() if k not in own]
                 + ([detail] if detail else []))
        cells = {"time": f"{time:.3f}", "kind": kind, "seed": "" if seed is None else str(seed),
                 "shard": "" if shard is None else str(shard), **own, "detail": " ".join(extra)}
        self._csv.writerow([cells.get(c, "") for c in COLUMNS])
        self._file.flush()

    def line(self, time: float, seed: int, kind: str, fields: dict[str, str],
             shard: int | None = None) -> Step | None:
        """Record one protocol line of process ``seed`` (its ``shard``); the Step if it is a
        valid step line. Of a ``fetch`` (progress of a shared-state fetch), only the last
        line is a row."""
        if kind == "fetch" and fields.get("done") != fields.get("total"):
            return None
        if kind in ("step", "done"):
            try:
                if kind == "done":
                    self.digests[int(fields["outer"]), shard].add(fields["digest"])
                    self.done[seed, shard] = fields
                else:
                    s = _step(time, seed, shard, fields)
                    self.steps.append(s)
                    self.digests[s.outer, shard].add(s.digest)
            except (KeyError, ValueError):
                self.malformed.append(f"seed {seed}: {kind} {fields}")
                self.row(time, "malformed", seed, {}, f"{kind} {fields}", shard)
                return None
        self.row(time, kind, seed, fields, shard=shard)
        return self.steps[-1] if kind == "step" else None

    def disagreeing(self) -> list[int]:
        """The outer steps whose digest (of a shard) is not the same on every process that
        reported it."""
        return sorted({k for (k, _), d in self.digests.items() if len(d) > 1})

    def series(self) -> list[tuple[int, int, float, float, float]]:
        """Per outer step reported: (outer, inner, mean train loss, mean val loss or nan,
        cumulative mean bytes sent per peer).

        A peer's bytes for step k are the increase of its cumulative ``sent`` since its previous
        step line (since 0 for its first: a joiner's counter starts when it starts), averaged
        over the peers reporting step k; the cumulative sum of those averages is the x axis of
        "validation loss against bytes sent per peer"."""
        last: dict[tuple[int, int], int] = {}
        by_outer: dict[int, list[tuple[Step, int]]] = defaultdict(list)
        for s in sorted(self.steps, key=lambda s: (s.seed, s.shard or 0, s.outer)):
            who = (s.seed, s.shard or 0)
            by_outer[s.outer].append((s, s.sent - last.get(who, 0)))
            last[who] = s.sent
        out: list[tuple[int, int, float, float, float]] = []
        total = 0.0
        for k in sorted(by_outer):
            group = by_outer[k]
            total += sum(inc for _, inc in group) / len(group)
            vals = [s.val for s, _ in group if not math.isnan(s.val)]
            out.append((k, max(s.inner for s, _ in group),
                        sum(s.loss for s, _ in group) / len(group),
                        sum(vals) / len(vals) if vals else math.nan, total))
        return out

    def company(self) -> float | None:
        """The share of the outer steps reported that ran with company: two replicas or more
        (the largest ``world`` of that step's lines); None before any step line."""
        worlds: dict[int, int] = {}
        for s in self.steps:
            worlds[s.outer] = max(worlds.get(s.outer, 0), s.world)
        return sum(w >= 2 for w in worlds.values()) / len(worlds) if worlds else None

    def close(self) -> None:
        self._file.close()
