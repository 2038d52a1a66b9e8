"""Issue 47: pccl_aio on a local Ray cluster (``ray start --head`` on this machine, stopped at
the end). ``examples/ray_diloco.py`` trains the char-GPT with DiLoCo on 3 worker actors
(``pccl_aio.ray``: the master an actor too); one worker's process is SIGKILLed mid-run.
Ray starts the actor again and reruns its training, the new process joins live, the run ends
with every worker's digest equal, and the survivors lose no step. The time from the kill to
the replacement's first step (its first collectives done) is printed
(``-s`` shows it)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "ray_diloco.py")
LINE = re.compile(r"^\((?:_Worker|WorkerActor) pid=(\d+)(?:, ip=[^)]*)?\) (\w+) (.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ENV = {"RAY_DEDUP_LOGS": "0", "RAY_COLOR_PREFIX": "0", "RAY_USAGE_STATS_ENABLED": "0",
       "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """A Ray head on this machine; the address its drivers give (``auto``: the cluster
    ``ray start`` recorded)."""
    port = _free_port()
    env = {**os.environ, **ENV}
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    subprocess.run([*ray, "start", "--head", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats"], env=env,
                   check=True, capture_output=True, timeout=120)
    try:
        yield "auto"
    finally:
        subprocess.run([*ray, "stop", "--force"], env=env, capture_output=True, timeout=60)


async def test_a_killed_ray_worker_is_restarted_and_joins_live(ray_cluster):
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, EXAMPLE, "--address", ray_cluster, "--workers", "3", "--",
        "--tiny", "--inner", "5", "--inner-steps", "3000", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env)
    lines: dict[int, list[dict[str, str]]] = defaultdict(list)
    seen: list[str] = []
    finished: dict[str, Any] = {}
    firsts: dict[int, float] = {}

    async def pump() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            text = ANSI.sub("", raw.decode(errors="replace")).strip()
            seen.append(text)
            if text.startswith('{"event": "finished"'):
                finished.update(json.loads(text))
            m = LINE.match(text)
            if m and all("=" in f for f in m[3].split()):
                pid = int(m[1])
                lines[pid].append({"kind": m[2], **dict(f.split("=", 1) for f in m[3].split())})
                if m[2] == "step":
                    firsts.setdefault(pid, time.monotonic())

    def steps(pid: int) -> dict[int, str]:
        return {int(f["outer"]): f["digest"] for f in lines[pid] if f["kind"] == "step"}

    async def until(check, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < end, (what, seen[-30:])
            await asyncio.sleep(0.2)  # (polling the pump's records: no event to wait on)

    reader = asyncio.ensure_future(pump())
    try:
        await until(lambda: sum(1 for p in list(lines) if any(
            f["kind"] == "step" and f["world"] == "3" and int(f["outer"]) >= 10
            for f in lines[p])) == 3, 150, "three workers training together")
        workers = sorted(lines)
        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        await until(lambda: any(p not in workers and steps(p) for p in list(lines)), 120,
                    "the restarted worker's first step")
        new = next(p for p in lines if p not in workers)
        print(f"SIGKILL to the replacement's first step: {firsts[new] - killed:.2f} s")
        assert await asyncio.wait_for(proc.wait(), 200) == 0, seen[-30:]
        await reader
    finally:
        if proc.returncode is None:
            proc.kill()
    results = finished["workers"]
    assert [r["status"] for r in results] == [0, 0, 0], results
    done = [dict(f.split("=", 1) for f in r["done"].split()[1:]) for r in results]
    assert len({d["digest"] for d in done}) == 1 and {d["outer"] for d in done} == {"600"}
    digests: dict[int, set[str]] = defaultdict(set)
    for p in lines:
        for outer, digest in steps(p).items():
            digests[outer].add(digest)
    assert all(len(d) == 1 for d in digests.values())
    for p in workers[1:]:  # the survivors lost no step (up to the last one forwarded)
        assert sorted(steps(p)) == list(range(1, max(steps(p)) + 1))
    assert min(steps(new)) > max(steps(victim))  # (the replacement joined the run live)
    assert {int(d["peer"]) for d in done} >= {int(lines[new][0]["peer"])}
