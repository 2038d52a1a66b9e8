"""Early starts: a tag's ticket (handed out with its previous verdict) lets the group's next
collective of that tag move data before the master's start, and every outcome stays the
all-or-nothing one: real sockets on 127.0.0.1, a master and communicators in one loop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer import testing
from pccl_aio._peer.data.core import stash as _stash

from ..helpers import crash

pytestmark = pytest.mark.timeout(60)


def inputs(n: int, ws: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-3, 4, n).astype(np.float32) for _ in range(ws)]


async def reduce_all(comms: list[pccl.Communicator], xs: list[np.ndarray], tag: int = 0,
                     **kw: object) -> list[np.ndarray]:
    outs = [x.copy() for x in xs]
    await asyncio.gather(*(c.all_reduce(o, tag=tag, **kw) for c, o in zip(comms, outs)))
    return outs


def launched_early(comm: pccl.Communicator, tag: int) -> bool:
    """The collective ``tag`` just launched runs already (a seq, before any master message)."""
    coll = testing.control_plane(comm).colls[tag]
    return coll.seq != 0 and not coll.confirmed


async def test_the_second_run_of_a_tag_starts_before_the_master_answers(peers):
    comms = await peers(3)
    xs = inputs(100_000, 3)
    want = sum(xs)
    for round_ in range(3):
        handles = [c.all_reduce_async(x, np.empty_like(x), tag=4)
                   for c, x in zip(comms, xs)]
        early = [launched_early(c, 4) for c in comms]
        assert early == [round_ > 0] * 3  # the first run has no ticket yet
        await asyncio.gather(*handles)
    outs = await reduce_all(comms, xs, tag=4)
    for o in outs:
        assert o.tobytes() == outs[0].tobytes()
        np.testing.assert_array_equal(o, want)


async def test_frames_of_a_peer_that_has_not_launched_yet_are_stashed_then_used(peers,
                                                                                 monkeypatch):
    comms = await peers(3)
    xs = inputs(300_000, 3, seed=1)
    await reduce_all(comms, xs, tag=1)  # hands out tag 1's ticket
    kept = asyncio.Event()
    lagger = comms[1]
    stash = testing.data_plane(lagger).registry.stash
    real_keep = _stash.Stash.keep

    def keep(self: _stash.Stash, seq: int, frame: _stash.Early) -> None:
        real_keep(self, seq, frame)
        kept.set()

    monkeypatch.setattr(_stash.Stash, "keep", keep)
    outs = [x.copy() for x in xs]
    early = [asyncio.ensure_future(c.all_reduce(o, tag=1))
             for i, (c, o) in enumerate(zip(comms, outs)) if i != 1]
    await asyncio.wait_for(kept.wait(), 10)  # the lagger's predecessor already sent it data
    assert stash.used > 0
    await lagger.all_reduce(outs[1], tag=1)
    await asyncio.gather(*early)
    assert stash.used == 0
    for o in outs:
        assert o.tobytes() == outs[0].tobytes()
        np.testing.assert_array_equal(o, sum(xs))


async def test_a_full_stash_spoils_the_ticket_and_the_group_starts_afresh(peers, monkeypatch):
    comms = await peers(2)
    xs = inputs(600_000, 2, seed=2)
    await reduce_all(comms, xs, tag=2)
    lagger = comms[1]
    stash = testing.data_plane(lagger).registry.stash
    stash.budget = 1  # nothing fits: the first early frame spoils the ticket
    spoiled = asyncio.Event()
    real_spoil = _stash.Stash.spoil

    def spoil(self: _stash.Stash, seq: int) -> None:
        real_spoil(self, seq)
        spoiled.set()

    monkeypatch.setattr(_stash.Stash, "spoil", spoil)
    outs = [x.copy() for x in xs]
    first = asyncio.ensure_future(comms[0].all_reduce(outs[0], tag=2))
    await asyncio.wait_for(spoiled.wait(), 10)
    await lagger.all_reduce(outs[1], tag=2)
    await first
    for o in outs:  # comms[0]'s early attempt was dropped and rerun from its restored input
        np.testing.assert_array_equal(o, sum(xs))


async def test_an_early_peer_waits_for_a_lagging_one_beyond_the_data_timeout(peers):
    comms = await peers(2, data_timeout=0.3)
    xs = inputs(50_000, 2, seed=3)
    await reduce_all(comms, xs, tag=0)
    outs = [x.copy() for x in xs]
    first = asyncio.ensure_future(comms[0].all_reduce(outs[0], tag=0))
    # the other peer "computes" for three data timeouts before it launches: the early
    # attempt has no data deadline until the master confirms it
    await asyncio.sleep(0.9)
    assert not first.done()
    await comms[1].all_reduce(outs[1], tag=0)
    await first
    np.testing.assert_array_equal(outs[0], sum(xs))


async def test_a_peer_lost_between_runs_restarts_the_early_ones_on_the_new_ring(peers):
    comms = await peers(3)
    xs = inputs(200_000, 3, seed=4)
    await reduce_all(comms, xs, tag=9)
    crash(comms[2])  # dies between two runs: the survivors hold tickets of the old ring
    outs = [x.copy() for x in xs[:2]]
    infos = await asyncio.gather(*(c.all_reduce(o, tag=9) for c, o in zip(comms, outs)))
    assert [i.world_size for i in infos] == [2, 2]  # no error: the run went on without it
    for o in outs:  # in place: the early attempt on the old ring was undone first
        np.testing.assert_array_equal(o, xs[0] + xs[1])


@pytest.mark.parametrize("quant", [False, True])
async def test_a_descriptor_mismatch_on_an_early_start_fails_everywhere_and_restores(peers, quant):
    comms = await peers(2)
    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8") if quant else None
    xs = inputs(200_000, 2, seed=5)
    await reduce_all(comms, xs, tag=3, quantization=q)
    outs = [xs[0].copy(), xs[1][:150_000].copy()]
    res = await asyncio.gather(*(c.all_reduce(o, tag=3, quantization=q)
                                 for c, o in zip(comms, outs)), return_exceptions=True)
    assert all(isinstance(r, pccl.PcclError) for r in res), res
    np.testing.assert_array_equal(outs[0], xs[0])  # restored after the early attempt wrote it
    np.testing.assert_array_equal(outs[1], xs[1][:150_000])
    outs = await reduce_all(comms, xs, tag=3, quantization=q)  # and the group goes on
    assert outs[0].tobytes() == outs[1].tobytes()


async def test_a_cancelled_early_attempt_restores_and_the_others_follow_a_fresh_start(peers):
    comms = await peers(2)
    xs = inputs(100_000, 2, seed=6)
    await reduce_all(comms, xs, tag=5)
    mine = xs[0].copy()
    handle = comms[0].all_reduce_async(mine, tag=5)
    assert launched_early(comms[0], 5)
    assert handle.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handle
    np.testing.assert_array_equal(mine, xs[0])
    # the other peer still holds the (now void) ticket and starts early on it; the master
    # starts the round with a fresh seq, which it follows after undoing its early attempt
    outs = await reduce_all(comms, xs, tag=5)
    for o in outs:
        np.testing.assert_array_equal(o, sum(xs))
