"""Issue 47: torchrun jobs are replicas of one run. Two ``torchrun --nproc-per-node 2`` jobs of
``examples/fsdp_diloco.py`` (FSDP2 over torchrun's gloo group inside the job,
``Communicator.from_env()`` across jobs: ``$PCCL_AIO_MASTER``, the job as one replica of two,
rank r in peer group r) train against one master; one job is SIGKILLed whole (its process
tree: the agent and both workers) mid-run and started again. The other job trains on, the
new one joins live, and at every outer step each shard's digest is the same on every job
that printed it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.process.procs import HERE, Proc, start_master

pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(300)

EXAMPLE = str(HERE.parent.parent / "examples" / "fsdp_diloco.py")
ARGS = ("--tiny", "--inner", "5", "--inner-steps", "3000", "--eval-every", "100")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (torchrun starts each worker in a session of its own)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass  # (it exited meanwhile)
    return out


def _kill_job(job: Job) -> None:
    """SIGKILL the torchrun agent and its workers, all at once."""
    for pid in _tree(job.proc.proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Job:
    """One torchrun job, its workers' lines by rank."""

    def __init__(self, name: str, proc: Proc) -> None:
        self.name, self.proc = name, proc
        self.lines: dict[int, list[dict[str, str]]] = defaultdict(list)
        self.progress = asyncio.Event()

    async def pump(self) -> None:
        assert self.proc.proc.stdout is not None
        async for raw in self.proc.proc.stdout:
            line = raw.decode().strip()
            if not line.startswith("[default"):
                continue
            prefix, _, text = line.partition("]:")
            kind, *pairs = text.split()
            if not pairs or not all("=" in p for p in pairs):
                continue  # (a warning a worker printed)
            self.lines[int(prefix[len("[default"):])].append(
                {"kind": kind, **dict(p.split("=", 1) for p in pairs)})
            self.progress.set()

    def steps(self, rank: int) -> dict[int, str]:
        return {int(f["outer"]): f["digest"] for f in self.lines[rank] if f["kind"] == "step"}

    async def until(self, check, timeout: float = 120) -> None:
        async def wait() -> None:
            while not check():
                self.progress.clear()
                await self.progress.wait()
        await asyncio.wait_for(wait(), timeout)


async def _job(name: str, seed: int, env: dict[str, str], script: str = EXAMPLE,
               args: tuple[str, ...] | None = None) -> Job:
    root = str(HERE.parent.parent)
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))),
            **env}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "--tee", "3",
        script, *(("--seed", str(seed), *ARGS) if args is None else args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, env=full)
    return Job(name, Proc(proc, name))


async def test_torchrun_jobs_are_replicas_one_killed_whole_rejoins_live(procs):
    # (a 10 s heartbeat timeout: a killed job is seen at once by its closed connections; a
    # worker that four busy processes on two cores keep from its heartbeats for 2 s would
    # be dropped, train one step alone and print that step's digest of its own)
    _, port = await start_master(procs, heartbeat_timeout=10.0)
    env = {"PCCL_AIO_MASTER": f"127.0.0.1:{port}"}
    a, b = await _job("a", 1, env), await _job("b", 2, env)
    jobs = [a, b]
    pumps = [asyncio.ensure_future(j.pump()) for j in jobs]
    try:
        procs.extend([a.proc, b.proc])
        # both replicas train together (world 2 in both peer groups), then b dies whole
        await b.until(lambda: any(int(f.get("world", 0)) == 2 and int(f["outer"]) >= 10
                                  for f in b.lines[0] if f["kind"] == "step"))
        workers = _tree(b.proc.proc.pid)[1:]
        assert len(workers) >= 2, workers
        _kill_job(b)
        assert await asyncio.wait_for(b.proc.proc.wait(), 30) == -signal.SIGKILL
        killed_at = max(a.steps(0))
        await a.until(lambda: any(f["kind"] == "step" and f["world"] == "1"
                                  for f in a.lines[0]))  # (b's loss seen: a trains alone)
        again = await _job("b2", 2, env)
        procs.append(again.proc)
        jobs.append(again)
        pumps.append(asyncio.ensure_future(again.pump()))
        await again.until(lambda: len(again.steps(0)) >= 5 and len(again.steps(1)) >= 5)
        assert min(again.steps(0)) > killed_at  # (it joined the run in progress)
        await a.until(lambda: any(f["kind"] == "done" for f in a.lines[0])
                      and any(f["kind"] == "done" for f in a.lines[1]), timeout=240)
        for rank in (0, 1):  # each shard's digest agrees across jobs at every outer step
            # that both replicas took together (world 2; a step a process took alone, world
            # 1, is its own until the next sync gives it the run's state)
            seen: dict[int, set[str]] = defaultdict(set)
            said: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
            for job in jobs:
                for f in job.lines[rank]:
                    if f["kind"] == "step":
                        said[int(f["outer"])].append((job.name, f["world"], f["digest"]))
                        if f["world"] == "2":
                            seen[int(f["outer"])].add(f["digest"])
            spans = {j.name: (min(j.steps(rank), default=None),
                              max(j.steps(rank), default=None)) for j in jobs}
            assert all(len(d) == 1 for d in seen.values()), (  # (with what places them:
                # the shard, a's last step when b died, each job's first and last step)
                f"shard {rank}, killed at {killed_at}, steps {spans}",
                {k: said[k] for k, v in seen.items() if len(v) > 1})
            together = [k for k, v in said.items() if len(v) == 2]
            assert len(together) > 20, together  # (the joiner trained with the survivor)
            steps = sorted(a.steps(rank))  # the survivor lost no step
            assert steps == list(range(1, steps[-1] + 1))
        assert await asyncio.wait_for(a.proc.proc.wait(), 60) == 0
    finally:
        for job in jobs:
            _kill_job(job)
        for p in pumps:
            p.cancel()


async def test_init_process_group_without_arguments_under_torchrun(procs):
    _, port = await start_master(procs)
    jobs = [await _job(f"env{i}", 0, {"PCCL_AIO_MASTER": f"127.0.0.1:{port}"},
                       script=str(HERE / "torchrun_env_peer.py"), args=()) for i in (1, 2)]
    procs.extend(job.proc for job in jobs)
    replicas = set()
    for job in jobs:
        out, _ = await asyncio.wait_for(job.proc.proc.communicate(), 120)
        lines = [json.loads(raw.decode().partition("]:")[2]) for raw in out.splitlines()
                 if b'"event": "made"' in raw]
        assert sorted(e["rank"] for e in lines) == [0, 1], out.decode()[-3000:]
        for e in lines:
            assert e["default"] == "gloo" and e["inside"] == [2.0, 2.0]
            # (torchrun's run id is "none": the job's store address names the replica)
            assert e["replica"].startswith("torchrun:127.0.0.1:")
            assert (e["replica_size"], e["peer_group"]) == (2, e["rank"])
            replicas.add(e["replica"])
            assert e["size"] == 2 and e["across"] == [2.0, 2.0]
        assert job.proc.proc.returncode == 0
    assert len(replicas) == 2
