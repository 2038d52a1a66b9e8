"""Mismatched calls fail on every peer within a second with DeadlockError (real processes),
and the communicators then complete a correct all-reduce."""

from __future__ import annotations

import pytest

from tests.process.procs import HERE, spawn

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(("scenario", "world", "words"), [
    ("tags", 2, ["tag=0", "tag=1"]),
    ("votes", 2, ["are_peers_pending", "sync_shared_state"]),
    ("never", 3, ["are_peers_pending", "tag=0"]),
])
async def test_mismatched_calls_fail_at_once_on_every_peer(procs, master_proc, scenario,
                                                           world, words):
    _, addr = master_proc
    peers = []
    for i in range(world):
        p = await spawn(f"peer{i}", str(HERE / "deadlock_peer.py"), addr, str(i), str(world),
                        scenario)
        procs.append(p)
        peers.append(p)
    calling = [await p.expect("calling") for p in peers]
    failed = [await p.expect("failed", timeout=10) for p in peers]
    last_call = max(ev["t"] for ev in calling)
    for ev in failed:
        assert ev["kind"] == "DeadlockError", ev
        assert ev["t"] - last_call < 1.0, ev  # at once, not after a timeout
        assert "deadlock: peer " in ev["error"], ev
    said = " ".join(ev["error"] for ev in failed)
    for w in words:  # the messages say who waits on what
        assert w in said, said
    reduced = [await p.expect("reduced", timeout=30) for p in peers]
    assert all(r["ws"] == world for r in reduced)
    assert {r["value"] for r in reduced} == {float(sum(range(1, world + 1)))}
