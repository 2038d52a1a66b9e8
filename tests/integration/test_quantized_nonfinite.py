"""Quantized all-reduce and non-finite values (issue 45, item 5), three peers over sockets on
127.0.0.1, every (algorithm, code) pair, SUM and AVG: a NaN or an infinity in one peer's input,
an all-NaN input, or a sum that overflows the dtype makes NaN of the block it is in (here
3 x 1000 elements: each peer's chunk of the ring is one segment, so one block) and of nothing
else, the same bytes on every peer; a range out to the dtype's largest value comes back
finite and within the bound. Before, all of these came back as finite numbers (an all-NaN
input as zeros, sums of 3e38 a third of them 200 % off), and -FLT_MAX, decoded as -inf with a
zero point, as about -2."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl

pytestmark = pytest.mark.timeout(120)

N, WORLD, BLOCK = 3000, 3, 1000
CASES = [(a, d) for a, d in ((pccl.QuantAlgo.MIN_MAX, "uint4"), (pccl.QuantAlgo.MIN_MAX, "uint8"),
                             (pccl.QuantAlgo.MIN_MAX, "uint16"),
                             (pccl.QuantAlgo.ZERO_POINT_SCALE, "uint8"),
                             (pccl.QuantAlgo.ZERO_POINT_SCALE, "uint16"))]
BITS = {"uint4": 4, "uint8": 8, "uint16": 16}
NAN_BITS = {"float32": 0x7FC00000, "float16": 0x7E00}
F32_MAX = float(np.finfo(np.float32).max)


def _inputs(dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2.0, 3.0, N).astype(dtype) for _ in range(WORLD)]


def _spoil(case: str, xs: list[np.ndarray]) -> set[int]:
    """Put the case's values into the inputs; the blocks (chunk indices) they poison."""
    big = 3e38 if xs[0].dtype == np.float32 else 3e4  # three of them overflow the dtype
    if case == "nan":
        xs[1][5] = np.nan
        return {0}
    if case == "+inf":
        xs[2][1500] = np.inf
        return {1}
    if case == "-inf":
        xs[0][2999] = -np.inf
        return {2}
    if case == "all-nan":
        for x in xs:
            x[:] = np.nan
        return {0, 1, 2}
    if case == "overflow":
        for x in xs:
            x[5], x[2500] = big, -big
        return {0, 2}
    assert case == "largest"  # -FLT_MAX and FLT_MAX in one input: finite sums
    xs[0][10], xs[0][11] = -F32_MAX, F32_MAX
    return set()


@pytest.mark.parametrize(("case", "dtype"), [
    ("nan", "float32"), ("+inf", "float32"), ("-inf", "float32"), ("all-nan", "float32"),
    ("overflow", "float32"), ("overflow", "float16"), ("largest", "float32")])
async def test_non_finite_values_make_nan_of_their_block_on_every_peer(peers, case, dtype):
    comms = await peers(WORLD)
    for algo, qd in CASES:
        q = pccl.Quantization(algo=algo, dtype=qd)
        for op in (pccl.ReduceOp.SUM, pccl.ReduceOp.AVG):
            xs = _inputs(dtype, seed=len(case) + BITS[qd])
            poisoned = _spoil(case, xs)
            with np.errstate(all="ignore"):
                exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
            if op == pccl.ReduceOp.AVG:
                exact /= WORLD
            await asyncio.gather(*(c.all_reduce(x, op=op, quantization=q)
                                   for c, x in zip(comms, xs)))
            what = (case, dtype, algo.name, qd, op.name)
            assert all(x.tobytes() == xs[0].tobytes() for x in xs), what
            got = xs[0]
            blocks = np.arange(N) // BLOCK
            bad = np.isin(blocks, sorted(poisoned))
            bits = got.view(np.uint32 if dtype == "float32" else np.uint16)
            assert (bits[bad] == NAN_BITS[dtype]).all(), what  # the canonical NaN
            assert np.isfinite(got[~bad]).all(), what
            if case != "all-nan":
                ok = exact[~bad]
                bound = WORLD * float(ok.max() - ok.min()) / (2 ** BITS[qd] - 1) + \
                    WORLD * 2.0**-10 * float(np.abs(ok).max())
                assert float(np.abs(got[~bad] - ok).max()) <= bound, what


async def test_a_quantized_reduce_scatter_gives_nan_to_the_poisoned_chunk_only(peers):
    """The chunk with a NaN (from another rank's input) is NaN at its owner; the owner's own
    infinity stays in its element (its chunk does not travel on); the rest is finite."""
    comms = await peers(WORLD)
    ranks = [c.rank for c in comms]
    n = 500
    for algo, qd in CASES:
        q = pccl.Quantization(algo=algo, dtype=qd)
        srcs = [np.random.default_rng(i).uniform(-2.0, 3.0, WORLD * n).astype(np.float32)
                for i in range(WORLD)]
        owner0, owner2 = ranks.index(0), ranks.index(2)
        srcs[(owner0 + 1) % WORLD][7] = np.nan  # in chunk 0, on a rank that is not its owner
        srcs[owner2][2 * n + 9] = np.inf  # in chunk 2, at its owner
        dsts = [np.empty(n, np.float32) for _ in comms]
        await asyncio.gather(*(c.reduce_scatter(s, d, op=pccl.ReduceOp.SUM, quantization=q)
                               for c, s, d in zip(comms, srcs, dsts)))
        what = (algo.name, qd)
        assert (dsts[owner0].view(np.uint32) == 0x7FC00000).all(), what
        assert np.isposinf(dsts[owner2][9]) and np.isfinite(np.delete(dsts[owner2], 9)).all()
        assert np.isfinite(dsts[ranks.index(1)]).all(), what
