"""Shared-state election, sans-IO: the votes of one peer group in, a sync plan out.

Rules (PCCL §2.8, with its bugs fixed):

1. Revision. On a group's first sync after a master start the highest offered revision is the
   target (checkpoint resume, independent of vote order); afterwards the target is the last
   one + 1, or the last one again if no voter advanced (a repeated sync). A voter above the
   target broke the one-increment rule and is kicked; below it is *outdated* and fetches.
2. Layout. The most common entry layout (names, dtypes, byte sizes, inequality flags; order
   does not matter) wins; a voter with another layout is kicked, the others go on.
3. Content. Among up-to-date voters that are not RECEIVE_ONLY, the most popular set of hashes
   wins (ties: the set held by the lowest peer id). No such voter: the sync fails for all.
4. Strategies. If any voter uses ENFORCE_POPULAR, voters using another strategy are kicked.
   A SEND_ONLY voter whose content lost is kicked.
5. Plan. Up-to-date voters holding the winning content are the sources. Every other voter
   fetches the entries whose hash differs from the winner's; entries that allow content
   inequality are not compared, but a never-synced outdated voter (a joiner) fetches them too
   (unless it is SEND_ONLY, which never receives).

Layout and strategy are checked first, so a voter kicked for them cannot set the revision.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from ..._types import DTYPE_ITEMSIZE, SyncStrategy
from ..._wire import messages as m


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What one voter does: fetch ``keys`` (expecting ``hashes``) from ``sources``."""

    keys: list[str]
    hashes: list[bytes]


@dataclasses.dataclass(slots=True)
class Election:
    revision: int = 0
    kicks: dict[int, str] = dataclasses.field(default_factory=dict)
    failed: str = ""
    sources: list[int] = dataclasses.field(default_factory=list)
    plans: dict[int, Plan] = dataclasses.field(default_factory=dict)


def _layout(v: m.VoteSync) -> tuple[tuple[str, int, int, bool], ...]:
    return tuple(sorted((e.key, e.dtype, e.nbytes, e.allow_inequality) for e in v.entries))


def _content(v: m.VoteSync) -> tuple[tuple[str, bytes], ...]:
    return tuple(sorted((e.key, e.hash) for e in v.entries if not e.allow_inequality))


def layout_difference(p: int, vote: m.VoteSync, holders: list[int], won: m.VoteSync) -> str:
    """Why voter ``p``'s layout lost to the one ``holders`` share (``won``): the first key
    (in sorted order) whose entry differs, with both sides' dtype and size."""
    mine, theirs = ({e.key: e for e in v.entries} for v in (vote, won))
    key = next((k for k in sorted(mine.keys() | theirs.keys())
                if _entry(mine.get(k)) != _entry(theirs.get(k))), "")
    who = ", ".join(map(str, holders))
    return (f"shared-state keys, dtypes or sizes differ from the other peers': key "
            f"{_short(key)} is {_describe(mine.get(key))} on peer {p} but "
            f"{_describe(theirs.get(key))} on peer{'s' * (len(holders) > 1)} {who}")


def _entry(e: m.SyncEntry | None) -> tuple[int, int, bool] | None:
    return None if e is None else (e.dtype, e.nbytes, e.allow_inequality)


def _describe(e: m.SyncEntry | None) -> str:
    if e is None:
        return "absent"
    dtype = _DTYPES.get(e.dtype)
    label, size = ((dtype.label, DTYPE_ITEMSIZE[dtype]) if dtype is not None
                   else (f"dtype {e.dtype}", 1))
    loose = ", content may differ" if e.allow_inequality else ""
    n = e.nbytes // size
    return f"{label}, {n} element{'s' * (n != 1)} ({e.nbytes} B{loose})"


_DTYPES = {int(d): d for d in DTYPE_ITEMSIZE}


def _short(key: str) -> str:
    return repr(key if len(key) <= 64 else key[:61] + "...")


def elect(votes: dict[int, m.VoteSync], last_revision: int | None) -> Election:
    """Decide one group's sync from the votes of all its accepted peers."""
    out = Election()
    if not votes:
        return out
    live = dict(votes)
    # 1a. one-increment rule: skipping ahead of the last revision + 1 is a violation
    if last_revision is not None:
        out.revision = last_revision + 1 if any(
            v.revision > last_revision for v in votes.values()) else last_revision
        for p, v in list(live.items()):
            if v.revision > last_revision + 1:
                out.kicks[p] = (f"revision {v.revision} skips ahead of {last_revision + 1}: "
                                "revisions must advance by exactly one per sync")
                del live[p]
    # 2. layout (before the resume revision, so that a kicked voter cannot set it)
    if live:
        layouts = Counter(_layout(v) for v in live.values())
        best = max(layouts.values())
        winner_layout = min((lay for lay, n in layouts.items() if n == best),
                            key=lambda lay: min(p for p, v in live.items() if _layout(v) == lay))
        holders = sorted(p for p, v in live.items() if _layout(v) == winner_layout)
        for p, v in list(live.items()):
            if _layout(v) != winner_layout:
                out.kicks[p] = layout_difference(p, v, holders, live[holders[0]])
                del live[p]
    # 4a. strategy mix
    if any(v.strategy == SyncStrategy.ENFORCE_POPULAR for v in live.values()):
        for p, v in list(live.items()):
            if v.strategy != SyncStrategy.ENFORCE_POPULAR:
                out.kicks[p] = (f"strategy {SyncStrategy(v.strategy).name} mixed with "
                                "ENFORCE_POPULAR in one sync")
                del live[p]
    # 1b. the target comes from the voters still in: on the first sync after a master start
    # the highest revision (resume), later last + 1 if one of them advanced, else last again
    if live:
        if last_revision is None:
            out.revision = max(v.revision for v in live.values())
        elif all(v.revision <= last_revision for v in live.values()):
            out.revision = last_revision
    target = out.revision
    # 3. content among up-to-date candidates
    cands = {p: v for p, v in live.items()
             if v.revision == target and v.strategy != SyncStrategy.RECEIVE_ONLY}
    if not cands:
        out.failed = (f"no up-to-date peer can provide revision {target} of the shared state"
                      if live else "every peer of the group was kicked")
        return out
    counts = Counter(_content(v) for v in cands.values())
    best = max(counts.values())
    win = min((c for c, n in counts.items() if n == best),
              key=lambda c: min(p for p, v in cands.items() if _content(v) == c))
    winner = dict(win)
    # 4b. SEND_ONLY peers must hold the winning content
    for p, v in list(live.items()):
        if v.strategy == SyncStrategy.SEND_ONLY and _content(v) != win:
            out.kicks[p] = "SEND_ONLY peer's shared state lost the election"
            del live[p]
    # 5. plans
    out.sources = sorted(p for p, v in cands.items() if _content(v) == win)
    for p, v in live.items():
        if p in out.sources:
            continue
        keys, hashes = [], []
        for e in v.entries:
            if e.allow_inequality:
                if v.revision < target and v.fresh and v.strategy != SyncStrategy.SEND_ONLY:
                    keys.append(e.key)
                    hashes.append(b"")
            elif winner[e.key] != e.hash:
                keys.append(e.key)
                hashes.append(winner[e.key])
        out.plans[p] = Plan(keys, hashes)
    return out
