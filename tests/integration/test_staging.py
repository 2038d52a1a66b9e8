"""Issue 33, point 3: every collective, ``SharedState`` and ``Buckets`` through the staging
path (device tensors' host twins; "cpu" added to the staged devices, as no GPU is needed for
the logic): the same results, and a failed in-place all-reduce leaves the tensor untouched
even without a backup."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

import pccl_aio as pccl  # noqa: E402
from pccl_aio._peer import testing  # noqa: E402
from pccl_aio._peer.core import staging  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cpu_staged(monkeypatch):
    monkeypatch.setattr(staging, "DEVICES", frozenset({"cuda", "cpu"}))


async def test_every_kind_through_host_twins(peers, cpu_staged):
    comms = sorted(await peers(3), key=lambda c: c.rank)
    xs = [torch.full((1001,), r + 1.0) for r in range(3)]
    ptrs = [x.data_ptr() for x in xs]
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    assert all((x == 6).all() for x in xs) and [x.data_ptr() for x in xs] == ptrs
    outs = [torch.empty(3) for _ in comms]
    await asyncio.gather(*(c.all_reduce(torch.full((3,), 2.0), o, op=pccl.ReduceOp.MAX)
                           for c, o in zip(comms, outs)))
    assert all((o == 2).all() for o in outs)
    ts = [torch.full((5,), float(r)) for r in range(3)]
    await asyncio.gather(*(c.broadcast(t, root=2) for c, t in zip(comms, ts)))
    assert all((t == 2).all() for t in ts)
    gathered = [torch.zeros(6) for _ in comms]
    await asyncio.gather(*(c.all_gather(torch.tensor([r, -r], dtype=torch.float32), g)
                           for r, (c, g) in enumerate(zip(comms, gathered))))
    assert all(torch.equal(g, torch.tensor([0.0, 0, 1, -1, 2, -2])) for g in gathered)
    shards = [torch.zeros(2) for _ in comms]
    await asyncio.gather(*(c.reduce_scatter(torch.arange(6.0), s)
                           for c, s in zip(comms, shards)))
    assert [s.tolist() for s in shards] == [[0.0, 3.0], [6.0, 9.0], [12.0, 15.0]]


async def test_a_failed_in_place_all_reduce_leaves_the_tensor_as_it_was(peers, cpu_staged):
    a, b, c = await peers(3)
    xs = [torch.full((1 << 20,), float(i + 1)) for i in range(3)]
    testing.data_plane(c).abort()  # c's data path breaks: the attempt fails for all
    handles = [p.all_reduce_async(x, restore_on_abort=False) for p, x in zip((a, b, c), xs)]
    for h in handles:
        with pytest.raises(pccl.PeerLostError):
            await h
    assert [float(x[0]) for x in xs] == [1.0, 2.0, 3.0]  # the host twins took the damage
    assert all((x == x[0]).all() for x in xs)
    await c.close()
    await asyncio.gather(a.all_reduce(xs[0]), b.all_reduce(xs[1]))
    assert (xs[0] == 3).all() and (xs[1] == 3).all()


async def test_a_shared_state_of_device_tensors_syncs_through_host_twins(peers, cpu_staged):
    """A device tensor of a ``SharedState`` is copied into its host twin when a sync starts
    (``refresh``) and back once the sync succeeded: a joiner's tensors receive the group's,
    and a tensor changed between syncs is what the next sync compares."""
    a, b = await peers(2)
    wa, wb = torch.arange(1000.0), torch.zeros(1000)
    sa, sb = pccl.SharedState({"w": wa}, revision=4), pccl.SharedState({"w": wb})
    await asyncio.gather(a.sync_shared_state(sa), b.sync_shared_state(sb))
    assert torch.equal(wb, wa) and sb.revision == 4  # fetched into b's twin, then stored
    wb += 1  # the state holds the twin: it sees the change at the next refresh only
    assert bytes(sb.view("w")) == wa.numpy().tobytes()
    sb.refresh()
    assert bytes(sb.view("w")) == wb.numpy().tobytes()
    wa += 1
    sa.revision = sb.revision = 5
    infos = await asyncio.gather(a.sync_shared_state(sa), b.sync_shared_state(sb))
    assert [i.rx_bytes for i in infos] == [0, 0] and torch.equal(wa, wb)  # nothing differed


async def test_buckets_of_device_tensors_stage_through_their_flat_buffers(peers, cpu_staged):
    a, b = await peers(2)
    ts = [[torch.full((300,), float(r + 1)), torch.full((7, 3), 10.0 * (r + 1))]
          for r in range(2)]
    buckets = [pccl.Buckets(t, bucket_cap_mb=0.001) for t in ts]
    await asyncio.gather(*(bk.all_reduce(c) for bk, c in zip(buckets, (a, b))))
    for t in ts:
        assert (t[0] == 3).all() and (t[1] == 30).all()
    assert all(f.device.type == "cpu" for bk in buckets for f in bk.flat)


async def test_all_reduce_multiple_with_retry_of_device_tensors(peers, cpu_staged):
    a, b = await peers(2)
    ts = [[torch.full((50,), float(r + 1)), torch.full((3,), 5.0)] for r in range(2)]
    await asyncio.gather(*(c.all_reduce_multiple_with_retry(t) for c, t in zip((a, b), ts)))
    assert all((t[0] == 3).all() and (t[1] == 10).all() for t in ts)
