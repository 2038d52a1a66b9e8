"""Issue 33: ``pccl_aio.torch`` in real processes: the ``dist.*`` collectives on the default
pccl_aio group give the same bytes as a gloo group on the same inputs; plain
``DistributedDataParallel`` trains with parameters bit-identical on every rank;
``pccl_aio.torch.DistributedDataParallel`` rides out a SIGKILLed replica and takes in a
joiner; FSDP2 with the all-reduce hook and the HSDP mesh over pccl_aio agree per shard, and
FSDP2 replicas with ``AllReduceHook`` ride out a SIGKILLed replica."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from typing import Any

import pytest

import pccl_aio as pccl
from tests.process.procs import HERE, spawn

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)

PEER = str(HERE / "torch_pg_peer.py")
WORLD = 3


async def _results(procs: list, *args_per_rank: tuple[str, ...], reference: bool = False
                   ) -> list[dict]:
    """Each rank's JSON line; every rank exits 0 (a ``reference`` run's exit codes are
    gloo's teardown, not ours: its rank 0 died of SIGABRT there once, after its digests)."""
    ps = []
    for i, args in enumerate(args_per_rank):
        p = await spawn(f"rank{i}", PEER, *args, env={"OMP_NUM_THREADS": "1"})
        procs.append(p)
        ps.append(p)
    out = [json.loads(await p.line(timeout=90)) for p in ps]
    codes = await asyncio.gather(*(p.proc.wait() for p in ps))
    if not reference:
        assert codes == [0] * len(ps)
    return sorted(out, key=lambda r: r["rank"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_dist_collectives_match_gloo_and_ddp_replicas_agree(procs):
    async with pccl.Master("127.0.0.1", 0, admission_interval=0.0) as master:
        ours = await _results(procs, *[("pccl_aio", master.address, str(WORLD))] * WORLD)
    store = f"127.0.0.1:{_free_port()}"
    theirs = await _results(procs, *[("gloo", store, str(WORLD), str(r)) for r in range(WORLD)],
                            reference=True)
    assert [r["backend"] for r in ours] == ["pccl_aio"] * WORLD
    assert [r["world"] for r in ours] == [WORLD] * WORLD
    for mine, gloo in zip(ours, theirs):
        for key in mine:
            if key not in ("backend", "ddp"):
                assert mine[key] == gloo[key], (key, mine, gloo)
    assert len({r["ddp"] for r in ours}) == 1  # every replica's parameters, bit-identical


async def test_ddp_with_the_comm_hook_survives_a_sigkilled_replica_and_a_joiner(procs):
    """Three replicas; one is SIGKILLed mid-run: the two survivors go on (a step whose
    all-reduce was aborted is skipped by both and run again) over a world of two; a new
    replica joins, receives model, momentum and step count in the shared-state sync, and all
    three end with the same parameters."""
    async with pccl.Master("127.0.0.1", 0, admission_interval=0.0, heartbeat_interval=0.2,
                           heartbeat_timeout=2.0) as master:
        def replica(i: int, *extra: str) -> Any:
            return spawn(f"replica{i}", str(HERE / "ddp_peer.py"), master.address, "3", "30",
                         str(i), *extra, env={"OMP_NUM_THREADS": "1"})

        replicas = []
        for i in range(3):
            replicas.append(await replica(i, *(["10"] if i == 1 else [])))  # 1 stops at 10
            procs.append(replicas[-1])
        await replicas[1].expect("frozen", timeout=90)
        replicas[1].signal(signal.SIGKILL)
        survivors = [replicas[0], replicas[2]]
        joiner = await replica(3)
        procs.append(joiner)
        done = [await p.expect("done", timeout=90) for p in [*survivors, joiner]]
    assert len({d["digest"] for d in done}) == 1, done
    assert len({d["step"] for d in done}) == 1, done
    steps = [[e for e in p.events if e["event"] == "step"] for p in survivors]
    assert [{e["ws"] for e in s if 12 <= e["step"] < 15} for s in steps] == [{2}, {2}], steps
    joined = [e for e in joiner.events if e["event"] == "step"]
    assert joined and joined[0]["step"] > 11 and {e["ws"] for e in joined} == {3}, joined
    failed = [[e["step"] for e in p.events if e["event"] == "failed"] for p in survivors]
    assert failed[0] == failed[1]  # the same steps skipped on both, if any


async def test_fsdp2_with_the_all_reduce_hook_and_the_hsdp_mesh_agree_per_shard(procs):
    """Two replicas x two FSDP2 shards (gloo inside a replica), shard i of each replica in
    pccl_aio peer group i: with ``set_all_reduce_hook`` averaging over pccl_aio, and as HSDP
    through ``DeviceMesh.from_group([pccl_aio group, gloo pair])`` (the group registered by
    name for the mesh), each shard's parameters end bit-identical on both replicas, and the
    two forms agree."""
    store = f"127.0.0.1:{_free_port()}"
    async with pccl.Master("127.0.0.1", 0, admission_interval=0.0) as master:
        ps = []
        for r in range(2):
            for shard in range(2):
                p = await spawn(f"r{r}s{shard}", str(HERE / "fsdp_peer.py"), master.address,
                                store, "2", str(r), str(shard), env={"OMP_NUM_THREADS": "1"})
                procs.append(p)
                ps.append(p)
        out = [json.loads(await p.line(timeout=90)) for p in ps]
        assert await asyncio.gather(*(p.proc.wait() for p in ps)) == [0] * 4
    for shard in range(2):
        mine = [o for o in out if o["shard"] == shard]
        assert sorted(o["rank"] for o in mine) == [0, 1]  # a peer group per shard
        assert len({(o["hook"], o["hsdp"]) for o in mine}) == 1, out
        assert mine[0]["hook"] == mine[0]["hsdp"], out
    assert out[0]["hook"] != out[1]["hook"]  # (two shards, two digests)
    assert all(o["name"].startswith("pccl_aio:") for o in out)


async def test_fsdp2_replicas_with_the_fault_tolerant_hook_admit_a_joiner_and_survive_a_kill(
        procs):
    """Two replicas x two FSDP2 shards, ``AllReduceHook`` across replicas and ``hook.admit``
    between steps; a third replica joins mid-run (its two processes, made with ``replica=`` and
    ``replica_size=2``, are admitted in one round, at the same step in both groups, and receive
    their shard's parameters and the step count), then replica 1 is SIGKILLed whole mid-step.
    The survivors skip the same steps (their two groups may disagree on a step; ``failed_in``
    makes the replica agree) and each shard's parameters are bit-identical on every replica at
    every step, joiner included."""
    async with pccl.Master("127.0.0.1", 0, heartbeat_interval=0.2,
                           heartbeat_timeout=2.0) as master:
        ps: dict[tuple[int, int], Any] = {}
        for r in range(3):
            store = f"127.0.0.1:{_free_port()}"
            for shard in range(2):
                p = await spawn(f"r{r}s{shard}", str(HERE / "fsdp_ft_peer.py"),
                                master.address, store, "2", str(r), str(shard), "250",
                                *(["join"] if r == 2 else []), env={"OMP_NUM_THREADS": "1"},
                                stdin=r == 2)
                procs.append(p)
                ps[r, shard] = p
        for shard in range(2):
            await ps[2, shard].expect("ready", timeout=90)
        await ps[0, 0].expect("step", timeout=90)
        for shard in range(2):  # the joining replica's processes connect
            stdin = ps[2, shard].proc.stdin
            assert stdin is not None
            stdin.write(b"go\n")
        for _ in range(2):
            for shard in range(2):
                await ps[2, shard].expect("step", timeout=60)
        for shard in range(2):  # (mid-step: the others may be in any collective)
            ps[1, shard].signal(signal.SIGKILL)
        for key in [(0, 0), (0, 1), (2, 0), (2, 1)]:
            await ps[key].expect("done", timeout=90)
    for shard in range(2):
        digests: dict[int, set[str]] = {}
        for r in range(3):
            for e in ps[r, shard].events:
                if e["event"] == "step":
                    digests.setdefault(e["step"], set()).add(e["digest"])
        assert len(digests) == 250 and all(len(d) == 1 for d in digests.values()), shard
        joined = [e for e in ps[2, shard].events if e["event"] == "step"]
        assert joined[0]["step"] > 1 and joined[-1]["step"] == 250, joined[:2]
        worlds = [e["ws"] for e in ps[0, shard].events if e["event"] == "step"]
        assert 3 in worlds and worlds[-1] == 2, worlds  # joined by 3, on by 2
    first = min(e["step"] for e in ps[2, 0].events if e["event"] == "step")
    failed = [[e["step"] for e in ps[key].events if e["event"] == "failed" and e["step"] >= first]
              for key in [(0, 0), (0, 1), (2, 0), (2, 1)]]
    assert all(f == failed[0] for f in failed), failed  # the same steps skipped everywhere


async def test_the_gpu_bench_runs_and_says_when_there_is_no_gpu():
    """``bench/gpu.py`` is the GPU check a GPU machine runs; without one it measures
    nothing and says so (exit status 0 either way)."""
    p = await spawn("gpu", str(HERE.parent.parent / "bench" / "gpu.py"), "--mib", "1",
                    "--iters", "2")
    out, err = await asyncio.wait_for(p.proc.communicate(), 90)
    assert p.proc.returncode == 0, err.decode()[-2000:]
    text = out.decode()
    assert "no GPU present" in text or "cuda_vs_cpu" in text, text
