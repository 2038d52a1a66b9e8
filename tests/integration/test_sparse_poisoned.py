"""``SparseCompressor.average`` when one peer's data fails a check (issue 45, item 2): a NaN or
infinity on one peer, or an ``x`` one peer's call refuses, fails the average on every peer
with ``InvalidUsageError`` within 1 s (before, the others waited in the all-gather forever);
nothing is written to ``out``, no error buffer changes, and the next average works."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio import blocking
from tests.helpers import FAST, blocking_pair, join_peers

pytestmark = pytest.mark.timeout(60)

N = 50_003


def _inputs(seed: int, n: int = N) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(3)]


async def _all_raise(coros: list, within: float = 1.0) -> list[BaseException]:
    """Run ``coros`` at once; every one must raise, all within ``within`` s (waited for at
    most 10 s, so that a peer left waiting fails the test instead of hanging it)."""
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(c) for c in coros]
    _, pending = await asyncio.wait(tasks, timeout=10)
    for t in pending:
        t.cancel()
    assert not pending, f"{len(pending)} of {len(tasks)} peers still waiting after 10 s"
    elapsed = time.monotonic() - t0
    errors = [t.exception() for t in tasks]
    assert all(e is not None for e in errors), errors
    assert elapsed < within, f"the peers raised after {elapsed:.2f} s"
    return [e for e in errors if e is not None]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "float64 x"])
async def test_one_peers_bad_data_fails_the_average_on_every_peer(master, bad):
    comms = await join_peers(master, 3)
    comps = [pccl.SparseCompressor(N, density=0.01, bits=2, chunk=1024) for _ in comms]
    try:
        xs = _inputs(1)
        outs = [np.empty(N, np.float32) for _ in comms]
        await asyncio.gather(*(c.average(m, x, o) for c, m, x, o in zip(comps, comms, xs, outs)))
        before = [c.error.copy() for c in comps]
        xs = _inputs(2)
        if bad == "float64 x":
            xs[1] = xs[1].astype(np.float64)
        else:
            xs[1][4321] = np.float32(bad)
        outs = [np.full(N, 7.0, np.float32) for _ in comms]
        errors = await _all_raise([c.average(m, x, o)
                                   for c, m, x, o in zip(comps, comms, xs, outs)])
        ranks = [m.rank for m in comms]
        for e in errors:
            assert type(e) is pccl.InvalidUsageError, e
            assert f"rank {ranks[1]} is poisoned" in str(e), e
        assert "here:" in str(errors[1]) and "here:" not in str(errors[0])
        for c, b, o in zip(comps, before, outs):
            assert np.array_equal(c.error, b)  # nothing committed
            assert (o == 7.0).all()  # nothing written
        xs = _inputs(3)  # the group goes on: the next average agrees everywhere
        await asyncio.gather(*(c.average(m, x, o) for c, m, x, o in zip(comps, comms, xs, outs)))
        assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()
        assert np.isfinite(outs[0]).all()
    finally:
        await asyncio.gather(*(c.close() for c in comms))


async def test_a_refused_out_on_one_peer_fails_every_peer(master):
    comms = await join_peers(master, 2)
    comps = [pccl.SparseCompressor(N, density=0.01) for _ in comms]
    try:
        xs = _inputs(4)[:2]
        outs = [np.empty(N, np.float32), np.empty(N - 1, np.float32)]  # the second: too short
        errors = await _all_raise([c.average(m, x, o)
                                   for c, m, x, o in zip(comps, comms, xs, outs)])
        assert all(type(e) is pccl.InvalidUsageError for e in errors), errors
        assert "out must be" in str(errors[1])
    finally:
        await asyncio.gather(*(c.close() for c in comms))


def test_the_blocking_form_fails_on_both_peers() -> None:
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0, **FAST) as m:
        pair = blocking_pair(m.address)
        comps = [pccl.SparseCompressor(N, density=0.01, bits=4) for _ in pair]
        xs = _inputs(5)[:2]
        xs[0][17] = np.nan
        outs = [np.empty(N, np.float32) for _ in pair]

        def run(i: int) -> BaseException | None:
            try:
                comps[i].average_blocking(pair[i], xs[i], outs[i], timeout=10)
            except BaseException as exc:  # what each peer raised is the point
                return exc
            return None

        with ThreadPoolExecutor(2) as pool:
            t0 = time.monotonic()
            errors = list(pool.map(run, (0, 1)))
        assert all(type(e) is pccl.InvalidUsageError for e in errors), errors
        assert time.monotonic() - t0 < 1.0
        for c in pair:
            c.close()
