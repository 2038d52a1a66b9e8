"""``Buckets``: many tensors all-reduced through a few flat reusable buffers give what
per-tensor all-reduces give, on every peer."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

import pccl_aio as pccl
from pccl_aio import blocking


def _torch_tensors(peer: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(peer)
    wide = torch.randn(64, 48, generator=g)
    return [torch.randn(1000, generator=g), torch.randn(300, generator=g).to(torch.bfloat16),
            torch.randint(-50, 50, (77,), generator=g), wide.t(),  # not contiguous
            torch.randn(5000, generator=g), torch.randn(3, generator=g)]


async def test_buckets_match_per_tensor_all_reduces_bit_for_bit(peers):
    """Two peers (a float sum of two terms has one order), mixed dtypes, a non-contiguous
    tensor, a 8 KiB cap: several buckets, reused by a second call."""
    comms = await peers(2)
    mine = [_torch_tensors(i) for i in range(2)]
    ref = [[t.clone() for t in ts] for ts in mine]
    buckets = [pccl.Buckets(ts, bucket_cap_mb=8 / 1024) for ts in mine]
    assert len(buckets[0].flat) > 3 and [len(f) for f in buckets[0].flat] == [
        len(f) for f in buckets[1].flat]
    flats = [[f.data_ptr() for f in b.flat] for b in buckets]
    for _ in range(2):
        infos = await asyncio.gather(*(b.all_reduce(c) for b, c in zip(buckets, comms)))
        assert all(i.world_size == 2 for i in infos[0])
        for i in range(len(ref[0])):
            pair = [ref[0][i].contiguous(), ref[1][i].contiguous()]
            await asyncio.gather(*(c.all_reduce(p, tag=100 + i) for c, p in zip(comms, pair)))
            ref[0][i], ref[1][i] = pair
        for a, b, r in zip(mine[0], mine[1], ref[0]):
            assert a.dtype == r.dtype and torch.equal(a, r) and torch.equal(b, r)
    assert flats == [[f.data_ptr() for f in b.flat] for b in buckets]  # reused, not remade


async def test_numpy_buckets_on_three_peers_and_a_quantized_exchange(peers):
    comms = await peers(3)
    arrays = [[np.arange(500, dtype=np.int32) * (p + 1), np.full((20, 30), p, np.int64)]
              for p in range(3)]
    buckets = [pccl.Buckets(a, bucket_cap_mb=1 / 1024) for a in arrays]
    await asyncio.gather(*(b.all_reduce(c) for b, c in zip(buckets, comms)))
    for a in arrays:
        np.testing.assert_array_equal(a[0], np.arange(500, dtype=np.int32) * 6)
        np.testing.assert_array_equal(a[1], np.full((20, 30), 3, np.int64))
    xs = [[np.linspace(0, 1, 4096, dtype=np.float32) * (p + 1)] for p in range(3)]
    qb = [pccl.Buckets(x) for x in xs]
    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype=pccl.DataType.UINT8)
    await asyncio.gather(*(b.all_reduce(c, quantization=q, op=pccl.ReduceOp.AVG)
                           for b, c in zip(qb, comms)))
    assert xs[0][0].tobytes() == xs[1][0].tobytes() == xs[2][0].tobytes()
    np.testing.assert_allclose(xs[0][0], np.linspace(0, 2, 4096), atol=0.05)
    # uint4 (two codes per byte) over a bucket of odd-sized tensors
    ys = [[np.linspace(0, 1, 4095, dtype=np.float32) * (p + 1), np.ones(7, np.float32)]
          for p in range(3)]
    q4 = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint4")
    await asyncio.gather(*(pccl.Buckets(y).all_reduce(c, quantization=q4, op=pccl.ReduceOp.AVG)
                           for y, c in zip(ys, comms)))
    for i in range(2):
        assert ys[0][i].tobytes() == ys[1][i].tobytes() == ys[2][i].tobytes()
    np.testing.assert_allclose(ys[0][0], np.linspace(0, 2, 4095), atol=3 * 2 / 15)
    np.testing.assert_allclose(ys[0][1], 1.0, atol=3 * 2 / 15)


def _two_blocking_peers(m: blocking.Master) -> tuple[blocking.Communicator, blocking.Communicator]:
    a = blocking.Communicator(m.address, heartbeat_interval=0.2)
    b = blocking.Communicator(m.address, heartbeat_interval=0.2)
    a.connect()
    joined = threading.Thread(target=b.connect)
    joined.start()
    while not a.are_peers_pending():
        pass
    a.update_topology()
    joined.join()
    return a, b


def test_blocking_buckets_from_two_threads_and_the_deprecated_alias():
    """``pccl_aio.blocking.Buckets.all_reduce`` blocks; ``pccl_aio.Buckets.all_reduce_blocking``
    still works, with a ``DeprecationWarning``."""
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0) as m:
        a, b = _two_blocking_peers(m)
        try:
            ts = [[torch.full((1000,), float(p + 1)), torch.ones(10, dtype=torch.bfloat16)]
                  for p in range(2)]
            old, new = pccl.Buckets(ts[0]), blocking.Buckets(ts[1])
            assert isinstance(new, pccl.Buckets)
            results: list[list[pccl.ReduceInfo]] = []
            other = threading.Thread(target=lambda: results.append(new.all_reduce(b)))
            other.start()
            with pytest.warns(DeprecationWarning, match=r"blocking\.Buckets.*all_reduce\(comm\)"):
                infos = old.all_reduce_blocking(a)
            other.join()
            assert [i.world_size for i in infos] == [i.world_size for i in results[0]] == [2, 2]
            for t in ts:
                assert torch.equal(t[0], torch.full((1000,), 3.0))
                assert torch.equal(t[1], torch.full((10,), 2.0, dtype=torch.bfloat16))
        finally:
            a.close()
            b.close()


def test_blocking_buckets_grads_of_as_the_readme_writes_it():
    """``from pccl_aio.blocking import Buckets, Communicator``; ``Buckets.grads_of(model)``
    is that class; ``grads.all_reduce(comm, op=pccl.ReduceOp.AVG)`` averages the gradients."""
    from pccl_aio.blocking import Buckets, Communicator

    with blocking.Master("127.0.0.1", 0, admission_interval=0.0) as m:
        comms: tuple[Communicator, Communicator] = _two_blocking_peers(m)
        try:
            models = [torch.nn.Linear(4, 3) for _ in range(2)]
            models[1].load_state_dict(models[0].state_dict())
            grads = [Buckets.grads_of(model) for model in models]
            assert all(type(g) is Buckets for g in grads)
            for i, model in enumerate(models):
                model(torch.full((2, 4), float(i + 1))).sum().backward()
            want = [(p.grad + q.grad) / 2 for p, q in zip(*(mo.parameters() for mo in models))]
            threads = [threading.Thread(target=g.all_reduce, args=(c,),
                                        kwargs={"op": pccl.ReduceOp.AVG})
                       for g, c in zip(grads, comms)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for model in models:
                for p, w in zip(model.parameters(), want):
                    assert torch.equal(p.grad, w)
        finally:
            for c in comms:
                c.close()


def test_bad_buckets_are_refused_at_once():
    with pytest.raises(pccl.InvalidUsageError, match="at least one"):
        pccl.Buckets([])
    with pytest.raises(pccl.InvalidUsageError, match="not a mix"):
        pccl.Buckets([torch.ones(3), np.ones(3)])
    with pytest.raises(pccl.InvalidUsageError, match="positive"):
        pccl.Buckets([torch.ones(3)], bucket_cap_mb=0)


async def test_grads_of_reads_each_steps_gradients_and_fills_missing_ones(peers):
    """``Buckets.grads_of(module)``: gradients made after the buckets (and remade by
    ``zero_grad(set_to_none=True)``) are reduced; a parameter unused this step contributes
    zeros; the result is what per-tensor AVG all-reduces give, on both peers."""
    comms = await peers(2)
    models = [torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2)) for _ in range(2)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    buckets = [pccl.Buckets.grads_of(m) for m in models]
    assert all(p.grad is None for m in models for p in m.parameters())
    for step in range(2):
        for i, m in enumerate(models):
            m.zero_grad(set_to_none=True)
            x = torch.full((4, 6), float(i + step + 1))
            out = m(x) if i == 0 else m[0](x).sum()  # peer 1 leaves the last layer unused
            out.sum().backward()
        assert models[1][1].weight.grad is None
        want = [(a.grad + (b.grad if b.grad is not None else 0)) / 2
                for a, b in zip(models[0].parameters(), models[1].parameters())]
        await asyncio.gather(*(b.all_reduce(c, op=pccl.ReduceOp.AVG)
                               for b, c in zip(buckets, comms)))
        for m in models:
            for p, w in zip(m.parameters(), want):
                assert torch.equal(p.grad, w)
