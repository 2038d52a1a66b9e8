"""Quantized all-reduce: bit-identical results, bounded error, smaller payloads."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from tests.helpers import crash_after

ALGOS = [pccl.QuantAlgo.MIN_MAX, pccl.QuantAlgo.ZERO_POINT_SCALE]
SRC = ["float16", "bfloat16", "float32", "float64"]


def _inputs(src: str, n: int, ws: int, seed: int):
    rng = np.random.default_rng(seed)
    vals = [rng.uniform(-2.0, 3.0, n) for _ in range(ws)]
    if src == "bfloat16":
        torch = pytest.importorskip("torch")
        return [torch.tensor(v, dtype=torch.bfloat16) for v in vals]
    return [v.astype(src) for v in vals]


def _f64(x) -> np.ndarray:
    if hasattr(x, "numpy"):
        return x.double().numpy()
    return np.asarray(x, np.float64)


def _bytes(x) -> bytes:
    if hasattr(x, "numpy"):
        import torch

        return x.view(torch.int16).numpy().tobytes()
    return x.tobytes()


EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


@pytest.mark.parametrize("ws", [2, 3, 4, 5])
async def test_every_algo_qdtype_and_source_is_bit_identical_and_bounded(peers, ws):
    comms = await peers(ws)
    for algo in ALGOS:
        for qd, bits in (("uint8", 8), ("uint16", 16)):
            for src in SRC:
                for op in (pccl.ReduceOp.SUM, pccl.ReduceOp.AVG):
                    xs = _inputs(src, 4099, ws, seed=ws * 100 + bits + algo)
                    exact = np.sum([_f64(x) for x in xs], axis=0)
                    if op == pccl.ReduceOp.AVG:
                        exact /= ws
                    outs = [x.clone() if hasattr(x, "clone") else x.copy() for x in xs]
                    q = pccl.Quantization(algo=algo, dtype=qd)
                    await asyncio.gather(*(c.all_reduce(o, op=op, quantization=q)
                                           for c, o in zip(comms, outs)))
                    for o in outs:  # the owner keeps D(Q(chunk)), forwarders never re-quantize
                        assert _bytes(o) == _bytes(outs[0]), (algo, qd, src, op)
                    got = _f64(outs[0])
                    value_range = float(exact.max() - exact.min())
                    # the bound, plus the source dtype's own rounding of each hop
                    bound = ws * value_range / (2**bits - 1) + \
                        ws * EPS[src] * float(np.abs(exact).max())
                    err = float(np.abs(got - exact).max())
                    assert err <= bound, (algo.name, qd, src, op.name, err, bound)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
async def test_pccl_scenario_21_zero_point_scale_42_plus_43_is_exactly_85(peers, dtype):
    comms = await peers(2)
    xs = [np.full(1024, 42, dtype), np.full(1024, 43, dtype)]
    q = pccl.Quantization(algo=pccl.QuantAlgo.ZERO_POINT_SCALE, dtype="uint8")
    await asyncio.gather(*(c.all_reduce(x, quantization=q) for c, x in zip(comms, xs)))
    assert (xs[0] == 85).all() and (xs[1] == 85).all()


async def test_uint8_payload_is_under_three_tenths_of_float32(peers):
    comms = await peers(3)
    xs = [np.random.default_rng(i).random(1 << 18, dtype=np.float32) for i in range(3)]
    plain = await asyncio.gather(*(c.all_reduce(x.copy()) for c, x in zip(comms, xs)))
    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8")
    quant = await asyncio.gather(*(c.all_reduce(x, quantization=q) for c, x in zip(comms, xs)))
    for p, r in zip(plain, quant):
        assert r.tx_bytes <= 0.3 * p.tx_bytes and r.rx_bytes <= 0.3 * p.rx_bytes
        assert r.tx_bytes == p.tx_bytes // 4  # exactly one byte per float32


async def test_quantization_arguments_are_checked(peers):
    comms = await peers(2)
    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8")
    with pytest.raises(pccl.InvalidUsageError, match="float"):
        await comms[0].all_reduce(np.zeros(8, np.int32), quantization=q)
    with pytest.raises(pccl.InvalidUsageError):
        pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="int8")
    with pytest.raises(pccl.InvalidUsageError):
        await comms[0].all_reduce(np.zeros(8, np.float32), quantization="uint8")
    # peers that disagree on the quantization get a clear error, not garbage
    r = await asyncio.gather(
        comms[0].all_reduce(np.zeros(8, np.float32), quantization=q),
        comms[1].all_reduce(np.zeros(8, np.float32)), return_exceptions=True)
    assert all(isinstance(e, pccl.InvalidUsageError) for e in r), r


async def test_constant_and_non_finite_inputs(peers):
    comms = await peers(3)
    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8")
    xs = [np.full(1000, 1.5, np.float32) for _ in comms]
    await asyncio.gather(*(c.all_reduce(x, quantization=q) for c, x in zip(comms, xs)))
    assert (xs[0] == 4.5).all()  # a constant survives quantization exactly
    ys = [np.linspace(0, 1, 1000, dtype=np.float32) for _ in comms]
    for y in ys:
        y[10] = np.nan
    await asyncio.gather(*(c.all_reduce(y, quantization=q) for c, y in zip(comms, ys)))
    assert all(y.tobytes() == ys[0].tobytes() for y in ys)  # still identical everywhere


async def test_out_of_place_quantized_matches_in_place_and_leaves_src(peers):
    comms = await peers(3)
    xs = _inputs("float32", 3 * (1 << 18) + 7, 3, seed=11)
    keep = [x.copy() for x in xs]
    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8")
    outs = [np.empty_like(x) for x in xs]
    await asyncio.gather(*(c.all_reduce(x, o, quantization=q, tag=1)
                           for c, x, o in zip(comms, xs, outs)))
    ins = [x.copy() for x in xs]
    await asyncio.gather(*(c.all_reduce(x, quantization=q, tag=2) for c, x in zip(comms, ins)))
    for x, k in zip(xs, keep):
        assert x.tobytes() == k.tobytes()
    for o, i in zip(outs, ins):
        assert o.tobytes() == i.tobytes() == ins[0].tobytes()


# ---- uint4 MIN_MAX: 15 levels, two codes per byte -------------------------------------------

U4 = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint4")


@pytest.mark.parametrize("ws", [2, 3, 4])
async def test_uint4_is_bit_identical_and_bounded_in_and_out_of_place(peers, ws):
    """Odd and even counts (chunks and segments cut at even elements, an odd last one), SUM
    and AVG, in place and out of place: identical bytes everywhere, the owner's decoded
    value kept, and the error within one 15-level step of the range per hop."""
    comms = await peers(ws)
    for src in SRC:
        for n in (1, 2, 7, 4099, 4100):
            for op in (pccl.ReduceOp.SUM, pccl.ReduceOp.AVG):
                for in_place in (True, False):
                    xs = _inputs(src, n, ws, seed=ws * 1000 + n + op)
                    keep = [_bytes(x) for x in xs]
                    exact = np.sum([_f64(x) for x in xs], axis=0)
                    if op == pccl.ReduceOp.AVG:
                        exact /= ws
                    outs = [x.clone() if hasattr(x, "clone") else x.copy() for x in xs]
                    if in_place:
                        calls = (c.all_reduce(o, op=op, quantization=U4)
                                 for c, o in zip(comms, outs))
                    else:
                        calls = (c.all_reduce(x, o, op=op, quantization=U4)
                                 for c, x, o in zip(comms, xs, outs))
                    infos = await asyncio.gather(*calls)
                    case = (src, n, op.name, in_place)
                    for o in outs:
                        assert _bytes(o) == _bytes(outs[0]), case
                    if not in_place:
                        assert [_bytes(x) for x in xs] == keep, case
                    got = _f64(outs[0])
                    value_range = float(exact.max() - exact.min())
                    bound = ws * value_range / 15 + ws * EPS[src] * float(np.abs(exact).max())
                    err = float(np.abs(got - exact).max())
                    assert err <= bound, (*case, err, bound)
                    # 2 (ws - 1) chunks of n / ws elements sent, half a byte each (rounded up)
                    assert all(i.tx_bytes <= (ws - 1) * (n / ws + 4) for i in infos), case


async def test_uint4_payload_is_half_of_uint8(peers):
    comms = await peers(3)
    xs = [np.random.default_rng(i).random(1 << 18, dtype=np.float32) for i in range(3)]
    q8 = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8")
    r8 = await asyncio.gather(*(c.all_reduce(x.copy(), quantization=q8)
                                for c, x in zip(comms, xs)))
    r4 = await asyncio.gather(*(c.all_reduce(x, quantization=U4) for c, x in zip(comms, xs)))
    for a, b in zip(r8, r4):  # chunks are cut at even elements: a byte or two apart
        assert abs(2 * b.tx_bytes - a.tx_bytes) <= 6 and abs(2 * b.rx_bytes - a.rx_bytes) <= 6
    assert all(x.tobytes() == xs[0].tobytes() for x in xs)


async def test_uint4_multi_segment_matches_a_simulation_of_the_ring(peers):
    """Several 1 MiB wire segments per chunk (2**21 elements each): every peer equals the
    reference kernels' own run of the ring, segment by segment."""
    from pccl_aio._compute import reference as ref
    from pccl_aio._peer.data.core import ring

    ws, n = 2, 5 * (1 << 20) + 3
    comms = await peers(ws)
    xs = _inputs("float32", n, ws, seed=4)
    outs = [x.copy() for x in xs]
    await asyncio.gather(*(c.all_reduce(o, quantization=U4) for c, o in zip(comms, outs)))
    assert outs[0].tobytes() == outs[1].tobytes()
    # two peers: each chunk is quantized by its sender, accumulated and re-quantized by its
    # owner, which keeps the decoded value; segments of 2**21 elements from even bounds
    bounds = ring.chunk_bounds(n, ws, 2)
    want = np.empty(n, np.float32)
    f32, u4 = 10, 12
    for c in range(ws):
        for s, m in ring.segments(bounds[c], bounds[c + 1], 1 << 21):
            mine, other = xs[(c + 1) % ws][s : s + m].copy(), xs[c][s : s + m]
            codes = bytearray((m + 1) // 2)
            meta = ref.quantize(codes, other, f32, u4, 1)
            ref.dequantize_accumulate(mine, codes, *meta, 0, f32, u4, 1)
            meta = ref.quantize(codes, mine, f32, u4, 1)
            ref.dequantize(want[s : s + m], codes, *meta, f32, u4, 1)
    assert outs[0].tobytes() == want.tobytes()


async def test_uint4_arguments_are_checked(peers):
    comms = await peers(2)
    for bad in ({"algo": pccl.QuantAlgo.ZERO_POINT_SCALE, "dtype": "uint4"},
                {"algo": pccl.QuantAlgo.ZERO_POINT_SCALE, "dtype": pccl.DataType.UINT4}):
        with pytest.raises(pccl.InvalidUsageError, match="MIN_MAX only"):
            pccl.Quantization(**bad)
    assert pccl.Quantization(dtype=pccl.DataType.UINT4).dtype is pccl.DataType.UINT4
    with pytest.raises(pccl.InvalidUsageError, match="float"):
        await comms[0].all_reduce(np.zeros(8, np.int32), quantization=U4)
    # peers that disagree (uint4 vs uint8) get a clear error on every peer
    q8 = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8")
    r = await asyncio.gather(
        comms[0].all_reduce(np.zeros(8, np.float32), quantization=U4),
        comms[1].all_reduce(np.zeros(8, np.float32), quantization=q8), return_exceptions=True)
    assert all(isinstance(e, pccl.InvalidUsageError) for e in r), r


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out-of-place"])
async def test_uint4_crash_mid_collective_raises_everywhere_and_leaves_inputs(peers, in_place):
    """A peer crashing after the first uint4 reduce-scatter segment arrived: every survivor
    raises, its input is intact (restored in place), and the retry is identical everywhere."""
    comms = await peers(3)
    n = 3 * (1 << 21) + 5  # 2**21 elements per 1 MiB uint4 segment: two segments per chunk
    xs = _inputs("float32", n, 3, seed=9)
    originals = [x.copy() for x in xs]
    outs = [np.full(n, -1.0, np.float32) for _ in range(3)]
    with crash_after(comms[0], comms[1], 0, 1) as seen:
        hs = [c.all_reduce_async(x, None if in_place else o, tag=3, quantization=U4)
              for c, x, o in zip(comms, xs, outs)]
        res = await asyncio.gather(hs[0], hs[2], return_exceptions=True)
    assert seen[0] >= 1
    assert all(isinstance(r, pccl.PeerLostError) for r in res), res
    for i in (0, 2):
        assert xs[i].tobytes() == originals[i].tobytes()
    await asyncio.gather(*(comms[i].all_reduce(xs[i], None if in_place else outs[i], tag=3,
                                               quantization=U4) for i in (0, 2)))
    result = [xs[i] if in_place else outs[i] for i in (0, 2)]
    assert result[0].tobytes() == result[1].tobytes()
    exact = _f64(originals[0]) + _f64(originals[2])
    assert float(np.abs(_f64(result[0]) - exact).max()) <= 2 * float(np.ptp(exact)) / 15
