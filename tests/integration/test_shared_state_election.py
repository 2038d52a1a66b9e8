"""Shared-state elections end to end: who wins, at which revision, who is kicked.

Scenarios 41-53 of the behaviour reference (§3): distribution and byte counts, popularity,
peer groups, deterministic advancement, drag-along followers, the revision rule, layout
mismatches and strategies, adapted to pccl_aio's semantics where PCCL is buggy (the docstring
of ``pccl_aio/_master/core/election.py`` is the spec; differences are noted per test). Shared
helpers: ``state_harness``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pccl_aio as pccl
from tests.integration.state_harness import (
    EP,
    RO,
    SO,
    MasterLog,
    sync,
    sync_in_order,
    sync_settled,
    torch,
    tx_rx,
    u8,
)

# ---- scenarios 41-43: basic distribution and byte counts -------------------------------------


async def test_basic_one_peer_sends_1024_bytes_the_other_receives_them(peers):
    """Scenario 41. Tie (1 vs 1): the content of the lowest peer id wins (PCCL: arbitrary)."""
    a, b = await peers(2)
    xa, xb = u8(42), u8(0)
    sa, sb = pccl.SharedState({"key1": xa}), pccl.SharedState({"key1": xb})
    infos = await sync([a, b], [sa, sb])
    assert tx_rx(infos) == [(1024, 0), (0, 1024)]
    assert (xa == 42).all() and (xb == 42).all()
    assert [i.revision for i in infos] == [0, 0]
    assert sa.revision == sb.revision == 0


async def test_tie_goes_to_lowest_peer_id_whatever_the_vote_order(master, peers):
    """Scenario 41, other way round: the higher peer id holds 42 and votes first; still the
    lowest id's content (0) wins, so the outcome does not depend on timing."""
    log = MasterLog(master)  # before the peers connect
    a, b = await peers(2)
    xa, xb = u8(0), u8(42)
    res = await sync_in_order(log, [a, b], [pccl.SharedState({"key1": xa}),
                                            pccl.SharedState({"key1": xb})], order=[1, 0])
    assert tx_rx(res) == [(1024, 0), (0, 1024)]
    assert (xa == 0).all() and (xb == 0).all()


async def test_identical_contents_move_nothing(peers):
    """Scenario 42."""
    a, b = await peers(2)
    xa, xb = u8(42), u8(42)
    infos = await sync([a, b], [pccl.SharedState({"key1": xa}), pccl.SharedState({"key1": xb})])
    assert tx_rx(infos) == [(0, 0), (0, 0)]
    assert (xa == 42).all() and (xb == 42).all()


async def test_only_the_dirty_entry_is_sent(peers):
    """Scenario 43: two keys, only key2 differs -> exactly its bytes move (key1 is larger, so
    moving it too would show in the counts)."""
    a, b = await peers(2)
    ka1, kb1 = np.full(1000, 7, np.float32), np.full(1000, 7, np.float32)
    ka2, kb2 = u8(42), u8(1)
    infos = await sync([a, b], [pccl.SharedState({"key1": ka1, "key2": ka2}),
                                pccl.SharedState({"key1": kb1, "key2": kb2})])
    assert tx_rx(infos) == [(1024, 0), (0, 1024)]
    assert (kb2 == 42).all() and (ka2 == 42).all()
    assert (ka1 == 7).all() and (kb1 == 7).all()


# ---- scenarios 44-45: popularity ---------------------------------------------------------------


async def test_popular_content_wins_over_first_voter_and_lowest_id(master, peers):
    """Scenario 44: peer 1 (unique 42, lowest id, votes first) is overwritten with 43."""
    log = MasterLog(master)  # before the peers connect
    comms = await peers(3)
    xs = [u8(42), u8(43), u8(43)]
    states = [pccl.SharedState({"key1": x}) for x in xs]
    res = await sync_in_order(log, comms, states, order=[0, 1, 2])
    assert all(isinstance(r, pccl.SyncInfo) for r in res), res
    assert all((x == 43).all() for x in xs)
    assert res[0].rx_bytes == 1024 and res[0].tx_bytes == 0
    assert res[1].rx_bytes == res[2].rx_bytes == 0
    assert res[1].tx_bytes + res[2].tx_bytes == 1024


async def test_popularity_with_multiple_keys(peers):
    """Scenario 45: peer 1 differs on k1 and k3 only -> it receives exactly those two."""
    comms = await peers(3)
    sizes = {"k1": 100, "k2": 200, "k3": 300, "k4": 400}
    tensors = [{k: np.full(n, 5, np.int32) for k, n in sizes.items()} for _ in comms]
    tensors[0]["k1"][:] = 1
    tensors[0]["k3"][17] = -1
    infos = await sync(comms, [pccl.SharedState(t) for t in tensors])
    assert infos[0].rx_bytes == 4 * (100 + 300) and infos[0].tx_bytes == 0
    assert infos[1].tx_bytes + infos[2].tx_bytes == 4 * (100 + 300)
    assert infos[1].rx_bytes == infos[2].rx_bytes == 0
    for t in tensors:
        for k in sizes:
            assert (t[k] == 5).all(), k


# ---- scenarios 46-47: peer groups and advancement --------------------------------------------


@pytest.mark.parametrize("same_key", [True, False])
async def test_groups_with_different_contents_are_independent(peers, same_key):
    """Scenario 46: identical inside each group, different across groups, synced concurrently."""
    comms = await peers(4, groups=[0, 1, 0, 1])
    keys = ["key1", "key1" if same_key else "other"]
    xs = [u8(10 + c.peer_group) for c in comms]
    states = [pccl.SharedState({keys[c.peer_group]: x}, revision=3 * c.peer_group)
              for c, x in zip(comms, xs)]
    infos = await sync(comms, states)
    assert tx_rx(infos) == [(0, 0)] * 4
    assert [x[0] for x in xs] == [10, 11, 10, 11]
    assert [i.revision for i in infos] == [0, 3, 0, 3]  # revisions are per group


async def test_groups_converge_each_to_their_own_popular_content(peers):
    """Two groups of 3 with one dissenter each: each group's majority wins, not the other's."""
    comms = await peers(6, groups=[0, 1, 0, 1, 0, 1])
    values = [1, 2, 1, 3, 9, 3]  # group 0: 1,1,9 -> 1; group 1: 2,3,3 -> 3
    xs = [u8(v, 4096) for v in values]
    infos = await sync(comms, [pccl.SharedState({"key1": x}) for x in xs])
    assert [int(x[0]) for x in xs] == [1, 3, 1, 3, 1, 3]
    assert [i.rx_bytes for i in infos] == [0, 4096, 0, 0, 4096, 0]
    assert infos[0].tx_bytes + infos[2].tx_bytes == 4096
    assert infos[3].tx_bytes + infos[5].tx_bytes == 4096


@pytest.mark.parametrize("groups", [[0, 0], [0, 0, 1, 1]])
async def test_deterministic_advancement_moves_nothing(peers, groups):
    """Scenario 47: revision = step, content 42 + step everywhere -> tx = rx = 0 every step."""
    comms = await peers(len(groups), groups=groups)
    xs = [u8(0) for _ in comms]
    states = [pccl.SharedState({"key1": x}) for x in xs]
    for step in range(5):
        for x, s in zip(xs, states):
            x[:] = 42 + step
            s.revision = step
        infos = await sync(comms, states)
        assert tx_rx(infos) == [(0, 0)] * len(comms), step
        assert [i.revision for i in infos] == [step] * len(comms)


async def test_repeated_sync_at_the_same_revision_is_accepted(peers):
    """A sync repeated at the last revision (nobody advanced) is a repeated sync, not a
    violation: the target stays, and drifted content is repaired."""
    a, b = await peers(2)
    xa, xb = u8(5), u8(5)
    sa, sb = pccl.SharedState({"k": xa}, 4), pccl.SharedState({"k": xb}, 4)
    assert tx_rx(await sync([a, b], [sa, sb])) == [(0, 0), (0, 0)]
    xb[:3] = 0  # drift without advancing
    infos = await sync([a, b], [sa, sb])
    assert tx_rx(infos) == [(1024, 0), (0, 1024)]
    assert [i.revision for i in infos] == [4, 4] and (xb == 5).all()


# ---- scenarios 48-49: drag-along followers ---------------------------------------------------


async def test_drag_along_follower_with_static_content(peers):
    """Scenario 48: leaders at revision = step with content 42; the follower never touches its
    buffer or revision. Step 0: it receives 1024 bytes from exactly one leader; later steps it
    is outdated by one with identical content: rx = 0, revision written back to ``step``."""
    comms = await peers(3)
    xs = [u8(42), u8(42), u8(0)]
    states = [pccl.SharedState({"key1": x}) for x in xs]
    for step in range(4):
        states[0].revision = states[1].revision = step
        infos = await sync(comms, states)
        assert infos[2].rx_bytes == (1024 if step == 0 else 0), step
        assert sorted([infos[0].tx_bytes, infos[1].tx_bytes]) == (
            [0, 1024] if step == 0 else [0, 0])
        assert infos[0].rx_bytes == infos[1].rx_bytes == infos[2].tx_bytes == 0
        assert states[2].revision == step and infos[2].revision == step
        assert (xs[2] == 42).all()


@pytest.mark.parametrize("groups", [[0, 0], [0, 1, 0, 1]])
async def test_drag_along_follower_with_advancing_content(peers, groups):
    """Scenario 49: content 42 + step on the leaders; the follower (last of each group)
    receives 1024 bytes every step and matches content and revision (per group, concurrently)."""
    comms = await peers(len(groups), groups=groups)
    followers = {max(i for i, g in enumerate(groups) if g == grp) for grp in set(groups)}
    xs = [u8(0) for _ in comms]
    states = [pccl.SharedState({"key1": x}) for x in xs]
    for step in range(4):
        for i, (x, s) in enumerate(zip(xs, states)):
            if i not in followers:
                x[:] = 42 + step + 100 * groups[i]
                s.revision = step
        infos = await sync(comms, states)
        for i, info in enumerate(infos):
            assert info.revision == step and states[i].revision == step
            assert (xs[i] == 42 + step + 100 * groups[i]).all()
            assert info.rx_bytes == (1024 if i in followers else 0)


# ---- scenarios 50-52: revision rule and layout kicks -----------------------------------------


async def test_revision_jump_kicks_the_violator_only(peers):
    """Scenario 50. The peer that jumps by 2 is kicked and every later call of it fails. Unlike
    PCCL the other peer's sync completes, and it can go on alone."""
    a, b = await peers(2)
    sa, sb = pccl.SharedState({"key1": u8(1)}), pccl.SharedState({"key1": u8(1)})
    await sync([a, b], [sa, sb])
    sa.revision, sb.revision = 1, 2
    ra, rb = await sync_settled([a, b], [sa, sb])
    assert isinstance(rb, pccl.KickedError), rb
    assert isinstance(ra, pccl.SyncInfo) and ra.revision == 1, ra
    with pytest.raises(pccl.KickedError):
        await b.sync_shared_state(sb)
    with pytest.raises(pccl.KickedError):
        b.all_reduce_async(np.ones(4, np.float32))
    assert a.peer_group_world_size == 1
    sa.revision = 2
    assert (await a.sync_shared_state(sa)).revision == 2


@pytest.mark.parametrize("resume_votes_first", [True, False])
async def test_first_sync_resumes_at_the_highest_revision(master, peers, resume_votes_first):
    """Scenario 51: the first sync of a run adopts the highest offered revision (13), whatever
    the vote order (PCCL: the first voter sets the bar); the revision-0 peer receives."""
    log = MasterLog(master)  # before the peers connect
    a, b = await peers(2)
    xa, xb = u8(42), u8(0)
    states = [pccl.SharedState({"key1": xa}, revision=13), pccl.SharedState({"key1": xb})]
    res = await sync_in_order(log, [a, b], states, order=[0, 1] if resume_votes_first else [1, 0])
    assert tx_rx(res) == [(1024, 0), (0, 1024)]
    assert [r.revision for r in res] == [13, 13]
    assert states[1].revision == 13 and (xb == 42).all()
    states[0].revision = states[1].revision = 14
    assert tx_rx(await sync([a, b], states)) == [(0, 0), (0, 0)]


async def test_resume_from_a_minority_checkpoint(master, peers):
    """Resume revision = max offered at consensus even when the checkpointed peer is a minority
    and votes last (PCCL picks the first voter's revision: here 0, and 13 would be a kick)."""
    log = MasterLog(master)  # before the peers connect
    comms = await peers(3)
    xs = [u8(1), u8(1), u8(7)]
    states = [pccl.SharedState({"key1": x}, revision=r) for x, r in zip(xs, [0, 0, 13])]
    res = await sync_in_order(log, comms, states, order=[0, 1, 2])
    assert all(isinstance(r, pccl.SyncInfo) for r in res), res
    assert [r.revision for r in res] == [13, 13, 13]
    assert all((x == 7).all() for x in xs)  # the outdated majority does not vote on content
    assert [r.rx_bytes for r in res] == [1024, 1024, 0] and res[2].tx_bytes == 2048


def _mismatch_layouts():
    f16 = np.zeros(512, np.float16)
    i16 = np.zeros(512, np.int16)
    cases = {
        "key-set": ({"key1": u8(0)}, {"key3": u8(0)}),
        "dtype": ({"key1": i16}, {"key1": f16.copy()}),
        "size": ({"key1": u8(0)}, {"key1": u8(0, 1023)}),
        "extra-key": ({"key1": u8(0)}, {"key1": u8(0), "key2": u8(0)}),
    }
    if torch is not None:
        cases["bfloat16-vs-float16"] = ({"key1": torch.zeros(512, dtype=torch.float16)},
                                        {"key1": torch.zeros(512, dtype=torch.bfloat16)})
    return cases


@pytest.mark.parametrize("case", list(_mismatch_layouts()))
async def test_layout_mismatch_kicks_the_odd_peer_only(peers, case):
    """Scenario 52: the odd peer (middle id, so neither the lowest nor last) is kicked, its next
    call fails too; the two matching peers complete revisions 0 and 1."""
    good, bad = _mismatch_layouts()[case]
    comms = await peers(3)

    def state(tensors, rev=0):
        return pccl.SharedState({k: (v.clone() if hasattr(v, "clone") else v.copy())
                                 for k, v in tensors.items()}, rev)

    states = [state(good), state(bad), state(good)]
    res = await sync_settled(comms, states)
    assert isinstance(res[1], pccl.KickedError), res
    assert isinstance(res[0], pccl.SyncInfo) and isinstance(res[2], pccl.SyncInfo), res
    with pytest.raises(pccl.KickedError):
        await comms[1].sync_shared_state(states[1])
    s0, s2 = state(good, 1), state(good, 1)
    infos = await sync([comms[0], comms[2]], [s0, s2])
    assert [i.revision for i in infos] == [1, 1]


async def test_a_kicked_peer_does_not_dictate_the_resume_revision(peers):
    """"After a kick the others complete", also on a run's first sync: the peer kicked for its
    layout offered revision 7 (a checkpoint of another model); the two matching peers at
    revision 0 must still complete (PCCL: vote-order dependent)."""
    comms = await peers(3)
    states = [pccl.SharedState({"key1": u8(1)}), pccl.SharedState({"key1": u8(1)}),
              pccl.SharedState({"key3": u8(1)}, revision=7)]
    res = await sync_settled(comms, states)
    assert isinstance(res[2], pccl.KickedError), res
    assert all(isinstance(r, pccl.SyncInfo) for r in res[:2]), res
    assert [r.revision for r in res[:2]] == [0, 0]


async def test_inequality_flag_mismatch_is_a_layout_mismatch(peers):
    """Scenario 52 (allow_content_inequality differs): the minority peer is kicked."""
    comms = await peers(3)
    states = [pccl.SharedState({"k": u8(0)}, allow_content_inequality=loose)
              for loose in [(), ("k",), ()]]
    res = await sync_settled(comms, states)
    assert isinstance(res[1], pccl.KickedError), res
    assert tx_rx(res[::2]) == [(0, 0), (0, 0)]


async def test_two_peer_layout_tie_keeps_the_lowest_peer_id(peers):
    """1 vs 1 layouts: the lowest peer id's layout wins (a deterministic choice)."""
    a, b = await peers(2)
    ra, rb = await sync_settled([a, b], [pccl.SharedState({"key1": u8(0)}),
                                         pccl.SharedState({"key3": u8(0)})])
    assert isinstance(ra, pccl.SyncInfo) and isinstance(rb, pccl.KickedError), (ra, rb)


async def test_key_order_does_not_matter(peers):
    """Scenario 52, key order: unlike PCCL the entries are matched by name, not position."""
    a, b = await peers(2)
    xa1, xa2 = u8(1), np.full(10, 2, np.int64)
    xb1, xb2 = u8(0), np.full(10, 2, np.int64)
    infos = await sync([a, b], [pccl.SharedState({"key1": xa1, "key2": xa2}),
                                pccl.SharedState({"key2": xb2, "key1": xb1})])
    assert tx_rx(infos) == [(1024, 0), (0, 1024)]
    assert (xb1 == 1).all()


# ---- scenario 53: strategies -------------------------------------------------------------------


async def test_both_send_only_with_different_content_kicks_one(peers):
    """Scenario 53: exactly one is kicked; ties go to the lowest peer id, so it is the second."""
    a, b = await peers(2)
    xa, xb = u8(1), u8(2)
    ra, rb = await sync_settled([a, b], [pccl.SharedState({"k": xa}), pccl.SharedState({"k": xb})],
                                [SO, SO])
    assert isinstance(rb, pccl.KickedError), rb
    assert isinstance(ra, pccl.SyncInfo) and (ra.tx_bytes, ra.rx_bytes) == (0, 0), ra
    assert (xa == 1).all()


@pytest.mark.parametrize("same", [True, False])
async def test_all_receive_only_fails_cleanly_for_everyone(peers, same):
    """Scenario 53: nobody may provide the content -> SharedStateError on all (PCCL kicks them
    all; here nobody is kicked, nothing changes, and a later sync works)."""
    a, b = await peers(2)
    xa, xb = u8(1), u8(1 if same else 2)
    sa, sb = pccl.SharedState({"k": xa}), pccl.SharedState({"k": xb})
    res = await sync_settled([a, b], [sa, sb], [RO, RO])
    assert all(isinstance(r, pccl.SharedStateError) for r in res), res
    assert (xa == 1).all() and (xb == (1 if same else 2)).all()
    assert a.peer_group_world_size == 2
    infos = await sync([a, b], [sa, sb])
    assert (xb == 1).all() and infos[1].rx_bytes == (0 if same else 1024)


@pytest.mark.parametrize("strategies", [[EP, RO], [RO, EP], [EP, SO], [SO, EP], [EP, SO, RO],
                                        [SO, RO, EP]])
async def test_enforce_popular_mixed_with_others_kicks_the_others(peers, strategies):
    """Scenario 53: the ENFORCE_POPULAR peer completes, every other strategy is kicked."""
    comms = await peers(len(strategies))
    xs = [u8(i + 1) for i in range(len(comms))]
    res = await sync_settled(comms, [pccl.SharedState({"k": x}) for x in xs], strategies)
    for r, st in zip(res, strategies):
        if st == EP:
            assert isinstance(r, pccl.SyncInfo) and (r.tx_bytes, r.rx_bytes) == (0, 0), r
        else:
            assert isinstance(r, pccl.KickedError), (st, r)


async def test_send_only_and_receive_only_without_enforce_popular(peers):
    """Scenario 53: SEND_ONLY + RECEIVE_ONLY agree: the receiver gets the sender's content."""
    a, b = await peers(2)
    xa, xb = u8(0), u8(9)
    infos = await sync([a, b], [pccl.SharedState({"k": xa}), pccl.SharedState({"k": xb})],
                       [RO, SO])
    assert tx_rx(infos) == [(0, 1024), (1024, 0)]
    assert (xa == 9).all()


async def test_receive_only_with_matching_content_is_no_source(peers):
    """A RECEIVE_ONLY peer that already holds the winning content is not asked to send (PCCL
    may pick it as distributor)."""
    comms = await peers(3)
    xs = [u8(5), u8(5), u8(0)]
    infos = await sync(comms, [pccl.SharedState({"k": x}) for x in xs], [RO, SO, RO])
    assert tx_rx(infos) == [(0, 0), (1024, 0), (0, 1024)]


async def test_strategy_kicks_are_local_to_a_peer_group(peers):
    """Scenario 53, 2 groups: group 0 mixes EP/SEND_ONLY (the SEND_ONLY peer is kicked); group
    1 is two SEND_ONLY peers with identical content (both fine)."""
    comms = await peers(4, groups=[0, 0, 1, 1])
    res = await sync_settled(comms, [pccl.SharedState({"k": u8(3)}) for _ in comms],
                             [EP, SO, SO, SO])
    assert isinstance(res[1], pccl.KickedError), res
    assert all(isinstance(res[i], pccl.SyncInfo) for i in (0, 2, 3)), res
