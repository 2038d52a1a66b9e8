"""Quantized all-reduce: bit-identical results, bounded error, smaller payloads."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl

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
