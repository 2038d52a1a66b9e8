"""The master's work per message does not grow with the run (``_master/core/quiet.py``).

Counted, not timed: ``StateAccess.deadlock_work()`` gives the incremental deadlock rule's steps
(peers examined) and its full checks (``deadlock.find`` runs). In lock step (every member
launches a tag, awaited, the master starts it, every member reports it done; every member
votes ``are_peers_pending()``) the most steps one message costs is the same at P = 8 and
P = 256, and ``find`` never runs. In any launch order the steps per message stay constant
(the scan's cursor passes each member once per item). A deadlock the rule must not miss is
found at P = 256 as at P = 3 (the departure of the one free peer). The randomized model
(``test_master_model.py``) checks after every batch that no peer is left deadlocked, with
this rule deciding when ``find`` runs.
"""

from __future__ import annotations

import random

import pytest

from pccl_aio._master.core import state as ms
from pccl_aio._wire import messages as m
from tests.unit.master_harness import Harness, sent_to

pytestmark = pytest.mark.timeout(60)


def _run(peers: int) -> tuple[Harness, list[int]]:
    h = Harness()
    return h, h.run(*[0] * peers)


def _work(h: Harness) -> tuple[int, int]:
    return h.st.access.deadlock_work()


def _lock_step(h: Harness, conns: list[int], tag: int, order: list[int]) -> list[int]:
    """One collective in lock step, launches in ``order``; the steps each message cost."""
    costs: list[int] = []

    def send(c: int, msg: m.PeerToMaster) -> list[ms.Action]:
        before = _work(h)[0]
        out = h.send(c, msg)
        costs.append(_work(h)[0] - before)
        return out

    started: list[ms.Action] = []
    for c in order:  # (a peer sends one message: its launch, awaited)
        started += send(c, m.CollectiveInit(tag, 8, 10, 0, awaited=True))
    (start,) = {msg.seq for msg in sent_to(started, conns[0], m.CollectiveStart)}
    done: list[ms.Action] = []
    for c in order:
        done += send(c, m.CollectiveDone(tag, start, True))
    assert all(sent_to(done, c, m.CollectiveComplete) for c in conns)
    return costs


def _pending_round(h: Harness, conns: list[int]) -> list[int]:
    costs = []
    for c in conns:
        before = _work(h)[0]
        h.send(c, m.VotePeersPending())
        costs.append(_work(h)[0] - before)
    return costs


@pytest.mark.parametrize("kind", ["collectives", "pending votes"])
def test_the_most_a_message_costs_is_the_same_at_8_and_256_peers(kind: str) -> None:
    worst = {}
    for peers in (8, 256):
        h, conns = _run(peers)
        finds = _work(h)[1]
        costs: list[int] = []
        for tag in range(1, 4):
            costs += (_lock_step(h, conns, tag, conns) if kind == "collectives"
                      else _pending_round(h, conns))
        assert _work(h)[1] == finds, "find ran in lock step"
        worst[peers] = max(costs)
    assert worst[8] == worst[256] > 0, worst


def test_in_any_launch_order_the_steps_per_message_stay_constant() -> None:
    per_message = {}
    for peers in (8, 256):
        h, conns = _run(peers)
        rng = random.Random(peers)
        costs: list[int] = []
        for tag in range(1, 6):
            order = conns[:]
            rng.shuffle(order)
            costs += _lock_step(h, conns, tag, order)
        per_message[peers] = sum(costs) / len(costs)
    assert per_message[256] <= 1.5 * per_message[8], per_message


@pytest.mark.parametrize("peers", [3, 256])
def test_the_departure_of_the_only_free_peer_still_reveals_a_deadlock(peers: int) -> None:
    """Every member but one votes ``update_topology()`` except peer b, which awaits a tag that
    the free peer f has not launched: b waits on f, the voters wait on b. When f leaves, b's
    tag misses only voters and the vote misses only b: all fail, with ``find`` run."""
    h, conns = _run(peers)
    b, f, voters = conns[0], conns[1], conns[2:]
    h.send(b, m.CollectiveInit(7, 8, 10, 0))
    h.send(b, m.CollectiveWait(7))  # (awaited later: a wait of its own)
    for c in voters:
        h.send(c, m.VoteUpdateTopology())
    finds = _work(h)[1]
    out = h.disconnect(f)
    assert _work(h)[1] > finds
    assert sent_to(out, b, m.CollectiveRejected)
    assert all(sent_to(out, c, m.VoteRejected) for c in voters)
