"""``examples/fsdp_diloco.py`` under churn, started by the launcher as replicas of two
processes (``python -m pccl_aio.launch ... --replica-procs 2``): two replicas of two FSDP2
shards each (gloo inside a replica, shard i of every replica in pccl_aio peer group i), a
replica SIGKILLed whole (both processes) every 2 s and a replacement replica joining.

From the launcher's CSV: every kill took both processes of a replica, a replacement's two
processes joined mid-run and trained, at every outer step each shard's digest is the same on
every replica that printed it (and differs between the shards: each holds its own part), the
processes that finished agree per shard, and no process outlives the launcher."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.process.test_launch import ROOT, _launch, _rows, _running

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(180)

FSDP = str(ROOT / "examples" / "fsdp_diloco.py")


async def test_the_launcher_runs_fsdp_replicas_and_kills_them_whole(tmp_path):
    status, out, err = await _launch(
        FSDP, "--peers", "2", "--replica-procs", "2", "--churn", "2", "--seed", "3",
        "--out", str(tmp_path), "--timeout", "150", "--", "--tiny", "--inner", "5",
        "--inner-steps", "1300", "--eval-every", "100", timeout=170)
    assert status == 0, f"{out}\n{err[-4000:]}"
    rows = _rows(tmp_path / "fsdp_diloco.csv")
    assert not _running(rows)
    steps = [r for r in rows if r["kind"] == "step"]
    by_shard: dict[tuple[str, str], set[str]] = defaultdict(set)  # (outer, shard) -> digests
    for r in steps:
        by_shard[r["outer"], r["shard"]].add(r["digest"])
    assert {s for _, s in by_shard} == {"0", "1"}
    assert all(len(d) == 1 for d in by_shard.values()), by_shard
    assert by_shard["1", "0"] != by_shard["1", "1"]  # each shard its own part of the model

    kills = [r for r in rows if r["kind"] == "kill"]
    killed: dict[str, set[str]] = defaultdict(set)
    for r in kills:
        killed[r["seed"]].add(r["shard"])
    assert killed and all(s == {"0", "1"} for s in killed.values()), kills  # whole replicas
    exits = {(r["seed"], r["shard"]): r["detail"] for r in rows if r["kind"] == "exit"}
    assert all("status=-9" in exits[seed, s] for seed in killed for s in ("0", "1")), exits
    starts = [r for r in rows if r["kind"] == "start" and r["seed"]]
    replacements = {r["seed"] for r in starts if "replacement" in r["detail"]}
    assert replacements and all(  # each replacement started as a replica of two
        sorted(r["shard"] for r in starts if r["seed"] == seed) == ["0", "1"]
        for seed in replacements)
    joined = {seed: {r["shard"]: int(r["outer"]) for r in steps if r["seed"] == seed}
              for seed in replacements}
    took_part = {seed: first for seed, first in joined.items() if len(first) == 2}
    assert took_part and all(min(f.values()) > 1 for f in took_part.values()), joined

    done = [r for r in rows if r["kind"] == "done"]
    assert {r["shard"] for r in done} == {"0", "1"}
    for r in done:
        assert exits[r["seed"], r["shard"]].startswith("status=0"), exits
        assert r["digest"] in by_shard[r["outer"], r["shard"]], r
    assert "digests agree" in out and "replica procs" in out
