"""Churn orchestrator (PCCL scenario 37): peers are spawned and SIGKILLed at random while the
others run a DDP loop (shared-state sync + all-reduce with retry); every peer reports its
state hash after each sync.

    python tests/stress/churn.py --seconds 3600 [--seed 1]     # the long mode

Pass: at every revision all reported hashes are identical, and the run keeps making
progress (a sync at least every ``--stall`` seconds). The test suite runs it bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKER = str(HERE.parent / "process" / "state_worker.py")
MASTER = str(HERE.parent / "process" / "masterproc.py")


class Proc:
    """A child process that prints one JSON event per line (no pytest here: the long mode and
    ``--help`` run with only the package installed)."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc, self.name = proc, name

    async def line(self, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            err = await self.proc.stderr.read() if self.proc.stderr is not None else b""
            raise AssertionError(f"{self.name} exited: {err.decode()[-3000:]}")
        return raw.decode().strip()

    def signal(self, sig: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)


async def spawn(name: str, *args: str) -> Proc:
    """Start ``python *args`` with the checkout first on ``PYTHONPATH``."""
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env)
    return Proc(proc, name)


async def churn(seconds: float, seed: int, stall: float, max_peers: int = 6) -> dict[str, object]:
    """Run the orchestrator for ``seconds``; returns a summary (raises AssertionError on failure)."""
    rng = random.Random(seed)
    master = await spawn("master", MASTER)
    addr = f"127.0.0.1:{int(await master.line())}"
    queue: asyncio.Queue[tuple[str, dict[str, object]]] = asyncio.Queue()
    peers: dict[str, Proc] = {}
    pumps: list[asyncio.Task[None]] = []
    hashes: dict[int, set[str]] = defaultdict(set)
    counter = 0
    kills = spawns = 0

    async def pump(p: Proc) -> None:
        while True:
            try:
                ev = json.loads(await p.line(timeout=3600))
            except AssertionError:
                ev = {"event": "exited"}
            await queue.put((p.name, ev))
            if ev["event"] in ("exited", "error", "finished"):
                return

    async def start() -> None:
        nonlocal counter, spawns
        counter += 1
        p = await spawn(f"peer{counter}", WORKER, addr, "ddp", str(10**9))
        peers[p.name] = p
        pumps.append(asyncio.ensure_future(pump(p)))
        spawns += 1

    try:
        for _ in range(2):
            await start()
        deadline = time.monotonic() + seconds
        next_event = time.monotonic() + rng.uniform(0.5, 1.5)
        last_progress = time.monotonic()
        while time.monotonic() < deadline:
            timeout = max(0.01, min(next_event, deadline) - time.monotonic())
            try:
                name, ev = await asyncio.wait_for(queue.get(), timeout)
            except TimeoutError:
                name, ev = "", {"event": "tick"}
            if ev["event"] == "synced":
                hashes[int(ev["revision"])].add(str(ev["hash"]))  # type: ignore[call-overload]
                last_progress = time.monotonic()
            elif ev["event"] == "error":
                raise AssertionError(f"{name} failed: {ev}")
            elif ev["event"] == "exited" and name in peers:
                raise AssertionError(f"{name} exited on its own")
            if time.monotonic() - last_progress > stall:
                raise AssertionError(f"no sync for {stall:.0f} s (revisions so far: {len(hashes)})")
            if time.monotonic() >= next_event:
                next_event = time.monotonic() + rng.uniform(0.5, 1.5)
                if len(peers) <= 2 or (len(peers) < max_peers and rng.random() < 0.6):
                    await start()
                else:
                    victim = rng.choice(sorted(peers))
                    peers.pop(victim).signal(signal.SIGKILL)
                    kills += 1
        bad = {r: h for r, h in hashes.items() if len(h) != 1}
        assert not bad, f"state hashes differ at revisions {sorted(bad)[:10]}"
        return {"revisions": len(hashes), "top": max(hashes, default=-1), "kills": kills,
                "spawns": spawns}
    finally:
        for p in [*peers.values(), master]:
            p.signal(signal.SIGKILL)
            await p.proc.wait()
        for t in pumps:
            t.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stall", type=float, default=30.0)
    args = ap.parse_args()
    summary = asyncio.run(churn(args.seconds, args.seed, args.stall))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
