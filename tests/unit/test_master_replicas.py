"""The sans-IO master's replicas (``Hello.replica``, ``replica_size``): a replica of several
processes (the shards of one model, each in its own peer group) joins in one round once all
of its processes registered, and the first peer's replica starts the run together."""

from __future__ import annotations

import pytest

from pccl_aio._errors import RemoteProtocolError
from pccl_aio._master.core import state as ms
from pccl_aio._master.core.limits import Admission, Limits
from pccl_aio._wire import messages as m
from tests.unit.master_harness import PV, Harness, msgs


def hello(h: Harness, group: int, replica: str = "", size: int = 1) -> tuple[int, list[ms.Action]]:
    conn = h.connect()
    acts = h.send(conn, m.Hello(PV, group, 40000 + conn, replica=replica, replica_size=size))
    h.send(conn, m.Heartbeat())  # heard from: a live joiner (``limits.Admission``)
    return conn, acts


def two_replicas(h: Harness) -> list[int]:
    """Replicas A and B of two processes each (shard i in group i), A first: A starts the run,
    B waits to be admitted."""
    return [hello(h, group, name, 2)[0] for name in "AB" for group in (0, 1)]


def accepted_at_hello(acts: list[ms.Action], conn: int) -> bool:
    (welcome,) = msgs(acts, m.Welcome)[conn]
    return welcome.accepted


def pending_round(h: Harness) -> bool:
    """Every member votes ``are_peers_pending()``; the answer."""
    acts: list[ms.Action] = []
    for c in h.st.accepted():
        acts += h.send(c, m.VotePeersPending())
    answers = {a.pending for (a,) in msgs(acts, m.PeersPendingAnswer).values()}
    assert len(answers) == 1
    return answers.pop()


def test_the_first_replica_starts_the_run_and_a_joining_replica_waits_for_all_its_processes():
    h = Harness()
    a0, acts = hello(h, 0, "A", 2)
    assert not accepted_at_hello(acts, a0) and h.st.accepted() == []  # A is not complete
    b0, acts = hello(h, 0, "B", 2)
    assert not accepted_at_hello(acts, b0)
    a1, acts = hello(h, 1, "A", 2)  # A complete, nobody to vote: both start the run
    assert accepted_at_hello(acts, a1) and h.st.accepted() == [a0, a1]
    assert msgs(acts, m.Membership).keys() == {a0, a1}
    assert not pending_round(h)  # B is not complete: nobody is due
    h.vote_topology_all()  # a round admits only complete replicas
    assert h.st.accepted() == [a0, a1] and h.st.pending() == [b0]
    b1, acts = hello(h, 1, "B", 2)
    assert not accepted_at_hello(acts, b1)
    assert pending_round(h)
    acts = h.vote_topology_all()
    assert h.st.accepted() == sorted([a0, a1, b0, b1])  # both processes of B in one round
    assert set(msgs(acts, m.Membership)) == {a0, a1, b0, b1}


def test_a_replica_whose_process_left_before_admission_waits_for_a_new_one():
    h = Harness()
    a0, a1, b0, b1 = two_replicas(h)
    h.disconnect(b1)
    assert not pending_round(h)
    h.vote_topology_all()
    assert h.st.accepted() == [a0, a1]
    c1, _ = hello(h, 1, "B", 2)  # its replacement completes B again
    assert pending_round(h)
    h.vote_topology_all()
    assert h.st.accepted() == [a0, a1, b0, c1]


def test_a_lost_process_of_a_member_replica_is_replaced_by_a_joiner_of_that_replica():
    h = Harness()
    a0, a1, b0, b1 = two_replicas(h)
    h.vote_topology_all()
    h.disconnect(b1)
    c1, acts = hello(h, 1, "B", 2)  # B's other process is still a member: B is complete
    assert not accepted_at_hello(acts, c1)  # a joiner (the groups have members)
    assert pending_round(h)
    h.vote_topology_all()
    assert h.st.accepted() == [a0, a1, b0, c1]


def test_a_flood_of_incomplete_replicas_is_bounded_before_the_run_starts():
    h = Harness()
    h.st = ms.MasterState(max_pending_peers=4, run_id="test-run")
    for i in range(4):
        c, acts = hello(h, 0, f"R{i}", 2)
        assert not accepted_at_hello(acts, c)
    c, acts = hello(h, 0, "R9", 2)
    assert msgs(acts, m.Rejected) and c in h.closed
    assert h.st.accepted() == [] and len(h.st.pending()) == 4


def test_peers_without_a_replica_join_as_before():
    h = Harness()
    a, _ = hello(h, 0)
    b, acts = hello(h, 1)  # not the first peer's replica: a joiner
    assert not accepted_at_hello(acts, b)
    assert pending_round(h)
    h.vote_topology_all()
    assert h.st.accepted() == [a, b]


def test_a_replica_size_without_a_name_is_refused_at_decoding():
    raw = m.encode(m.Hello(PV, 0, 40001, replica_size=2))
    with pytest.raises(RemoteProtocolError, match="replica_size"):
        m.decode_peer_to_master(raw)


def test_the_joiners_of_one_replica_are_found_beside_joiners_without_one():
    adm = Admission(Limits())
    adm.registered(1, True)  # no replica
    adm.registered(2, True, "A", 2)
    assert adm.ready("A") == [] and adm.ready() == [1]
    adm.registered(3, True, "A", 2)
    assert adm.ready("A") == [2, 3] and adm.ready() == [1, 2, 3]
