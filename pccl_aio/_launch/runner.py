"""A launched run: its master, the replicas, churn, progress and the verdict (each process is
a ``procs.Child``, started by ``start.Starter``)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .._net.credentials import SECRET_ENV, SECRET_FILE_ENV
from .._peer.state.progress import ProgressFn, progress_bar
from .._text import plural
from .procs import Child as Child
from .procs import die_with_parent
from .record import Record, parse
from .report import group_event
from .start import Config as Config
from .start import Starter

_END_OF_CHURN = 0.75  # no kill after this fraction of the run's outer steps (when known)
_GRACE = 5.0  # s a stopped process has between SIGTERM and SIGKILL


def _inner_steps(peer_args: list[str]) -> int | None:
    """The run's ``--inner-steps`` if given after ``--`` (the example's default is unknown)."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--inner-steps", type=int)
    try:
        value: int | None = ap.parse_known_args(peer_args)[0].inner_steps
    except SystemExit:
        return None
    return value


class Launcher(Starter):
    """Runs the example's replicas against a fresh master until they finish; ``run()``
    returns the failure (None: success). Every child is killed when it returns or raises."""

    def __init__(self, cfg: Config, record: Record, bar: Any) -> None:
        self.cfg, self.record, self.bar = cfg, record, bar
        self.rng = random.Random(cfg.seed)
        self.secret = secrets.token_hex(16)
        self.queue: asyncio.Queue[tuple[Child | None, str, str | None]] = asyncio.Queue()
        self.children: list[Child] = []
        self.master: Child | None = None
        self.address = ""
        self.tasks: list[asyncio.Task[None]] = []
        self.t0 = time.monotonic()
        self.next_seed = cfg.seed
        self.kills = self.joins = self.late = 0
        self.due = False  # a kill came due, waiting for the group to be whole again
        self.outer = self.inner = self.world = 0
        self.val = math.nan
        self.total: int | None = None
        self.inner_budget = _inner_steps(cfg.peer_args)
        self.ending = False  # a peer printed done: no more kills, late replacements stop
        self.interrupted: int | None = None  # the signal that ended the run
        self.said: tuple[str, str, int] = ("", "", 0)  # the last group event shown
        self.victims: list[Child] = []  # the last replica killed, until its replacement joined
        self.fetching: dict[Child, ProgressFn] = {}  # a bar per joiner fetching the state
        self.preexec = die_with_parent()
        root = str(Path(__file__).resolve().parents[2])  # the pccl_aio the launcher runs
        path = os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH")) if x)
        self.env = {k: v for k, v in os.environ.items() if k != SECRET_FILE_ENV}
        self.env.update({SECRET_ENV: self.secret, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"})

    def now(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        self.bar.write(f"[{self.now():7.2f}s] {text}", file=sys.stderr)

    def progress(self) -> None:
        digests = "DIFFER" if self.record.disagreeing() else "agree"
        val = "-" if math.isnan(self.val) else f"{self.val:.4f}"
        self.bar.set_postfix_str(f"world={self.world} val={val} kills={self.kills} "
                                 f"joins={self.joins} digests={digests}")

    # --- the run ---------------------------------------------------------------------------

    async def run(self) -> str | None:
        """Start everything and follow the run to its end; the failure, or None."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.queue.put_nowait, (None, "signal", sig.name))
        try:
            (self.cfg.out / "logs").mkdir(parents=True, exist_ok=True)
            try:
                await self.start_master()
            except RuntimeError as exc:
                return str(exc)
            self.say(f"master on {self.address}; starting {plural(self.cfg.peers, 'peer')} of "
                     f"{self.cfg.example}")
            for _ in range(self.cfg.peers):
                await self.start_replica(replacement=False)
            return await self._follow()
        finally:
            await self.close()  # a signal meanwhile is queued and ignored
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _follow(self) -> str | None:
        deadline = None if self.cfg.timeout is None else self.t0 + self.cfg.timeout
        churn_at: float | None = None  # when the next kill is due
        while any(c.code is None for c in self.children):
            wake = min((t for t in (deadline, churn_at) if t is not None), default=None)
            try:
                timeout = None if wake is None else max(0.0, wake - time.monotonic())
                child, what, text = await asyncio.wait_for(self.queue.get(), timeout)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    return f"timeout: the run did not finish within {self.cfg.timeout:g} s"
                child, what, text = None, "tick", None
            if what == "signal":
                self.interrupted = getattr(signal, str(text))
                return f"interrupted by {text}"
            failure = self._handle(child, what, text)
            if failure:
                return failure
            churn_at = self.schedule(churn_at, time.monotonic())
            if self.due and self._may_kill():
                await self._kill_one()
                self.due = False
            if self.ending:
                self._stop_latecomers()
        return self._verdict()

    def _handle(self, child: Child | None, what: str, text: str | None) -> str | None:
        if child is None:
            return None
        if child is self.master:
            return f"the master exited with status {child.proc.returncode}:\n" \
                   f"{child.stderr_tail()}"
        if what == "exit":
            return self._exited(child)
        parsed = parse(text or "")
        if parsed is None:
            return None
        kind, fields = parsed
        assert child.seed is not None
        step = self.record.line(self.now(), child.seed, kind, fields, child.shard)
        if kind == "joined":
            child.peer = fields.get("peer", "?")
        elif kind == "done":
            child.done = self.ending = True
        elif kind == "fetch" and all(fields.get(k, "").isdigit() for k in ("done", "total")):
            bar = self.fetching.setdefault(child, progress_bar(  # below the run's bar
                f"{child.name}: shared state", position=1, leave=False, file=sys.stderr))
            bar(int(fields["done"]), int(fields["total"]))
        elif kind == "step" and step is None:
            self.say(f"{child.name}: malformed {kind} line: {(text or '').strip()}")
        elif step is not None:
            if child.replacement and not any(c.stepped for c in self.replica(child.seed)):
                self.joins += 1
                self.victims = []  # the group is whole again
                self.record.marks.append(("join", step.inner))
                self.say(f"{child.name} (peer {child.peer}) joined the run at outer step "
                         f"{step.outer}")
            child.stepped = True
            self._advance(step.outer, step.inner, step.world, step.val)
            self.progress()
        elif kind in ("lost", "left", "failed", "admitted"):
            said = (kind, fields.get("world", ""), self.outer)  # the group's peers say it all
            if said != self.said:
                self.said = said
                self.say(self._group_event(child, kind, fields))
        return None

    def _group_event(self, child: Child, kind: str, fields: dict[str, str]) -> str:
        v = next((x for x in self.victims if x.shard == child.shard), None)  # (its group's)
        return group_event(kind, fields, f"peer {child.peer or fields.get('peer', '?')} "
                           f"({child.name})", None if v is None else f"peer {v.peer} ({v.name})")

    def _advance(self, outer: int, inner: int, world: int, val: float) -> None:
        if self.inner_budget and outer and inner:  # from the latest step: the first ones of
            total = math.ceil(self.inner_budget / (inner / outer))  # streaming and async
            if total != self.total:  # DiLoCo say too little of the run's pace
                self.total = self.bar.total = total
                self.bar.refresh()
        if outer > self.outer:
            self.bar.update(outer - self.outer)
            self.outer, self.inner, self.world = outer, inner, world
        if outer == self.outer and not math.isnan(val):
            self.val = val

    def _exited(self, child: Child) -> str | None:
        child.code = code = child.proc.returncode
        assert child.seed is not None and code is not None
        self.record.row(self.now(), "exit", child.seed, {"peer": child.peer},
                        f"status={code}" + (" killed" if child.killed else "")
                        + (" stopped" if child.stopped else ""), child.shard)
        if child.killed or child.stopped or (code == 0 and child.done):
            return None
        if self.ending and not child.stepped:
            self.late += 1
            self.say(f"{child.name} exited with status {code}: it came after the run's end")
            return None
        why = "without printing done" if code == 0 else f"with status {code}"
        return (f"{child.name} exited {why} before the end of the run (stderr: "
                f"{child.err_path}); its last lines:\n{child.stderr_tail()}")

    def replica(self, seed: int | None) -> list[Child]:
        """The processes of replica ``seed``."""
        return [c for c in self.children if c.seed == seed]

    def _active(self) -> list[int]:
        """The replicas (seeds) whose every process holds the run's state and trains."""
        seeds = dict.fromkeys(c.seed for c in self.children if c.seed is not None)
        return [s for s in seeds if all(c.code is None and c.stepped and not (
            c.done or c.killed or c.stopped) for c in self.replica(s))]

    def schedule(self, churn_at: float | None, now: float) -> float | None:
        """With churn: arm the clock at the first outer step and again after each kill, and
        when its time came mark a kill due (``due``) unless kills are withheld by then; the
        time the next kill comes due (None: not armed)."""
        if self.cfg.churn and self.outer and churn_at is None and not self.due:
            churn_at = now + self.cfg.churn
        if churn_at is not None and now >= churn_at:
            churn_at, self.due = None, not self._withheld()
        return churn_at

    def _withheld(self) -> bool:
        """No kill after a peer finished, nor in the last quarter of the run's outer steps."""
        return self.ending or (self.total is not None and
                               self.outer >= _END_OF_CHURN * self.total)

    def _may_kill(self) -> bool:
        """One replica down at a time (every replacement took part before the next kill),
        none when withheld."""
        return not self._withheld() and len(self._active()) >= self.cfg.peers

    @property
    def kills_not_done(self) -> int | None:
        """With churn: the kill that came due and did not happen (the group was not whole
        again when the run ended, or reached its last quarter), or the first one when none
        happened (the run ended first); None without churn."""
        if not self.cfg.churn:
            return None
        return 1 if self.due or not self.kills else 0

    async def _kill_one(self) -> None:
        """SIGKILL a random replica whole (each of its processes) and start a replacement."""
        victims = self.replica(self.rng.choice(self._active()))
        for v in victims:
            v.killed = True
            v.signal(signal.SIGKILL)
        self.victims = victims
        self.kills += 1
        self.record.marks.append(("kill", self.inner))
        for v in victims:
            self.record.row(self.now(), "kill", v.seed, {"peer": v.peer, "outer": str(self.outer),
                                                         "inner": str(self.inner)},
                            "SIGKILL", v.shard)
        started = await self.start_replica(replacement=True)
        what = ", ".join(f"{v.name} (peer {v.peer})" for v in victims)
        self.say(f"SIGKILLed {what} after outer step {self.outer}; started "
                 f"{', '.join(c.name for c in started)}")
        self.progress()

    def _stop_latecomers(self) -> None:
        """Once every peer that held the state has ended, a replacement still waiting for
        company came too late: stop it (SIGTERM, SIGKILL after a grace period)."""
        if any(c.code is None and (c.stepped or c.done) and not c.killed for c in self.children):
            return
        loop = asyncio.get_running_loop()
        for c in self.children:
            if c.code is None and not c.stopped:
                c.stopped = True
                self.late += 1
                self.say(f"stopping {c.name}: it started too late to join the run")
                c.signal(signal.SIGTERM)
                loop.call_later(_GRACE, c.signal, signal.SIGKILL)

    def _verdict(self) -> str | None:
        bad = self.record.disagreeing()
        if bad:
            return f"the digests of the peers differ at outer steps {bad}"
        if self.record.malformed:
            return f"{len(self.record.malformed)} malformed protocol lines, e.g. " \
                   f"{self.record.malformed[0]}"
        if not self.record.done:
            return "no peer finished the run (no done line)"
        return None

    async def close(self) -> None:
        """Kill every child still running (their process groups), then the master."""
        for c in self.children:
            c.signal(signal.SIGKILL)
        if self.master is not None:
            self.master.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.master.proc.wait(), _GRACE)
            except TimeoutError:
                self.master.signal(signal.SIGKILL)
        everyone = [*self.children, *([self.master] if self.master else [])]
        await asyncio.gather(*(c.proc.wait() for c in everyone))
        for c in self.children:
            if c.code is None:  # its exit was not handled: killed here
                c.code = c.proc.returncode
                self.record.row(self.now(), "exit", c.seed, {"peer": c.peer},
                                f"status={c.code} killed-by-launcher", c.shard)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
