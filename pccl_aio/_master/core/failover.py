"""Master failover, the ``MasterState`` side (sans-IO): terms, rejoins, stepping down.

Terms. A master's ``term`` is 0 until it serves a run; a run it starts is term 1, a run it
rebuilds from rejoining peers (``recovery.py``) gets one above every term they followed.
Peers follow terms upwards only (``Membership.term``). A master that hears of a higher term
than its own while it has members steps down: it ends every session with ``Superseded`` (the
peers rejoin wherever the run is served now, the highest term they can reach) and serves
that term's run from then on only as a fresh rebuild. Hence two masters never hold one
peer at once, and a peer never goes back to an older term.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from ..._wire import messages as m
from .events import Action, Send
from .recovery import Recovery

if TYPE_CHECKING:
    from .state import MasterState

__all__ = ["finish_recovery", "on_rejoin", "run_error", "step_down"]


def run_error(st: MasterState, msg: m.Hello) -> str | None:
    """Why ``msg`` may not join this master's run (None: it may)."""
    if msg.run_id and st.run_id and msg.run_id != st.run_id and (st._fixed_run or st.term):
        return f"this peer belongs to run {msg.run_id!r}; this master serves run {st.run_id!r}"
    return None


def step_down(st: MasterState, term: int, out: list[Action], where: str = "",
              why: str = "") -> None:
    """A master of ``term`` above ours serves the run: end every session (``Superseded``),
    forget the run, and take ``term`` as ours (a run rebuilt here from now on is above it).
    (Also how a provisional run gives way to the rejoining one: ``provisional``.)"""
    at = f" at {where}" if where else ""
    reason = why or f"a master of term {term}{at} serves this run (this one had term {st.term})"
    conns = [c for c, p in st._peers.items() if p.registered]
    out.extend(Send(c, m.Superseded(term, reason, where)) for c in conns)
    st._left = True  # no rebuild of the run ended here
    for c in conns:
        st._close(c, "superseded", out)
    st._recovery = None
    st.term = term
    st._fresh_run = None
    if not st._fixed_run:
        st.run_id = ""


def provisional(st: MasterState, msg: m.Hello) -> bool:
    """Does a rejoining peer take this master's run over? Yes while that run was started by a
    new peer less than ``grace`` seconds ago and could be the same run (a restarted master
    may hear a new peer before the old members: the run it starts is theirs to replace)."""
    same = msg.run_id == st.run_id or (st._random_run and not st._fixed_run)
    return st._fresh_run is not None and st._now - st._fresh_run < st.grace and same


def take_over(st: MasterState, msg: m.Hello, out: list[Action]) -> None:
    """A rejoining peer's ``Hello``: if this master's run is ``provisional``, it gives way."""
    if msg.rejoin is not None and provisional(st, msg):
        step_down(st, st.term, out, why="peers of the run rejoin: it goes on here")


def await_members(st: MasterState, lost: int) -> None:
    """The last member vanished: wait ``grace`` for the members to rejoin (a frozen or cut
    off master drops them all) before the waiting peers may form a new group."""
    st._recovery = Recovery(st._now, st.grace, {lost})


def heard(st: MasterState, answer: m.ProbeAnswer, where: str, out: list[Action]) -> None:
    """Another master of this run serves it at a higher term with members: step down (our
    peers then find it), or, without members, take its term so as never to serve below it."""
    if answer.term <= st.term or not answer.members or (
            st.run_id and answer.run_id and answer.run_id != st.run_id):
        return
    if st.accepted() or st._recovery is not None:
        step_down(st, answer.term, out, where)
    else:
        st.term = answer.term


def start_run(st: MasterState, run_id: str) -> None:
    """The first peer of a master that serves no run yet starts one (term 1), of the peer's
    run id if it names one (else a fresh id); provisional for ``grace`` seconds."""
    if st.term == 0:
        st.term = 1
    if not st.run_id:
        st.run_id = run_id or secrets.token_hex(8)
        st._random_run = not run_id
    st._fresh_run = st._now


def on_rejoin(st: MasterState, conn: int, group: int, rejoin: m.Rejoin, run_id: str,
              out: list[Action]) -> bool:
    """A rejoining peer registered. Returns whether it takes part in a rebuild (answered at
    its end); else it is a joiner, and its operations in doubt are aborted now."""
    st._max_id = max(st._max_id, rejoin.peer_id, *rejoin.ring)
    if st._recovery is None and not st.accepted():
        st._recovery = Recovery(st._now, st.grace)
        st.run_id = st.run_id or run_id
    if st._recovery is not None:
        st._recovery.add(conn, group, rejoin)
        st.term = max(st.term, rejoin.term + 1)
        return True
    for d in rejoin.doubts:
        if not d.done:
            continue
        why = "its master was lost and the run went on without this peer"
        out.append(Send(conn, m.SyncFailed(why, True) if d.kind else
                        m.CollectiveAbort(d.tag, d.seq, why)))
    return False


def owed(st: MasterState, conn: int, kind: str, out: list[Action]) -> bool:
    """A member's vote of ``kind`` for the round whose answer it missed when the old master
    died (``recovery.Outcome.owed``): answered at once, as the others were, and not counted."""
    msg = st._owed.get(conn, {}).pop(kind, None)
    if msg is None:
        return False
    out.append(Send(conn, msg))
    return True


def check_recovery(st: MasterState, out: list[Action]) -> None:
    """Finish the rebuild once ``Recovery.ready``."""
    if st._recovery is not None and st._recovery.ready(st._now):
        finish_recovery(st, out)


def finish_recovery(st: MasterState, out: list[Action]) -> None:
    """The rebuilt run: members in their ring order, floors above everything seen, the
    revisions, then a ``Membership`` to all and the verdicts of the operations in doubt."""
    rec, st._recovery = st._recovery, None
    assert rec is not None
    o = rec.outcome()
    st.epoch = max(st.epoch, o.epoch)
    st._colls.floor(o.max_seq)
    for c, p in st._peers.items():
        if c in o.members:
            p.accepted = True
        elif p.registered and not p.accepted:
            st._gate.registered(c, joiner=True)
    for g, ring in o.rings.items():
        st._topo.restore(g, ring)
    for g, rev in o.revisions.items():
        st._sync.resume(g, rev)
    if not o.members:  # nobody is left to vote the waiting peers in: admit them now
        for c in st.pending():
            st._peers[c].accepted = True
            st._gate.admitted(c)
    st.epoch += 1
    for kind, (n, answer) in o.rounds.items():
        st._rounds[kind] = max(st._rounds[kind], n)
        msg: m.MasterToPeer = (m.PeersPendingAnswer(answer, n) if kind == "pending"
                               else m.TopologyUpdated(st.epoch, n))
        for c, kinds in o.owed.items():
            if kind in o.waiting.get(c, ()):
                out.append(Send(c, msg))  # its vote waits: before the Membership ends it
            elif kind in kinds:
                st._owed.setdefault(c, {})[kind] = msg  # its next vote gets it at once
    out.extend(st._membership(st.accepted()))
    failed = "the master was lost and not every peer finished it"
    for c, items in o.complete.items():
        out.extend(Send(c, m.CollectiveComplete(tag, seq)) for tag, seq in items)
    for c, items in o.abort.items():
        out.extend(Send(c, m.CollectiveAbort(tag, seq, failed)) for tag, seq in items)
    out.extend(Send(c, m.SyncComplete(rev)) for c, rev in o.synced.items())
    out.extend(Send(c, m.SyncFailed(failed, True)) for c in o.sync_failed)
