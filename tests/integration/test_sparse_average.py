"""``SparseCompressor.average`` over real communicators: groups of 2 to 5 peers at once (one
master, a peer group each) end with the same bytes on every peer, equal to the numpy
specification's mean of the parts in rank order, over several rounds of error feedback; the
blocking form agrees; a peer that leaves mid-run makes the others raise with their error
buffers unchanged."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio import blocking
from pccl_aio._compute import sparse_reference as ref
from pccl_aio._peer import testing
from tests.helpers import FAST, blocking_pair, join_peers

pytestmark = pytest.mark.timeout(120)

N = 200_003  # float32, odd: a short last chunk


def _expected(parts: list[np.ndarray], lay: ref.Layout) -> np.ndarray:
    out = np.zeros(lay.n, np.float32)
    for p in parts:
        ref.accumulate(out, p, lay)
    return out / np.float32(len(parts)) if len(parts) > 1 else out


async def test_groups_of_two_to_five_agree_bit_for_bit_with_the_specification(master):
    groups = [g for g in range(2, 6) for _ in range(g)]  # group g has g peers
    comms = await join_peers(master, len(groups), groups=groups)
    try:
        rng = np.random.default_rng(11)
        kinds = {2: (0.01, 2), 3: (0.02, 4), 4: (0.01, 8), 5: (0.005, 2)}
        comps = [pccl.SparseCompressor(N, density=kinds[g][0], bits=kinds[g][1], chunk=4096)
                 for g in groups]
        for _ in range(3):  # the error buffers carry over
            xs = [rng.standard_normal(N).astype(np.float32) for _ in comms]
            outs = [np.full(N, np.nan, np.float32) for _ in comms]
            parts = [c.compress(x).copy() for c, x in zip(comps, xs)]  # what each will send
            infos = await asyncio.gather(*(c.average(m, x, o)
                                           for c, m, x, o in zip(comps, comms, xs, outs)))
            for g in range(2, 6):
                members = sorted((i for i, gg in enumerate(groups) if gg == g),
                                 key=lambda i: comms[i].rank)
                want = _expected([parts[i] for i in members], comps[members[0]].layout)
                for i in members:
                    assert outs[i].tobytes() == want.tobytes(), (g, i)
                    assert infos[i].world_size == g
                    assert infos[i].tx_bytes <= comps[i].nbytes * (g - 1) * 1.1 + 4096
    finally:
        await asyncio.gather(*(c.close() for c in comms))


async def test_a_peer_lost_mid_exchange_leaves_the_error_buffers_as_they_were(master):
    comms = await join_peers(master, 3)
    comps = [pccl.SparseCompressor(N, density=0.01) for _ in comms]
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(N).astype(np.float32) for _ in comms]
    outs = [np.empty(N, np.float32) for _ in comms]
    try:
        await asyncio.gather(*(c.average(m, x, o) for c, m, x, o in zip(comps, comms, xs, outs)))
        before = [c.error.copy() for c in comps]
        waiting = [asyncio.ensure_future(c.average(m, x, o)) for c, m, x, o
                   in zip(comps[:2], comms[:2], xs, outs)]
        testing.crash(comms[2])  # gone without a word while the others gather
        for r in await asyncio.gather(*waiting, return_exceptions=True):
            assert isinstance(r, pccl.PeerLostError), r
        for c, b in zip(comps, before):
            assert np.array_equal(c.error, b)
        await asyncio.gather(*(c.average(m, x, o) for c, m, x, o
                               in zip(comps[:2], comms[:2], xs, outs)))  # the next one works
        assert outs[0].tobytes() == outs[1].tobytes()
    finally:
        await asyncio.gather(*(c.close() for c in comms))


def test_the_blocking_form_agrees() -> None:
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0, **FAST) as m:
        pair = blocking_pair(m.address)
        comps = [pccl.SparseCompressor(N, density=0.01, bits=4) for _ in pair]
        xs = [np.full(N, float(i + 1), np.float32) for i in range(2)]
        outs = [np.empty(N, np.float32) for _ in pair]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda i: comps[i].average_blocking(pair[i], xs[i], outs[i]), (0, 1)))
        assert outs[0].tobytes() == outs[1].tobytes()
        assert np.count_nonzero(outs[0]) == comps[0].layout.kept  # the same positions kept
        for c in pair:
            c.close()
