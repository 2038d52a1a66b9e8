"""A harness for the examples' line protocol: start N peers of an example against the
``master_proc`` fixture, SIGKILL one after a given outer step, start a joiner once the
survivors saw the group shrink, run to the end and check what the peers printed.

    peers = await run_example(procs, addr, "ddp.py", "--tiny", "--inner-steps", "300",
                              kill_after=3, join=True)

The joiner process is started with the others, imports torch and the example's module
(``preload``) and then waits on its stdin until released: it joins within a second however
slow imports are on the machine. Checks (``AssertionError`` on the first that fails): only
protocol lines on stdout; no peer repeats or skips an outer step; the digest of each outer
step is the same on every peer that printed it; every peer not killed prints ``done`` with
the same outer step, digest and validation loss and exits 0; the victim was killed, the
survivors logged the loss (``lost`` or ``left``) and the newcomer (``admitted``), and the
joiner printed steps after joining a run in progress.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from collections import defaultdict

from tests.process.procs import HERE, Proc, spawn

EXAMPLES = HERE.parent.parent / "examples"
KINDS = {"joined", "step", "waiting", "admitted", "failed", "lost", "left", "done"}

# Runs the example (argv[1]) after the modules named in argv[2] (comma-separated, imported
# from the example's directory) were imported and a line arrived on stdin.
_GATE = """import importlib, os, runpy, sys
script, preload = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
sys.path.insert(0, os.path.dirname(script))
for name in filter(None, preload.split(",")):
    importlib.import_module(name)
sys.stdin.readline()
runpy.run_path(script, run_name="__main__")
"""


def fields(line: str) -> dict[str, str]:
    """``kind key=value ...`` as a dict with the kind under ``"kind"``."""
    kind, *pairs = line.split()
    assert all("=" in p for p in pairs), line
    return {"kind": kind, **dict(p.split("=", 1) for p in pairs)}


@dataclasses.dataclass
class Peer:
    """One example process and what it printed."""

    name: str
    seed: int
    proc: Proc
    steps: dict[int, str] = dataclasses.field(default_factory=dict)  # outer step -> digest
    worlds: dict[int, int] = dataclasses.field(default_factory=dict)  # outer step -> world
    lines: list[dict[str, str]] = dataclasses.field(default_factory=list)
    done: dict[str, str] | None = None
    exit: str | None = None  # why its stdout ended (stderr tail)
    killed: bool = False
    released: bool = True  # a gated joiner: released to connect

    def kinds(self) -> set[str]:
        return {f["kind"] for f in self.lines}


async def spawn_gated(name: str, script: str, *args: str, preload: str = "charlm") -> Proc:
    """Start ``script`` with its imports done, waiting for a line on stdin to run."""
    root = str(HERE.parent.parent)
    path = os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _GATE, script, preload, *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    return Proc(proc, name)


def release(peer: Peer) -> None:
    stdin = peer.proc.proc.stdin
    assert stdin is not None
    stdin.write(b"go\n")
    peer.released = True


async def _pump(peer: Peer, queue: asyncio.Queue[tuple[Peer, dict[str, str]]],
                line_timeout: float) -> None:
    """Forward ``peer``'s lines to ``queue`` until its stdout ends (then an ``exited``)."""
    while True:
        try:
            line = await peer.proc.line(timeout=line_timeout)
        except AssertionError as exc:  # stdout closed: the process ended
            peer.exit = str(exc)
            await queue.put((peer, {"kind": "exited"}))
            return
        except TimeoutError:
            await queue.put((peer, {"kind": "silent"}))
            return
        await queue.put((peer, fields(line)))


def assert_parity(peers: list[Peer]) -> None:
    """The digest of every outer step is the same on every peer that printed it."""
    by_step: dict[int, dict[str, str]] = defaultdict(dict)
    for p in peers:
        for s, d in p.steps.items():
            by_step[s][p.name] = d
    assert by_step, "no peer printed a step"
    split = {s: d for s, d in by_step.items() if len(set(d.values())) > 1}
    assert not split, f"digests differ at outer steps {sorted(split)}: {split}"


async def run_example(procs: list[Proc], addr: str, script: str, *args: str, peers: int = 3,
                      kill_after: int | None = None, join: bool = False,
                      preload: str = "charlm", line_timeout: float = 60.0) -> list[Peer]:
    """Run ``examples/<script>`` with ``args`` on ``peers`` peers (seeds 1..peers, all
    waiting for each other); SIGKILL the last after it printed outer step ``kill_after``;
    with ``join``, release a joiner (seed peers + 1) once the survivors printed a step
    without the victim (without a kill: once each printed a step). Checks as the module says;
    returns the peers (the victim last but one, the joiner last)."""
    path = str(EXAMPLES / script)
    common = ("--master", addr, "--min-peers", str(peers), *args)
    group = []
    for seed in range(1, peers + 1):
        group.append(Peer(f"peer{seed}", seed, await spawn(f"peer{seed}", path, "--seed",
                                                           str(seed), *common)))
    if join:
        seed = peers + 1
        proc = await spawn_gated(f"peer{seed}", path, "--seed", str(seed), *common,
                                 preload=preload)
        group.append(Peer(f"peer{seed}", seed, proc, released=False))
    procs.extend(p.proc for p in group)
    victim = group[peers - 1] if kill_after is not None else None
    joiner = group[-1] if join else None
    survivors = [p for p in group[:peers] if p is not victim]
    queue: asyncio.Queue[tuple[Peer, dict[str, str]]] = asyncio.Queue()
    pumps = [asyncio.ensure_future(_pump(p, queue, line_timeout)) for p in group]
    t0, timeline = time.monotonic(), {}  # what happened when (printed: pytest -s shows it)

    def mark(what: str, at: int) -> None:
        timeline.setdefault(what, f"{time.monotonic() - t0:.2f}s@{at}")

    try:
        running = set(range(len(group)))
        while running:
            peer, f = await queue.get()
            kind = f["kind"]
            assert kind != "silent", f"{peer.name} printed nothing for {line_timeout} s"
            if kind == "exited":
                running.discard(group.index(peer))
                assert peer.killed or peer.done is not None, f"{peer.name} died: {peer.exit}"
                if joiner is not None and not joiner.steps and all(
                        p.done is not None for p in survivors):
                    joiner.proc.signal(signal.SIGKILL)
                    raise AssertionError("the run ended before the joiner took a step "
                                         f"(released: {joiner.released}); lengthen it")
                continue
            assert kind in KINDS, (peer.name, f)
            assert peer.done is None, f"{peer.name} printed after done: {f}"
            peer.lines.append(f)
            assert f["peer"].lstrip("-").isdigit(), f
            if kind == "done":
                peer.done = f
                mark(f"{peer.name} done", int(f["outer"]))
            if kind != "step":
                continue
            s = int(f["outer"])
            assert s not in peer.steps, f"{peer.name} printed outer step {s} twice"
            assert not peer.steps or s == max(peer.steps) + 1, (peer.name, s, peer.steps)
            peer.steps[s], peer.worlds[s] = f["digest"], int(f["world"])
            if victim is not None and peer is victim and s >= kill_after and not victim.killed:
                victim.proc.signal(signal.SIGKILL)
                victim.killed = True
                mark(f"{victim.name} killed", s)
            if joiner is not None and not joiner.released and (
                    all(p.steps for p in survivors) if victim is None else victim.killed and
                    all(peers - 1 in p.worlds.values() for p in survivors)):
                release(joiner)
                mark(f"{joiner.name} released", s)
            mark("first step", s)
            if peer is joiner:
                mark(f"{peer.name} first step", s)
        for p in group:
            code = await p.proc.proc.wait()
            assert code == (-signal.SIGKILL if p.killed else 0), (p.name, code, p.exit)
    finally:
        for t in pumps:
            t.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        print(f"{script}: {timeline}")
    _check(group, victim, joiner, survivors, kill_after)
    return group


def _check(group: list[Peer], victim: Peer | None, joiner: Peer | None,
           survivors: list[Peer], kill_after: int | None) -> None:
    assert_parity(group)
    finishers = [*survivors, *([joiner] if joiner else [])]
    dones = [p.done for p in finishers]
    assert all(d is not None for d in dones), dones
    for p in finishers:
        assert p.done is not None and p.steps, p.name
        last = max(p.steps)
        assert p.done["outer"] == str(last) and p.done["digest"] == p.steps[last], (p.name,
                                                                                  p.done)
    for key in ("outer", "inner", "digest", "val"):
        assert len({d[key] for d in dones if d}) == 1, (key, dones)
    for p in survivors:  # from the first step to the last, no gap
        assert sorted(p.steps) == list(range(1, max(p.steps) + 1)), (p.name, sorted(p.steps))
    if victim is not None:
        assert victim.killed and kill_after is not None and victim.steps, victim.name
        for p in survivors:
            assert p.kinds() & {"lost", "left"}, (p.name, p.lines)
    if joiner is not None:
        first = min(joiner.steps)
        assert first > 1 and (victim is None or first > max(victim.steps)), (first, victim)
        for p in survivors:  # admitted the joiner (after the loss, if any)
            kinds = [f["kind"] for f in p.lines]
            since = min((kinds.index(k) for k in ("lost", "left") if k in kinds), default=0)
            assert any(f["kind"] == "admitted" and f["world"].endswith(f"->{len(survivors) + 1}")
                       for f in p.lines[since:]), (p.name, p.lines)
