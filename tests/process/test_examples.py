"""examples/numpy_diloco.py as real processes: a clean run, a run with a SIGKILL and a joiner.

Every outer step prints a digest of the outer parameters; the peers of a run must print the
same digest for the same step, whoever joined or died on the way. The example's default run
lasts about a minute (for trying it by hand); the tests pass ``--inner-time 0``."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from pathlib import Path

import pytest

from tests.process.procs import Proc, spawn

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "numpy_diloco.py")
MODES = pytest.mark.parametrize("extra", [[], ["--overlap"]], ids=["sync", "overlap"])


def _fields(line: str) -> dict[str, str]:
    head, *pairs = line.split()
    return {"kind": head.split("=")[0], **dict(p.split("=", 1) for p in [head, *pairs] if "=" in p)}


async def _lines(proc: Proc, queue: asyncio.Queue) -> None:
    """Forward ``proc``'s step and done lines to ``queue`` until it ends."""
    while True:
        try:
            line = await proc.line(timeout=60)
        except AssertionError:
            await queue.put((proc.name, {"kind": "exited"}))
            return
        await queue.put((proc.name, _fields(line)))


async def _start(procs: list[Proc], addr: str, seed: int, *args: str) -> Proc:
    p = await spawn(f"peer{seed}", EXAMPLE, "--master", addr, "--seed", str(seed), *args)
    procs.append(p)
    return p


def _assert_parity(steps: dict[str, dict[int, str]]) -> None:
    by_step: dict[int, set[str]] = defaultdict(set)
    for seen in steps.values():
        for s, digest in seen.items():
            by_step[s].add(digest)
    assert by_step and all(len(d) == 1 for d in by_step.values()), by_step


@MODES
async def test_diloco_runs_to_the_end_with_one_outer_state(procs, master_proc, extra):
    _, addr = master_proc
    peers = [await _start(procs, addr, seed, "--steps", "6", "--inner", "10", "--inner-time",
                          "0", "--min-peers", "3", *extra) for seed in (1, 2, 3)]
    queue: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.ensure_future(_lines(p, queue)) for p in peers]
    steps: dict[str, dict[int, str]] = defaultdict(dict)
    done: dict[str, dict[str, str]] = {}
    while len(done) < 3:
        name, f = await asyncio.wait_for(queue.get(), 60)
        assert f["kind"] != "exited" or name in done, (name, steps)
        if f["kind"] == "step":
            steps[name][int(f["step"])] = f["outer"]
        elif f["kind"] == "done":
            done[name] = f
    await asyncio.gather(*pumps)
    assert {f["step"] for f in done.values()} == {"6"}
    assert len({f["outer"] for f in done.values()}) == 1, done
    assert all(sorted(s) == list(range(1, 7)) for s in steps.values()), steps
    _assert_parity(steps)
    for p in peers:
        assert await p.proc.wait() == 0


@MODES
async def test_diloco_keeps_one_outer_state_through_a_sigkill_and_a_joiner(
        procs, master_proc, extra):
    """Three peers; peer 2 is SIGKILLed after its third step, the survivors go on as two,
    a fourth peer joins mid-run and takes part. Digests agree step by step throughout, and
    each survivor logs the loss (``lost`` or ``left``) and the newcomer (``admitted``)."""
    _, addr = master_proc
    args = ("--steps", "100000", "--inner", "20", "--inner-time", "0", "--min-peers", "3",
            *extra)  # ended by the test
    peers = {seed: await _start(procs, addr, seed, *args) for seed in (1, 2, 3)}
    queue: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.ensure_future(_lines(p, queue)) for p in peers.values()]
    steps: dict[str, dict[int, str]] = defaultdict(dict)
    worlds: dict[str, list[int]] = defaultdict(list)
    logged: dict[str, list[dict[str, str]]] = defaultdict(list)  # group changes, per peer
    killed = joined = False
    while True:
        name, f = await asyncio.wait_for(queue.get(), 60)
        if f["kind"] == "exited":
            assert name == "peer2" and killed, (name, steps)
            continue
        assert f["kind"] in ("running", "joined", "step", "waiting", "admitted", "lost",
                             "left"), (name, f)
        if f["kind"] != "step":
            logged[name].append(f)
            continue
        s = int(f["step"])
        assert s not in steps[name], (name, s)
        steps[name][s] = f["outer"]
        worlds[name].append(int(f["world"]))
        if not killed and name == "peer2" and s >= 3:
            peers[2].signal(signal.SIGKILL)
            killed = True
        survivors_alone = all(2 in worlds[f"peer{i}"] for i in (1, 3))
        if killed and not joined and survivors_alone:
            peers[4] = await _start(procs, addr, 4, *args)
            pumps.append(asyncio.ensure_future(_lines(peers[4], queue)))
            joined = True
        if joined and len(steps["peer4"]) >= 3 and all(
                worlds[f"peer{i}"][-1] == 3 for i in (1, 3)):
            break
    for seed, p in peers.items():
        if seed != 2:
            p.signal(signal.SIGKILL)
    for t in pumps:
        t.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
    first_of_joiner = min(steps["peer4"])
    assert first_of_joiner > 3, steps["peer4"]  # it joined a run in progress
    for i in (1, 3):  # the survivors never skipped or repeated a step
        assert sorted(steps[f"peer{i}"]) == list(range(1, max(steps[f"peer{i}"]) + 1))
    _assert_parity(steps)
    for i in (1, 3):
        seen = logged[f"peer{i}"]
        assert any(f["kind"] in ("lost", "left") for f in seen), seen
        assert any(f["kind"] == "admitted" and f["world"] == "2->3" for f in seen), seen
