"""Fault tolerance with real processes: SIGKILL, SIGSTOP, and a killed master."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import numpy as np
import pytest

from tests.process.procs import HERE, spawn, start_peers

COUNT = 1 << 23  # 32 MiB of float32: long enough on loopback to kill mid-transfer


def _expected(indices: list[int]) -> tuple[float, float]:
    k = sum(i + 1 for i in indices)
    return float(np.float32(1) * k), float(np.float32(COUNT - 1) * np.float32(k))


async def test_sigkill_mid_allreduce(procs, master_proc):
    _, addr = master_proc
    peers = await start_peers(procs, addr, 3, "reduce", str(COUNT))
    for p in peers:
        await p.expect("started")
    peers[1].signal(signal.SIGKILL)
    killed_at = time.time()
    survivors = [peers[0], peers[2]]
    outcomes = [await p.expect("lost", timeout=10) for p in survivors]
    for ev in outcomes:  # the non-neighbour too: the master broadcasts the abort
        assert ev["t"] - killed_at < 2.0, ev
        assert ev["ws"] == 2  # no update_topology needed
        assert ev["restored"] is True
    retried = [await p.expect("retried", timeout=30) for p in survivors]
    assert retried[0]["hash"] == retried[1]["hash"]  # bit-identical on both survivors
    assert all(r["ws"] == 2 for r in retried)
    first, last = _expected([0, 2])
    assert retried[0]["first"] == first and retried[0]["last"] == last


async def test_sigstop_is_detected_by_deadlines(procs, master_proc):
    _, addr = master_proc
    peers = await start_peers(procs, addr, 3, "reduce", str(COUNT))
    for p in peers:
        await p.expect("started")
    peers[2].signal(signal.SIGSTOP)  # sockets stay open, the process goes silent
    stopped_at = time.time()
    survivors = [peers[0], peers[1]]
    outcomes = [await p.expect("lost", timeout=15) for p in survivors]
    for ev in outcomes:  # heartbeat timeout 2 s / data timeout 3 s in the worker and master
        assert ev["t"] - stopped_at < 6.0, ev
        assert ev["ws"] == 2 and ev["restored"] is True
    retried = [await p.expect("retried", timeout=30) for p in survivors]
    assert retried[0]["hash"] == retried[1]["hash"]
    first, last = _expected([0, 1])
    assert retried[0]["first"] == first and retried[0]["last"] == last


@pytest.mark.parametrize(("tensors", "in_flight", "count"), [(10, 8, 128 * 128), (64, 64, 1 << 16)])
async def test_multiple_with_retry_under_sigkill(procs, master_proc, tensors, in_flight, count):
    _, addr = master_proc
    peers = await start_peers(procs, addr, 3, "multi", str(count), str(tensors), str(in_flight))
    started = [await p.expect("started") for p in peers]
    assert all(s["in_flight"] == in_flight for s in started)  # a full window in flight
    peers[0].signal(signal.SIGKILL)
    done = [await p.expect("done", timeout=60) for p in peers[1:]]
    assert done[0]["hash"] == done[1]["hash"]  # every tensor byte-identical on the survivors
    assert done[0]["ws"][-1] == 2  # the victim is gone by the end
    for t, v in enumerate(done[0]["firsts"]):  # either the full or the survivors' sum
        assert v in (3 * t + 6, 2 * t + 5), (t, v)


async def test_sigkill_during_admission(procs, master_proc):
    _, addr = master_proc
    peers = await start_peers(procs, addr, 3, "vote")
    for p in peers:
        await p.expect("started")
    peers[2].signal(signal.SIGKILL)
    joiner = await spawn("joiner", str(HERE / "worker.py"), addr, "3", "3", "vote")
    procs.append(joiner)
    await joiner.expect("joined", timeout=20)
    for p in peers[:2]:
        ev = await p.expect("voted", timeout=20)
        while ev["ws"] != 3:
            ev = await p.expect("voted", timeout=20)


@pytest.mark.parametrize("master_timeout, within", [
    ("0", 2.0),  # no failover: the session is over at once
    ("3", 5.0),  # the joint vote in flight waits, in doubt, for a next master: 3 s
])
async def test_master_killed(procs, master_proc, master_timeout, within):
    master, addr = master_proc
    peers = await start_peers(procs, addr, 2, "idle", env={"MASTER_TIMEOUT": master_timeout})
    for p in peers:
        await p.expect("started")
    # both peers loop on joint votes: the pending or the next one meets the dead master
    master.signal(signal.SIGKILL)
    killed_at = time.time()
    for p in peers:
        while True:
            ev = json.loads(await p.line(timeout=10))
            if ev["event"] == "error":
                break
        assert ev["kind"] == "MasterConnectionError", ev
        assert ev["t"] - killed_at < within
    await asyncio.gather(*(p.proc.wait() for p in peers))


async def test_a_reset_data_socket_fails_the_collective_everywhere_within_a_second(
        procs, master_proc):
    _, addr = master_proc
    peers = await start_peers(procs, addr, 3, "reduce", str(COUNT))
    for p in peers:
        await p.expect("started")
    peers[1].signal(signal.SIGUSR1)  # peer 1 resets its receiving data sockets mid-transfer
    cut = await peers[1].expect("cut", timeout=10)
    assert cut["sockets"] >= 1
    outcomes = [await p.expect("lost", timeout=10) for p in peers]
    for ev in outcomes:  # every peer, at once (the data deadline of the workers is 3 s)
        assert ev["t"] - cut["t"] < 1.0, ev
        assert ev["ws"] == 3 and ev["restored"] is True
    retried = [await p.expect("retried", timeout=30) for p in peers]
    assert len({r["hash"] for r in retried}) == 1
    first, last = _expected([0, 1, 2])
    assert retried[0]["first"] == first and retried[0]["last"] == last


async def test_sigkill_mid_sparse_exchange_leaves_the_error_buffers_unchanged(procs, master_proc):
    """``SparseCompressor``: a peer SIGKILLed while the parts are all-gathered; every survivor
    raises, its error buffer as it was, and the next ``average`` over the survivors gives the
    same bytes on both."""
    _, addr = master_proc
    peers = await start_peers(procs, addr, 3, "sparse", str(1 << 23))
    for p in peers:
        await p.expect("started")
    peers[1].signal(signal.SIGKILL)
    survivors = [peers[0], peers[2]]
    for ev in [await p.expect("lost", timeout=10) for p in survivors]:
        assert ev["unchanged"] is True and ev["ws"] == 2, ev
    retried = [await p.expect("retried", timeout=30) for p in survivors]
    assert retried[0]["hash"] == retried[1]["hash"] and retried[0]["ws"] == 2
    assert all(r["changed"] for r in retried)  # (8-bit codes: a residual is left)
