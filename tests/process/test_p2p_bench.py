"""``bench/p2p.py`` (send/recv and all_to_all_single of pccl_aio against gloo) runs end to
end at a tiny size in a few seconds and writes its rows and targets to ``--json``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.process.procs import HERE, spawn

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)


async def test_the_p2p_bench_runs_at_a_tiny_size(tmp_path: Path) -> None:
    path = tmp_path / "p2p.json"
    p = await spawn("p2p", str(HERE.parent.parent / "bench" / "p2p.py"), "--world", "2",
                    "--sizes", "64KiB", "--repeat", "1", "--iters", "2", "--lat-iters", "10",
                    "--json", str(path))
    out, err = await asyncio.wait_for(p.proc.communicate(), 90)
    assert p.proc.returncode == 0, err.decode()[-2000:]
    assert "targets met" in out.decode(), out.decode()[-2000:]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    rows, summary = lines[:-1], lines[-1]
    assert {(r["kind"], r["size"]) for r in rows} == {
        ("latency", "4KiB"), ("sendrecv", "64KiB"), ("stream", "64KiB"), ("all_to_all", "64KiB")}
    assert all(r["ratio"] > 0 and r["pccl_aio_times_ms"] and r["gloo_times_ms"] for r in rows)
    assert summary["summary"] and len(summary["acceptance"]) == 3  # latency, both send/recv
