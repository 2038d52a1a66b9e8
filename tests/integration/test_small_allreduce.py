"""The small all-reduce (``core/gather.py``): below GATHER_MAX bytes every input goes once round
the ring and each peer reduces them all in rank order; real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer.data.core.gather import GATHER_MAX

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("ws", [2, 3])  # (from 4 peers up: rounds, test_logp.py)
async def test_small_buffers_take_p_minus_one_hops_and_agree_bit_for_bit(peers, ws):
    comms = await peers(ws)
    rng = np.random.default_rng(ws)
    for n, op in ((1, pccl.ReduceOp.SUM), (1000, pccl.ReduceOp.AVG),
                  (GATHER_MAX // 4, pccl.ReduceOp.SUM), (GATHER_MAX // 4 + 1, pccl.ReduceOp.MAX)):
        xs = [rng.standard_normal(n).astype(np.float32) for _ in range(ws)]
        outs = [np.empty_like(x) for x in xs]
        infos = await asyncio.gather(*(c.all_reduce(x, o, op=op) for c, x, o in
                                       zip(comms, xs, outs)))
        for o in outs:  # floats summed in one order everywhere: the same bits
            assert o.tobytes() == outs[0].tobytes()
        if op == pccl.ReduceOp.MAX:
            np.testing.assert_array_equal(outs[0], np.max(xs, axis=0))
        else:
            want = np.sum(np.array(xs, np.float64), axis=0) / (ws if op == pccl.ReduceOp.AVG else 1)
            np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)
        nbytes = n * 4
        small = nbytes <= GATHER_MAX
        for info in infos:  # the small path sends every other input on once; the ring less
            assert (info.tx_bytes == (ws - 1) * nbytes) is (small or ws == 2), (n, info)


async def test_a_small_early_start_with_mismatched_sizes_fails_everywhere_and_restores(peers):
    comms = await peers(2)
    xs = [np.full(100, i + 1, np.float32) for i in range(2)]
    await asyncio.gather(*(c.all_reduce(x.copy(), tag=8) for c, x in zip(comms, xs)))
    outs = [xs[0].copy(), xs[1][:50].copy()]  # the second run starts early on its ticket
    res = await asyncio.gather(*(c.all_reduce(o, tag=8) for c, o in zip(comms, outs)),
                               return_exceptions=True)
    assert all(isinstance(r, pccl.PcclError) for r in res), res
    np.testing.assert_array_equal(outs[0], xs[0])
    np.testing.assert_array_equal(outs[1], xs[1][:50])
