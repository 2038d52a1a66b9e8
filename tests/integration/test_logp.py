"""Small collectives in log2 P rounds (``core/bruck.py``, ``rounds.py``): from 4 peers up, a
small all-reduce or all-gather takes ceil(log2 P) rounds instead of P - 1 hops round the
ring. Real sockets on 127.0.0.1, P = 4 .. 9 (powers of two and not)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._compute import reference as ref
from pccl_aio._peer import testing
from pccl_aio._peer.data.core.bruck import BRUCK, BruckPlan
from pccl_aio._peer.data.core.gather import GATHER_MAX
from pccl_aio._types import DataType
from tests.helpers import crash, crash_after, reduce_ok

try:  # (imported at collection: a first import inside the event loop stalls heartbeats)
    import torch
except ImportError:  # pragma: no cover
    torch = None

pytestmark = pytest.mark.timeout(90)

OPS = list(pccl.ReduceOp)
DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64,
          np.float16, np.float32, np.float64]


def inputs(rng: np.random.Generator, ws: int, n: int, dtype: type) -> list[np.ndarray]:
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(n).astype(dtype) for _ in range(ws)]
    return [rng.integers(1, 5, n).astype(dtype) for _ in range(ws)]  # PROD wraps alike


def in_rank_order(xs: list[np.ndarray], op: pccl.ReduceOp) -> np.ndarray:
    """The reference kernels applied to every rank's input in rank order."""
    dt = int(DataType.parse(xs[0].dtype))
    out = np.empty_like(xs[0])
    ref.reduce_from(out, xs[0], xs[1], int(op), dt)
    for x in xs[2:]:
        ref.reduce_into(out, x, int(op), dt)
    if op == pccl.ReduceOp.AVG:
        ref.divide(out, len(xs), dt)
    return out


def round_peers(comms: list[pccl.Communicator]) -> list[set[int]]:
    """Per peer (rank order), the peers its rounds send to, by peer id."""
    ids = [c.peer_id for c in comms]
    return [{ids[BruckPlan(r, len(comms), 1).to(k)] for k in range(BruckPlan(r, len(comms),
                                                                              1).rounds)}
            for r in range(len(comms))]


@pytest.mark.parametrize("ws", [3, 4, 5, 6, 7, 8, 9])
async def test_every_op_and_dtype_in_log_p_rounds_is_the_rank_order_reduction(peers, ws):
    """From 4 peers up in rounds; below, the ring's small path (the same bytes; P = 2 and 3
    are ``test_small_allreduce.py``'s too, and a peer alone is refused an all-reduce:
    ``TooFewPeersError``, as PCCL does). Every dtype at P = 3, 5 and 8, three at the others;
    the rest of this file's checks ride on one P each (a group of 9 takes a while to form)."""
    comms = sorted(await peers(ws), key=lambda c: c.rank)
    rng = np.random.default_rng(ws)
    for dtype in DTYPES if ws in (3, 5, 8) else [np.uint8, np.int64, np.float16]:
        for op in OPS:
            n = 3 if op == pccl.ReduceOp.PROD else 257  # odd; fewer elements than peers too
            xs = inputs(rng, ws, n, dtype)
            outs = [np.empty_like(x) for x in xs]
            infos = await asyncio.gather(*(c.all_reduce(x, o, op=op)
                                           for c, x, o in zip(comms, xs, outs)))
            want = in_rank_order(xs, op)
            for o in outs:
                assert o.tobytes() == want.tobytes(), (dtype, op)
            assert {i.tx_bytes for i in infos} == {(ws - 1) * xs[0].nbytes}  # P - 1 blocks
    if ws == 9:
        await nan_and_the_largest_small_buffer(comms, rng)
    if ws == 5:
        await bfloat16_tensors(comms)
    if ws in (4, 7):
        await small_all_gather(comms)
    for c, dests in zip(comms, round_peers(comms) if ws >= 4 else []):  # the rounds' links
        assert dests <= set(testing.data_plane(c).links), (dests, testing.data_plane(c).links)
        st = testing.stats(c)  # the bytes counted per round partner, not per ring neighbour
        assert set(st.sent) == dests and len(st.received) == len(dests), (st.sent, dests)
        assert sum(st.sent.values()) == sum(st.received.values()) > 0


async def nan_and_the_largest_small_buffer(comms: list[pccl.Communicator],
                                           rng: np.random.Generator) -> None:
    """NaN under MIN and MAX, and the largest buffer the rounds take, in place."""
    for n, op in ((GATHER_MAX // 4, pccl.ReduceOp.SUM), (1001, pccl.ReduceOp.MAX),
                  (1001, pccl.ReduceOp.MIN)):
        xs = inputs(rng, len(comms), n, np.float32)
        xs[4][::7] = np.nan
        outs = [x.copy() for x in xs]
        await asyncio.gather(*(c.all_reduce(o, op=op) for c, o in zip(comms, outs)))
        want = in_rank_order(xs, op)
        assert all(o.tobytes() == want.tobytes() for o in outs), op


async def bfloat16_tensors(comms: list[pccl.Communicator]) -> None:
    """torch bfloat16 tensors, AVG: the reference's rank-order sum, divided once."""
    if torch is None:
        pytest.skip("torch is not installed")
    ws = len(comms)
    xs = [torch.randn(99, generator=torch.Generator().manual_seed(r)).bfloat16()
          for r in range(ws)]
    outs = [x.clone() for x in xs]
    await asyncio.gather(*(c.all_reduce(o, op=pccl.ReduceOp.AVG) for c, o in zip(comms, outs)))
    raw = [x.view(torch.int16).numpy().view(np.uint16) for x in xs]
    want = np.empty_like(raw[0])
    dt = int(DataType.BFLOAT16)
    ref.reduce_from(want, raw[0], raw[1], int(pccl.ReduceOp.SUM), dt)
    for r in raw[2:]:
        ref.reduce_into(want, r, int(pccl.ReduceOp.SUM), dt)
    ref.divide(want, ws, dt)
    for o in outs:
        assert o.view(torch.int16).numpy().tobytes() == want.tobytes()


async def small_all_gather(comms: list[pccl.Communicator]) -> None:
    """Blocks of 1 element, of fewer elements than peers, of 1001: every rank's, in order."""
    ws = len(comms)
    for n in (1, ws - 1, 1001):
        xs = [np.arange(n, dtype=np.int32) + 10_000 * r for r in range(ws)]
        outs = [np.full(ws * n, -1, np.int32) for _ in range(ws)]
        await asyncio.gather(*(c.all_gather(x, o) for c, x, o in zip(comms, xs, outs)))
        for o in outs:
            np.testing.assert_array_equal(o, np.concatenate(xs))


@pytest.mark.parametrize("round_", [0, 1])
async def test_a_peer_crashed_mid_rounds_fails_every_survivor_restores_and_retry_works(
        peers, round_):
    """Peer 2 of 6 vanishes once peer 0 has a round's frame: every survivor raises (its
    in-place input as launched), and the next small all-reduce runs on the five."""
    comms = sorted(await peers(6), key=lambda c: c.rank)
    xs = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(6)]
    originals = [x.copy() for x in xs]
    with crash_after(comms[0], comms[2], BRUCK + round_, 1):
        res = await asyncio.gather(*(c.all_reduce(x, tag=5) for c, x in zip(comms, xs)),
                                   return_exceptions=True)
    survivors = [i for i in range(6) if i != 2]
    for i in survivors:
        assert isinstance(res[i], pccl.PeerLostError), res
        assert xs[i].tobytes() == originals[i].tobytes()
    crash(comms[2])
    await reduce_ok([comms[i] for i in survivors])


async def test_a_peer_that_sends_nothing_is_named_by_its_round_0_receiver_only(peers):
    """Four peers; one sends no frame at all. Its round-0 receiver names it when the data
    deadline passes (it is removed); a peer still waiting for a later round names nobody,
    since that round's sender may itself be waiting on the silent one: no innocent peer is
    removed. Every other peer raises, and the three go on."""
    from pccl_aio._peer.data import rounds

    comms = sorted(await peers(4, data_timeout=1.0), key=lambda c: c.rank)
    silent = comms[2]
    flow = rounds.Rounds._flow

    async def mute(self: rounds.Rounds) -> None:
        if self._env is testing.data_plane(silent):
            await asyncio.Event().wait()  # (until the attempt is released)
        await flow(self)

    rounds.Rounds._flow = mute  # type: ignore[method-assign]
    try:
        xs = [np.full(100, r + 1, np.float32) for r in range(4)]
        res = await asyncio.gather(*(c.all_reduce(x, tag=3) for c, x in zip(comms, xs)),
                                   return_exceptions=True)
    finally:
        rounds.Rounds._flow = flow  # type: ignore[method-assign]
    survivors = [c for c in comms if c is not silent]
    assert all(isinstance(r, pccl.PeerLostError) for c, r in zip(comms, res)
               if c is not silent), res
    async with asyncio.timeout(10):  # (the silent peer's removal may come after the abort)
        while True:
            ys = [np.ones(10, np.float32) for _ in survivors]
            again = await asyncio.gather(*(c.all_reduce(y) for c, y in zip(survivors, ys)),
                                         return_exceptions=True)
            if not any(isinstance(r, BaseException) for r in again):
                break
            assert all(isinstance(r, pccl.PeerLostError) for r in again), again
    assert [c.peer_group_world_size for c in survivors] == [3, 3, 3]  # no innocent removed
    await reduce_ok(survivors)
