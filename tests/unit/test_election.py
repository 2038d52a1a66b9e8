"""The shared-state election (``election.elect``), sans-IO: votes in, revision/kicks/plan out.

The rules are the docstring of ``pccl_aio/_master/core/election.py``. Peer ids are the dict
keys; the outcome must never depend on the order in which votes arrived (dict insertion order).
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pccl_aio._master.core.election import Election, Plan, elect
from pccl_aio._types import DataType, SyncStrategy
from pccl_aio._wire import messages as m

EP, RO, SO = SyncStrategy.ENFORCE_POPULAR, SyncStrategy.RECEIVE_ONLY, SyncStrategy.SEND_ONLY
H = {c: bytes([c]) * 16 for c in range(256)}  # fake xxh3-128 digests


def ent(key: str, h: int = 0, *, nbytes: int = 1024, dtype: DataType = DataType.UINT8,
        loose: bool = False) -> m.SyncEntry:
    return m.SyncEntry(key, int(dtype), nbytes, b"" if loose else H[h], loose)


def vote(revision: int, *entries: m.SyncEntry, strategy: SyncStrategy = EP,
         fresh: bool = False) -> m.VoteSync:
    return m.VoteSync(revision, int(strategy), list(entries), fresh)


def simple(revision: int, h: int, **kw) -> m.VoteSync:
    return vote(revision, ent("k", h), **kw)


def all_orders(votes: dict[int, m.VoteSync], last: int | None) -> Election:
    """Elect for every insertion order of the votes; all results must be equal."""
    results = [elect(dict(p), last) for p in itertools.permutations(votes.items())]
    for r in results[1:]:
        assert r == results[0]
    return results[0]


# ---- revision ---------------------------------------------------------------------------------


def test_no_votes() -> None:
    e = elect({}, None)
    assert e == Election() and not e.failed


def test_first_sync_targets_the_highest_revision_in_any_vote_order() -> None:
    e = all_orders({1: simple(0, 1), 2: simple(13, 2), 3: simple(0, 1)}, None)
    assert e.revision == 13 and not e.kicks and not e.failed
    assert e.sources == [2]
    assert e.plans == {1: Plan(["k"], [H[2]]), 3: Plan(["k"], [H[2]])}


def test_after_the_first_sync_the_target_is_last_plus_one() -> None:
    e = all_orders({1: simple(6, 1), 2: simple(5, 1), 3: simple(2, 1)}, 5)
    assert e.revision == 6 and not e.kicks
    assert e.sources == [1]
    # outdated with identical content: adopt the revision, fetch nothing
    assert e.plans == {2: Plan([], []), 3: Plan([], [])}


def test_a_voter_above_the_target_is_kicked() -> None:
    e = all_orders({1: simple(6, 1), 2: simple(7, 2), 3: simple(6, 1)}, 5)
    assert e.revision == 6 and set(e.kicks) == {2} and "revision 7" in e.kicks[2]
    assert e.sources == [1, 3] and e.plans == {}


def test_the_increment_rule_holds_even_if_everybody_jumps() -> None:
    e = all_orders({1: simple(9, 1), 2: simple(9, 1)}, 5)
    assert e.revision == 6 and set(e.kicks) == {1, 2}
    assert e.failed and not e.sources and not e.plans


def test_repeated_sync_keeps_the_last_revision() -> None:
    e = all_orders({1: simple(5, 1), 2: simple(5, 2), 3: simple(3, 2)}, 5)
    assert e.revision == 5 and not e.kicks and not e.failed
    # 1 vs 1 among the up-to-date: the lowest id (1) wins; peer 3 is outdated
    assert e.sources == [1]
    assert e.plans == {2: Plan(["k"], [H[1]]), 3: Plan(["k"], [H[1]])}


def test_nobody_up_to_date_fails_without_kicks() -> None:
    e = all_orders({1: simple(3, 1), 2: simple(4, 1)}, 5)
    assert e.revision == 5 and e.failed and not e.kicks and not e.plans and not e.sources


def test_outdated_voters_do_not_vote_on_content() -> None:
    e = all_orders({1: simple(0, 1), 2: simple(0, 1), 3: simple(0, 1), 4: simple(1, 9)}, 0)
    assert e.sources == [4]
    assert all(e.plans[p] == Plan(["k"], [H[9]]) for p in (1, 2, 3))


# ---- layout -------------------------------------------------------------------------------------


def _two(k1: str = "a", k2: str = "b", **kw) -> tuple[m.SyncEntry, m.SyncEntry]:
    return ent(k1, 1, **kw), ent(k2, 2)


@pytest.mark.parametrize("odd", [
    vote(0, ent("a", 1), ent("c", 2)),  # other key
    vote(0, ent("a", 1)),  # missing key
    vote(0, ent("a", 1), ent("b", 2), ent("c", 3)),  # extra key
    vote(0, ent("a", 1, dtype=DataType.INT8), ent("b", 2)),  # dtype
    vote(0, ent("a", 1, nbytes=1023), ent("b", 2)),  # size
    vote(0, ent("a", 1, loose=True), ent("b", 2)),  # inequality flag
])
def test_the_odd_layout_is_kicked_and_the_others_go_on(odd: m.VoteSync) -> None:
    good = vote(0, *_two())
    for pos in (1, 2, 3):  # lowest, middle and highest peer id
        votes = {p: (odd if p == pos else good) for p in (1, 2, 3)}
        e = all_orders(votes, None)
        assert set(e.kicks) == {pos} and "differ" in e.kicks[pos]
        assert not e.failed and pos not in e.sources and pos not in e.plans
        assert e.sources == sorted({1, 2, 3} - {pos})


@pytest.mark.parametrize(("odd", "said"), [
    (vote(0, ent("a", 1), ent("c", 2)),
     "key 'b' is absent on peer 2 but uint8, 1024 elements (1024 B) on peers 1, 3"),
    (vote(0, ent("a", 1), ent("b", 2), ent("c", 3)),
     "key 'c' is uint8, 1024 elements (1024 B) on peer 2 but absent on peers 1, 3"),
    (vote(0, ent("a", 1, dtype=DataType.BFLOAT16), ent("b", 2, nbytes=8)),
     "key 'a' is bfloat16, 512 elements (1024 B) on peer 2 but uint8, 1024 elements (1024 B)"),
    (vote(0, ent("a", 1), ent("b", 2, nbytes=1, loose=True)),
     "key 'b' is uint8, 1 element (1 B, content may differ) on peer 2 but uint8, 1024"),
])
def test_a_layout_kick_names_the_first_differing_key_and_both_sides(
        odd: m.VoteSync, said: str) -> None:
    good = vote(0, *_two())
    e = all_orders({1: good, 2: odd, 3: good}, None)
    assert set(e.kicks) == {2} and said in e.kicks[2], e.kicks


def test_float16_bfloat16_int16_are_different_layouts() -> None:
    votes = {1: vote(0, ent("a", 1, dtype=DataType.FLOAT16)),
             2: vote(0, ent("a", 1, dtype=DataType.BFLOAT16)),
             3: vote(0, ent("a", 1, dtype=DataType.INT16)),
             4: vote(0, ent("a", 1, dtype=DataType.BFLOAT16))}
    e = all_orders(votes, None)
    assert set(e.kicks) == {1, 3} and e.sources == [2, 4]


def test_entry_order_does_not_matter() -> None:
    e = all_orders({1: vote(0, ent("a", 1), ent("b", 2)),
                    2: vote(0, ent("b", 2), ent("a", 1))}, None)
    assert not e.kicks and e.sources == [1, 2] and e.plans == {}


def test_layout_tie_keeps_the_lowest_peer_id() -> None:
    e = all_orders({4: vote(0, ent("x", 1)), 2: vote(0, ent("y", 1)),
                    7: vote(0, ent("x", 1)), 3: vote(0, ent("y", 1))}, None)
    assert set(e.kicks) == {4, 7} and e.sources == [2, 3]


def test_a_layout_kicked_voter_does_not_set_the_resume_revision() -> None:
    """"After a kick the others complete": on a run's first sync, a voter that is kicked for
    its layout must not make the others outdated by offering a higher revision (otherwise
    nobody is up to date at its revision and the sync fails for everyone)."""
    e = all_orders({1: vote(0, ent("a", 1)), 2: vote(0, ent("a", 1)), 3: vote(7, ent("z", 1))},
                   None)
    assert set(e.kicks) == {3}
    assert not e.failed, e.failed
    assert e.revision == 0 and e.sources == [1, 2]


def test_a_strategy_kicked_voter_does_not_decide_the_target() -> None:
    """Same for a voter kicked for its strategy: with the others repeating revision 5, its
    advance to 6 must not turn the sync into one nobody can provide."""
    e = all_orders({1: simple(5, 1), 2: simple(5, 1), 3: simple(6, 1, strategy=RO)}, 5)
    assert set(e.kicks) == {3}
    assert not e.failed, e.failed
    assert e.revision == 5 and e.sources == [1, 2]


def test_revision_kick_comes_before_the_layout_vote() -> None:
    # peers 3 and 4 share a layout but jump ahead: kicked first, so layout "a" wins
    votes = {1: vote(6, ent("a", 1)), 2: vote(6, ent("a", 1)),
             3: vote(8, ent("z", 1)), 4: vote(8, ent("z", 1)), 5: vote(6, ent("z", 1))}
    e = all_orders(votes, 5)
    assert e.kicks.keys() == {3, 4, 5} and "revision" in e.kicks[3] and "differ" in e.kicks[5]
    assert e.sources == [1, 2]


# ---- content ------------------------------------------------------------------------------------


def test_most_popular_content_wins() -> None:
    e = all_orders({1: simple(0, 42), 2: simple(0, 43), 3: simple(0, 43)}, None)
    assert e.sources == [2, 3] and e.plans == {1: Plan(["k"], [H[43]])}


def test_content_tie_goes_to_the_lowest_peer_id() -> None:
    e = all_orders({5: simple(0, 1), 3: simple(0, 2), 9: simple(0, 1), 4: simple(0, 2)}, None)
    assert e.sources == [3, 4]
    assert e.plans == {5: Plan(["k"], [H[2]]), 9: Plan(["k"], [H[2]])}


def test_only_dirty_entries_are_planned_with_the_winning_hashes() -> None:
    w = vote(0, ent("a", 1), ent("b", 2), ent("c", 3))
    e = all_orders({1: w, 2: w, 3: vote(0, ent("c", 9), ent("b", 2), ent("a", 8))}, None)
    assert e.sources == [1, 2]
    assert e.plans == {3: Plan(["c", "a"], [H[3], H[1]])}  # in the voter's own entry order


def test_popularity_is_per_content_set_not_per_entry() -> None:
    # every peer differs on one entry from the others: all sets are unique (1 vote each), so
    # the lowest id's whole set wins, even though entry-wise majorities would mix
    votes = {1: vote(0, ent("a", 1), ent("b", 1)), 2: vote(0, ent("a", 2), ent("b", 1)),
             3: vote(0, ent("a", 1), ent("b", 2))}
    e = all_orders(votes, None)
    assert e.sources == [1]
    assert e.plans == {2: Plan(["a"], [H[1]]), 3: Plan(["b"], [H[1]])}


# ---- strategies -------------------------------------------------------------------------------


@pytest.mark.parametrize("others", [[RO], [SO], [SO, RO], [RO, RO], [SO, SO]])
def test_enforce_popular_kicks_every_other_strategy(others: list[SyncStrategy]) -> None:
    votes = {1: simple(0, 1)}
    for i, s in enumerate(others):
        votes[2 + i] = simple(0, 1, strategy=s)
    e = all_orders(votes, None)
    assert set(e.kicks) == set(range(2, 2 + len(others)))
    assert all("ENFORCE_POPULAR" in r for r in e.kicks.values())
    assert e.sources == [1] and not e.failed


def test_all_receive_only_fails_for_everyone_without_kicks() -> None:
    e = all_orders({1: simple(0, 1, strategy=RO), 2: simple(0, 2, strategy=RO)}, None)
    assert e.failed and not e.kicks and not e.sources and not e.plans


def test_two_send_only_with_different_content_kick_the_higher_id() -> None:
    e = all_orders({1: simple(0, 1, strategy=SO), 2: simple(0, 2, strategy=SO)}, None)
    assert set(e.kicks) == {2} and "SEND_ONLY" in e.kicks[2]
    assert e.sources == [1] and e.plans == {}


def test_send_only_majority_kicks_the_odd_send_only() -> None:
    e = all_orders({1: simple(0, 7, strategy=SO), 2: simple(0, 8, strategy=SO),
                    3: simple(0, 8, strategy=SO)}, None)
    assert set(e.kicks) == {1} and e.sources == [2, 3]


def test_send_only_and_receive_only_together() -> None:
    e = all_orders({1: simple(0, 1, strategy=RO), 2: simple(0, 2, strategy=SO)}, None)
    assert not e.kicks and e.sources == [2] and e.plans == {1: Plan(["k"], [H[2]])}


def test_receive_only_is_never_a_source_nor_counted() -> None:
    # two RECEIVE_ONLY peers agree on 5, one SEND_ONLY holds 6: 6 wins, RO peers receive
    e = all_orders({1: simple(0, 5, strategy=RO), 2: simple(0, 5, strategy=RO),
                    3: simple(0, 6, strategy=SO)}, None)
    assert e.sources == [3] and not e.kicks
    assert e.plans == {1: Plan(["k"], [H[6]]), 2: Plan(["k"], [H[6]])}
    # a RECEIVE_ONLY peer holding the winner fetches nothing and serves nothing
    e = all_orders({1: simple(0, 6, strategy=RO), 2: simple(0, 6, strategy=SO)}, None)
    assert e.sources == [2] and e.plans == {1: Plan([], [])}


def test_strategy_kicks_come_before_the_content_vote() -> None:
    # without the kick the RECEIVE_ONLY/SEND_ONLY peers' content would be the majority (2 vs 1)
    e = all_orders({1: simple(0, 1), 2: simple(0, 2, strategy=SO),
                    3: simple(0, 2, strategy=SO)}, None)
    assert set(e.kicks) == {2, 3} and e.sources == [1]


# ---- inequality-allowed entries -------------------------------------------------------------


def _loose_vote(rev: int, h: int, fresh: bool = False, strategy: SyncStrategy = EP) -> m.VoteSync:
    return vote(rev, ent("s", h), ent("l", loose=True), strategy=strategy, fresh=fresh)


def test_inequality_entries_are_not_compared_between_up_to_date_peers() -> None:
    e = all_orders({1: _loose_vote(0, 1), 2: _loose_vote(0, 1, fresh=True)}, None)
    assert e.sources == [1, 2] and e.plans == {}


def test_a_fresh_outdated_voter_fetches_inequality_entries_too() -> None:
    e = all_orders({1: _loose_vote(3, 1), 2: _loose_vote(3, 1), 3: _loose_vote(0, 1, fresh=True),
                    4: _loose_vote(0, 2, fresh=True), 5: _loose_vote(2, 1)}, 2)
    assert e.revision == 3 and e.sources == [1, 2]
    assert e.plans[3] == Plan(["l"], [b""])
    assert e.plans[4] == Plan(["s", "l"], [H[1], b""])
    assert e.plans[5] == Plan([], [])  # outdated but synced before: keeps its own "l"


def test_a_fresh_voter_at_the_target_keeps_its_inequality_entries() -> None:
    # peer 3 is fresh and up to date but lost the content vote: it fetches "s" only
    e = all_orders({1: _loose_vote(3, 1), 2: _loose_vote(3, 1), 3: _loose_vote(3, 2, fresh=True)},
                   2)
    assert e.sources == [1, 2] and not e.kicks
    assert e.plans == {3: Plan(["s"], [H[1]])}
    # same for a fresh RECEIVE_ONLY voter at the target that already holds the winner
    e = all_orders({1: _loose_vote(3, 1, strategy=SO),
                    2: _loose_vote(3, 1, fresh=True, strategy=RO)}, 2)
    assert e.sources == [1] and e.plans == {2: Plan([], [])}


# ---- order independence, randomized ---------------------------------------------------------

_entry_st = st.builds(
    lambda k, h, big, loose: ent(k, h, nbytes=2048 if big else 1024, loose=loose),
    st.sampled_from(["a", "b"]), st.integers(0, 2), st.booleans(), st.booleans())
_vote_st = st.builds(
    lambda rev, es, s, fresh: vote(rev, *({e.key: e for e in es}.values()), strategy=s,
                                   fresh=fresh),
    st.integers(0, 3), st.lists(_entry_st, min_size=1, max_size=2),
    st.sampled_from(list(SyncStrategy)), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(1, 9), _vote_st, min_size=1, max_size=5),
       st.one_of(st.none(), st.integers(0, 3)), st.randoms(use_true_random=False))
def test_outcome_is_independent_of_vote_order(votes: dict[int, m.VoteSync], last: int | None,
                                              rnd: random.Random) -> None:
    e = elect(votes, last)
    items = list(votes.items())
    rnd.shuffle(items)
    assert elect(dict(items), last) == e
    # invariants of every outcome
    if last is not None:
        assert e.revision in (last, last + 1)
    if last is None and not e.failed:
        assert e.revision == max(v.revision for p, v in votes.items() if p not in e.kicks)
    assert set(e.kicks) <= set(votes)
    assert not set(e.kicks) & (set(e.sources) | set(e.plans))
    if e.failed:
        assert not e.sources and not e.plans
    else:
        assert e.sources == sorted(e.sources) and e.sources
        assert set(e.sources) | set(e.plans) | set(e.kicks) == set(votes)
        for p in e.sources:
            assert votes[p].revision == e.revision and votes[p].strategy != RO
        for p, plan in e.plans.items():
            assert votes[p].strategy != SO or not [h for h in plan.hashes if h]
            assert len(plan.keys) == len(plan.hashes)
    for p, v in votes.items():
        if p not in e.kicks:
            assert v.revision <= e.revision
