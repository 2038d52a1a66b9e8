"""``examples/fsdp_diloco.py`` under churn, as real processes: two replicas of two FSDP2
shards each (gloo inside a replica, shard i of every replica in pccl_aio peer group i); a third
replica joins the running two (admitted in both groups at the same outer step), then replica 2
is SIGKILLed whole. At every outer step each shard's digest is the same on every replica that
printed it, the joiner takes steps after receiving its parts, and every process not killed
ends with the same digest as its shard's counterparts."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
from collections import defaultdict

import pytest

from tests.process.example_runs import EXAMPLES, fields, spawn_gated
from tests.process.procs import Proc, spawn

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(180)

OUTER = 60  # outer steps of the run (H = 5)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _replica(procs: list[Proc], addr: str, seed: int, gated: bool = False
                   ) -> list[Proc]:
    """A replica's two processes; ``gated``: imports done, each waits for ``release``."""
    store = f"127.0.0.1:{_port()}"
    out = []
    for shard in (0, 1):
        start = functools.partial(spawn_gated, preload="charlm,torch.distributed.fsdp") \
            if gated else spawn
        p = await start(f"r{seed}s{shard}", str(EXAMPLES / "fsdp_diloco.py"),
                        "--master", addr, "--seed", str(seed), "--shard", str(shard),
                        "--replica-store", store, "--min-peers", "2", "--tiny",
                        "--inner", "5", "--inner-steps", str(5 * OUTER),
                        "--eval-every", "1000",
                        **({} if gated else {"env": {"OMP_NUM_THREADS": "1"}}))
        procs.append(p)
        out.append(p)
    return out


async def test_fsdp_diloco_survives_a_killed_replica_and_a_joining_one(procs, master_proc):
    _, addr = master_proc
    lines: dict[str, list[dict[str, str]]] = defaultdict(list)
    queue: asyncio.Queue[tuple[Proc, dict[str, str] | None]] = asyncio.Queue()

    async def pump(p: Proc) -> None:
        while True:
            try:
                line = await p.line(timeout=90)
            except AssertionError:  # stdout ended
                await queue.put((p, None))
                return
            await queue.put((p, fields(line)))

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # (the gated joiner inherits it)
    one, two = await _replica(procs, addr, 1), await _replica(procs, addr, 2)
    joiner = await _replica(procs, addr, 3, gated=True)
    running = {p.name: p for p in [*one, *two, *joiner]}
    pumps = [asyncio.ensure_future(pump(p)) for p in running.values()]
    released = killed = False
    try:
        while running:
            p, f = await asyncio.wait_for(queue.get(), 120)
            if f is None:
                assert p.name.startswith("r2") or lines[p.name][-1]["kind"] == "done", (
                    p.name, lines[p.name][-3:])
                running.pop(p.name)
                continue
            lines[p.name].append(f)
            if not released and p.name == "r1s0" and f["kind"] == "step":
                released = True
                for j in joiner:  # joins the two running replicas
                    assert j.proc.stdin is not None
                    j.proc.stdin.write(b"go\n")
            if not killed and all(any(g["kind"] == "step" for g in lines[j.name])
                                  for j in joiner):  # (both groups' step done with 3)
                killed = True
                for victim in two:  # the whole replica at once
                    victim.signal(signal.SIGKILL)
    finally:
        for t in pumps:
            t.cancel()
    assert killed, "the joiner never took a step"
    for shard in (0, 1):
        names = [f"r{r}s{shard}" for r in (1, 2, 3)]
        by_step: dict[str, set[str]] = defaultdict(set)
        for n in names:
            for f in lines[n]:
                if f["kind"] == "step":
                    by_step[f["outer"]].add(f["digest"])
        assert by_step and all(len(d) == 1 for d in by_step.values()), (shard, by_step)
        done = [next(f for f in lines[n] if f["kind"] == "done") for n in (names[0], names[2])]
        assert done[0]["outer"] == done[1]["outer"] == str(OUTER), done
        assert done[0]["digest"] == done[1]["digest"], done
        steps = [int(f["outer"]) for f in lines[names[2]] if f["kind"] == "step"]
        assert len(steps) >= 3 and steps[0] > 1, steps  # the joiner took part
        worlds = [f["world"] for f in lines[names[0]] if f["kind"] == "step"]
        assert "3" in worlds and worlds[-1] == "2", worlds  # joined by 3, left by 2
    assert not any(f["kind"] == "done" for n in ("r2s0", "r2s1") for f in lines[n])
