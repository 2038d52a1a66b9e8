"""Issue 32: broadcast, all-gather and reduce-scatter against a numpy reference, every dtype
and op, groups of one to five peers at once (one master, five peer groups), odd counts,
counts smaller than the world and counts of several segments; every peer's bytes identical;
torch tensors; quantized reduce-scatter; argument checks before anything is sent."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from tests.helpers import FAST, blocking_pair, join_peers
from tests.integration.test_allreduce import FLOAT_DTYPES, INT_DTYPES, _expected, _inputs

pytestmark = pytest.mark.timeout(120)

DTYPES = INT_DTYPES + FLOAT_DTYPES
BIG = 300_007  # float32: two segments of the data path, odd


def _by_rank(comms: list[pccl.Communicator]) -> list[pccl.Communicator]:
    return sorted(comms, key=lambda c: c.rank)


async def _group_cases(comms: list[pccl.Communicator]) -> None:
    """Every kind, dtype and op in one group (ranks in order), checked against numpy."""
    world = len(comms)
    for dtype in DTYPES:
        for n in (1, world - 1 or 1, 7, 1025):
            xs = _inputs(dtype, n, world, seed=n * 7 + world)
            # all-gather: rank r's block at [r n, (r + 1) n) on every peer
            outs = [np.full(world * n, 9, dtype) for _ in comms]
            infos = await asyncio.gather(*(c.all_gather(x, o)
                                           for c, x, o in zip(comms, xs, outs)))
            assert all(i.world_size == world for i in infos)
            for o in outs:
                np.testing.assert_array_equal(o, np.concatenate(xs), err_msg=f"{dtype} {n}")
            # broadcast from each root: its bytes everywhere, nothing else touched
            for root in range(world):
                ts = [x.copy() for x in xs]
                await asyncio.gather(*(c.broadcast(t, root=root) for c, t in zip(comms, ts)))
                assert all(t.tobytes() == xs[root].tobytes() for t in ts), (dtype, n, root)
            # reduce-scatter, every op: rank r holds chunk r of the reduced whole
            big = _inputs(dtype, world * n, world, seed=n * 13 + world)
            for op in pccl.ReduceOp:
                want = _expected(big, op)
                dsts = [np.empty(n, dtype) for _ in comms]
                await asyncio.gather(*(c.reduce_scatter(s, d, op=op)
                                       for c, s, d in zip(comms, big, dsts)))
                for r, d in enumerate(dsts):
                    np.testing.assert_array_equal(d, want[r * n : (r + 1) * n],
                                                  err_msg=f"{dtype} {op!r} n={n} rank {r}")
    # several segments per block, and in place (src is this rank's slot of dst)
    outs = [np.zeros(world * BIG, np.float32) for _ in comms]
    for r, o in enumerate(outs):
        o[r * BIG : (r + 1) * BIG] = np.arange(BIG, dtype=np.float32) + r
    await asyncio.gather(*(c.all_gather(o[r * BIG : (r + 1) * BIG], o)
                           for r, (c, o) in enumerate(zip(comms, outs))))
    want = np.concatenate([np.arange(BIG, dtype=np.float32) + r for r in range(world)])
    assert all(o.tobytes() == want.tobytes() for o in outs)
    ts = [np.full(BIG, r, np.float32) for r in range(world)]
    await asyncio.gather(*(c.broadcast(t, root=world - 1) for c, t in zip(comms, ts)))
    assert all((t == world - 1).all() for t in ts)
    srcs = [np.full(world * BIG, r + 1, np.float32) for r in range(world)]
    dsts = [np.empty(BIG, np.float32) for _ in comms]
    await asyncio.gather(*(c.reduce_scatter(s, d) for c, s, d in zip(comms, srcs, dsts)))
    assert all((d == world * (world + 1) // 2).all() for d in dsts)


async def test_every_kind_dtype_and_op_in_groups_of_one_to_five(master):
    groups = [g for g in range(1, 6) for _ in range(g)]  # group g has g peers
    comms = await join_peers(master, len(groups), groups=groups)
    try:
        by_group = [_by_rank([c for c, g in zip(comms, groups) if g == size])
                    for size in range(1, 6)]
        await asyncio.gather(*(_group_cases(cs) for cs in by_group))
    finally:
        await asyncio.gather(*(c.close() for c in comms))


async def test_torch_tensors_and_bfloat16(peers):
    torch = pytest.importorskip("torch")
    comms = _by_rank(await peers(3))
    for dt in (torch.bfloat16, torch.float16, torch.float32, torch.int64):
        xs = [torch.arange(5, dtype=dt) + r for r in range(3)]
        outs = [torch.zeros(15, dtype=dt) for _ in comms]
        await asyncio.gather(*(c.all_gather(x, o) for c, x, o in zip(comms, xs, outs)))
        assert all(torch.equal(o, torch.cat(xs)) for o in outs)
        ts = [x.clone() for x in xs]
        await asyncio.gather(*(c.broadcast(t, root=2) for c, t in zip(comms, ts)))
        assert all(torch.equal(t, xs[2]) for t in ts)
        srcs = [torch.arange(15, dtype=dt) * (r + 1) for r in range(3)]
        dsts = [torch.empty(5, dtype=dt) for _ in comms]
        await asyncio.gather(*(c.reduce_scatter(s, d) for c, s, d in zip(comms, srcs, dsts)))
        total = srcs[0] + srcs[1] + srcs[2]
        assert all(torch.equal(d, total[r * 5 : (r + 1) * 5]) for r, d in enumerate(dsts))


@pytest.mark.parametrize("qdtype", ["uint8", "uint16", "uint4"])
async def test_quantized_reduce_scatter_is_close_to_the_exact_one(peers, qdtype):
    comms = _by_rank(await peers(3))
    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype=qdtype)
    rng = np.random.default_rng(5)
    n = 100_002
    srcs = [rng.standard_normal(3 * n).astype(np.float32) for _ in comms]
    dsts = [np.empty(n, np.float32) for _ in comms]
    infos = await asyncio.gather(*(c.reduce_scatter(s, d, quantization=q)
                                   for c, s, d in zip(comms, srcs, dsts)))
    total = sum(srcs)
    step = {"uint8": 1 / 255, "uint16": 1 / 65535, "uint4": 1 / 15}[qdtype]
    for r, d in enumerate(dsts):
        chunk = total[r * n : (r + 1) * n]
        # two quantized hops, each within half a step of the range of what it carried
        assert np.abs(d - chunk).max() <= 3 * step * 2 * np.abs(total).max() + 1e-5
    unquantized = 2 * n * 4  # bytes each peer would send unquantized
    assert all(i.tx_bytes < unquantized for i in infos)


async def test_a_group_of_one_gathers_broadcasts_and_scatters_at_once(peers):
    (a,) = await peers(1)
    x = np.arange(6, dtype=np.float32)
    out = np.zeros(6, np.float32)
    assert (await a.all_gather(x, out)).world_size == 1 and (out == x).all()
    out[:] = 0
    await a.reduce_scatter(x, out, op=pccl.ReduceOp.AVG)
    assert (out == x).all()
    await a.broadcast(x, root=0)
    with pytest.raises(pccl.InvalidUsageError, match="root must be a rank in"):
        await a.broadcast(x, root=1)


async def test_bad_arguments_fail_before_anything_is_sent(peers):
    a, b = _by_rank(await peers(2))
    x = np.zeros(4, np.float32)
    cases = [
        (a.all_gather(x, np.zeros(7, np.float32)), "needs 8"),
        (a.all_gather(x, np.zeros(8, np.float64)), "differ"),
        (a.all_gather(x[1:3], x), "not its slot"),
        (a.reduce_scatter(x, np.zeros(3, np.float32)), "needs 6"),
        (a.reduce_scatter(x, x[:2]), "overlap"),
        (a.reduce_scatter(np.zeros(6, np.float32), np.zeros(3, np.float32),
                          quantization=pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX,
                                                         dtype="uint4")), "even count"),
        (a.broadcast(x, root=2), r"\[0, 2\)"),
        (a.broadcast(x, root=True), "root must be"),
        (a.broadcast(x, root=0, restore_on_abort=1), "restore_on_abort must be"),
        (a.broadcast(np.zeros(4, np.float32).view(np.float32)[::2], root=0), "contiguous"),
        (a.all_gather(x, np.zeros(8, np.float32), tag=-1), "tag must be"),
    ]
    for call, words in cases:
        with pytest.raises(pccl.InvalidUsageError, match=words):
            await call
    # nothing was sent: both still run a collective together
    y = [np.full(2, r, np.float32) for r in range(2)]
    out = [np.zeros(4, np.float32) for _ in range(2)]
    await asyncio.gather(*(c.all_gather(v, o) for c, v, o in zip((a, b), y, out)))
    assert all((o == [0, 0, 1, 1]).all() for o in out)
    assert FAST  # (the group was made with the suite's fast timeouts)


async def test_a_timeout_or_a_cancel_ends_it_for_the_group(peers):
    a, b = _by_rank(await peers(2))
    x = np.ones(4, np.float32)
    with pytest.raises(pccl.PcclTimeoutError):
        await a.all_gather(x, np.zeros(8, np.float32), timeout=0.3)  # b never calls
    h = a.reduce_scatter_async(np.ones(8, np.float32), np.zeros(4, np.float32), tag=1)
    assert h.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h
    t = np.arange(4, dtype=np.float32)
    outs = [t.copy(), np.zeros(4, np.float32)]
    await asyncio.gather(*(c.broadcast(o, root=0, tag=2) for c, o in zip((a, b), outs)))
    assert (outs[1] == t).all()  # both usable after


def test_the_blocking_facade_runs_every_kind():
    from concurrent.futures import ThreadPoolExecutor

    from pccl_aio import blocking

    with blocking.Master("127.0.0.1", 0, admission_interval=0.0, heartbeat_interval=0.2,
                         heartbeat_timeout=2.0) as m:
        comms = blocking_pair(m.address)
        with ThreadPoolExecutor(2) as pool:

            def run(c: blocking.Communicator) -> tuple[np.ndarray, ...]:
                r = c.rank
                t = np.full(3, r + 1.0, np.float32)
                c.broadcast(t, root=1, timeout=10)
                out = np.zeros(4, np.int32)
                c.all_gather(np.array([r, r], np.int32), out, timeout=10)
                shard = np.zeros(2, np.float32)
                c.reduce_scatter(np.arange(4, dtype=np.float32), shard, timeout=10)
                handles = [c.broadcast_async(np.zeros(2, np.float32), root=0, tag=1),
                           c.all_gather_async(np.zeros(1), np.zeros(2), tag=2),
                           c.reduce_scatter_async(np.zeros(2), np.zeros(1), tag=3)]
                for h in handles:
                    assert h.wait().world_size == 2
                return t, out, shard

            res = list(pool.map(run, comms))
        assert all((t == 2.0).all() for t, _, _ in res)
        assert all((out == [0, 0, 1, 1]).all() for _, out, _ in res)
        assert (res[0][2] == [0.0, 2.0]).all() and (res[1][2] == [4.0, 6.0]).all()
        for c in comms:
            c.close()
