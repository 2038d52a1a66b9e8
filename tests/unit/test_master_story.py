"""The master's story (``_master/story.py``) and status (``_master/status.py``) on the sans-IO
state: each run event makes one log line with its cause and ids, the counters count each
collective once, the page escapes what peers say, and ``/metrics`` is valid Prometheus text."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pccl_aio._master.core import state as ms
from pccl_aio._master.status import Status
from pccl_aio._master.story import Story, cause_of
from pccl_aio._wire import messages as m
from tests.unit.master_harness import RUN, Harness, msgs, sync_vote

pytestmark = pytest.mark.timeout(30)


class Observed(Harness):
    """A harness whose every event and its actions also go to a ``Story``."""

    def __init__(self, heartbeat_timeout: float = 5.0) -> None:
        super().__init__(heartbeat_timeout)
        self.story = Story(self.st)

    def handle(self, event: ms.Event) -> list[ms.Action]:
        actions = super().handle(event)
        self.story.observe(event, actions)
        return actions


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="pccl_aio.master")
    return caplog


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, object]]:
    """The ``pccl`` fields of each record of event ``name`` (with its message as "msg")."""
    out = []
    for r in caplog.records:
        fields = getattr(r, "pccl", {})
        if fields.get("event") == name:
            out.append({**fields, "msg": r.getMessage(), "level": r.levelno})
    return out


def test_joins_admissions_and_rings_are_told_with_their_ids(logs):
    h = Observed()
    a, b, c = h.run(0, 0, 1)
    registered = events(logs, "registered")
    assert [e["peer"] for e in registered] == [a, b, c]
    assert all(e["run"] == RUN and e["level"] == logging.INFO for e in registered)
    assert "joined as the first member" in registered[0]["msg"]
    assert "waiting for admission" in registered[1]["msg"]
    assert [e["peer"] for e in events(logs, "admitted")] == [b, c]
    rings = events(logs, "ring")
    assert rings[-2:] == [
        {**rings[-2], "group": 0, "ring": [a, b]}, {**rings[-1], "group": 1, "ring": [c]}]
    assert h.story.counts.joins == 3


@pytest.mark.parametrize("how, cause, words", [
    ("leave", "left", "left the run"),
    ("disconnect", "closed", "dead: its connection closed"),
    ("heartbeat", "heartbeat", "dead: no heartbeat"),
    ("kick", "kicked", "kicked: second Hello"),
])
def test_a_departure_is_told_with_its_cause(logs, how, cause, words):
    h = Observed(heartbeat_timeout=2.0)
    a, b, c = h.run(0, 0, 0)
    if how == "leave":
        h.send(c, m.Leave())
    elif how == "disconnect":
        h.disconnect(c)
    elif how == "heartbeat":
        for conn in (a, b):
            h.now = 3.0
            h.send(conn, m.Heartbeat())
        h.tick(3.0)
    else:
        h.send(c, m.Hello(m.PROTOCOL_VERSION, 0, 1234))
    (gone,) = events(logs, "departed")
    assert (gone["peer"], gone["cause"], gone["group"]) == (c, cause, 0)
    assert f"peer {c} {words}" in gone["msg"]
    assert h.story.counts.departures == {cause: 1}
    assert events(logs, "ring")[-1]["ring"] == [a, b]  # the ring it left, told after it
    names = [getattr(r, "pccl", {}).get("event") for r in logs.records]
    assert names.index("departed") < len(names) - 1 - names[::-1].index("ring")


def test_a_refused_connection_is_told_and_is_no_departure(logs):
    h = Observed()
    h.run(0)
    conn = h.connect()
    h.send(conn, m.Hello(m.PROTOCOL_VERSION + 1, 0, 1234))
    (refused,) = events(logs, "refused")
    assert refused["peer"] == conn and "protocol version" in refused["msg"]
    assert events(logs, "departed") == [] and h.story.counts.departures == {"refused": 1}


def test_collectives_are_counted_once_and_an_abort_is_told_with_its_cause(logs):
    h = Observed()
    a, b, c = h.run(0, 0, 0)
    for tag in (1, 2):
        seq = h.start([a, b, c], tag)
        for conn in (a, b, c):
            h.send(conn, m.CollectiveDone(tag, seq, True))
    seq = h.start([a, b, c], 3)
    h.disconnect(c)
    counts = h.story.counts
    assert (counts.started, counts.completed) == (3, 2)
    assert counts.reduced_bytes == 2 * 8 * 4  # count 8 of dtype 10 (float32)
    assert counts.aborted == {"peer_left": 1}
    (abort,) = events(logs, "aborted")
    assert (abort["seq"], abort["tag"], abort["cause"], abort["group"]) == (seq, 3, "peer_left", 0)
    assert f"peer {c} left the run" in abort["msg"]
    h.init([a, b], 4, count=8)
    h.init([a], 5, count=8)
    h.send(b, m.CollectiveInit(5, 9, 10, 0))
    (rejected,) = events(logs, "rejected")
    assert rejected["cause"] == "mismatch" and "disagree" in rejected["msg"]


def test_a_sync_that_moves_data_says_who_fetched_what_from_whom(logs):
    h = Observed()
    a, b, c = h.run(0, 0, 0)
    h.send(a, sync_vote(3, content=1, nbytes=4096))
    h.send(b, sync_vote(3, content=1, nbytes=4096))
    h.send(c, sync_vote(0, content=2, nbytes=4096, fresh=True))
    (fetch,) = events(logs, "sync_fetch")
    assert (fetch["peer"], fetch["bytes"], fetch["sources"], fetch["revision"]) == (
        c, 4096, [a, b], 3)
    view = h.story.syncs[0]
    assert (view.revision, view.fetchers, view.agreed, view.completed) == (3, [c], False, False)
    for conn in (a, b, c):
        h.send(conn, m.SyncDone(True))
    assert h.story.syncs[0].completed and h.story.counts.syncs == {"started": 1, "completed": 1}
    assert h.story.counts.sync_bytes == 4096
    for conn in (a, b, c):  # the same content everywhere: nothing to tell at INFO
        h.send(conn, sync_vote(3, content=1, nbytes=4096))
    assert len(events(logs, "sync_fetch")) == 1 and h.story.syncs[0].agreed
    h.send(c, m.Leave())  # a departed peer's vote is forgotten
    assert sorted(h.story._votes) == [a, b]


def test_the_story_never_takes_the_master_down(logs, monkeypatch):
    h = Observed()
    monkeypatch.setattr(h.story, "_welcome", lambda *a: 1 / 0)
    h.run(0, 0)  # a bug in the bookkeeping: logged, the run goes on
    assert h.st.accepted() == [1, 2]
    assert any("status bookkeeping failed" in r.getMessage() for r in logs.records)


@pytest.mark.parametrize("reason, cause", [
    ("peer 3 left the run", "peer_left"), ("peer 2 failed: no data for 10 s", "peer_failed"),
    ("peers disagree on count/dtype", "mismatch"), ("too few peers in the group", "too_few"),
    ("peer 4: gave up", "withdrawn"), ("something else", "other")])
def test_abort_causes(reason, cause):
    assert cause_of(reason) == cause


def status_of(h: Observed) -> Status:
    return Status(h.st, h.story, lambda: h.now, lambda: "127.0.0.1:1")


def test_the_status_snapshot_shows_peers_rings_sync_and_counts():
    h = Observed()
    a, b = h.run(0, 0)
    waiting, _ = h.join(0)
    seq = h.start([a, b], 1)
    h.now = 1.5
    snap = status_of(h).snapshot()
    assert (snap["run"], snap["world_size"], snap["pending"]) == (RUN, 2, [waiting])
    assert snap["running"] == [{"group": 0, "tag": 1, "seq": seq, "waiting_for": [a, b]}]
    peers = {p["id"]: p for p in snap["peers"]}
    assert peers[a]["state"] == peers[b]["state"] == "member"
    assert peers[waiting]["state"] == "waiting" and peers[waiting]["ring_position"] == -1
    assert peers[a]["last_heartbeat_s"] == 1.5
    assert snap["groups"] == [{"group": 0, "ring": [a, b], "revision": None, "sync": None}]
    h.send(a, m.CollectiveDone(1, seq, True))
    assert status_of(h).snapshot()["running"][0]["waiting_for"] == [b]
    h.send(b, m.CollectiveDone(1, seq, True))
    snap = status_of(h).snapshot()
    assert snap["counts"]["completed"] == 1 and snap["running"] == []
    served = json.loads(status_of(h).json()[1])  # /status.json: the same, as JSON
    assert {k: v for k, v in served.items() if k not in ("now", "uptime_s")} == {
        k: v for k, v in snap.items() if k not in ("now", "uptime_s")}


def test_the_page_embeds_the_status_and_escapes_what_peers_say():
    h = Observed()
    h.run(0)
    story = h.story
    story.recent.append({"at": 0, "event": "aborted", "text": "</script><script>alert(1)"})
    ctype, body = status_of(h).page()
    page = body.decode()
    assert ctype.startswith("text/html")
    assert "</script><script>alert(1)" not in page and "<\\/script><script>alert(1)" in page
    assert f'"run": "{RUN}"' in page  # the status is in the page: complete on first paint


def test_metrics_are_prometheus_text_with_the_run_counters():
    h = Observed()
    a, b, c = h.run(0, 0, 0)
    seq = h.start([a, b, c], 1)
    for conn in (a, b, c):
        h.send(conn, m.CollectiveDone(1, seq, True))
    h.start([a, b, c], 2)
    h.disconnect(c)
    ctype, body = status_of(h).metrics()
    assert ctype.startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert samples[("pccl_master_peers", (("state", "member"),))] == 2
    assert samples[("pccl_master_collectives_started_total", ())] == 2
    assert samples[("pccl_master_collectives_completed_total", ())] == 1
    assert samples[("pccl_master_collectives_aborted_total", (("cause", "peer_left"),))] == 1
    assert samples[("pccl_master_departures_total", (("cause", "closed"),))] == 1
    assert samples[("pccl_master_joins_total", ())] == 3
    assert samples[("pccl_master_votes_total", (("kind", "update_topology"),))] == 1
    assert samples[("pccl_master_group_world_size", (("group", "0"),))] == 2
    assert samples[("pccl_master_collectives_total",
                    (("event", "started"), ("kind", "all-reduce")))] == 2
    assert samples[("pccl_master_collectives_total",
                    (("event", "completed"), ("kind", "all-reduce")))] == 1


def test_each_kind_is_counted_and_the_story_names_it():
    h = Observed()
    a, b = h.run(0, 0)
    epoch = h.st.epoch
    kinds = {2: m.CollectiveInit(1, 8, 10, 0, kind=2, root=1, epoch=epoch),
             3: m.CollectiveInit(2, 8, 10, 0, kind=3, epoch=epoch),
             4: m.CollectiveInit(3, 8, 10, 0, kind=4, epoch=epoch),
             1: m.CollectiveInit(4, 0, 0, 0, kind=1, epoch=epoch)}
    for init in kinds.values():
        h.send(a, init)
        starts = msgs(h.send(b, init), m.CollectiveStart)
        seq = starts[a][0].seq
        for conn in (a, b):
            h.send(conn, m.CollectiveDone(init.tag, seq, True))
    snap = status_of(h).snapshot()
    assert snap["counts"]["kinds"] == {
        k: {"started": 1, "completed": 1}
        for k in ("all-gather", "barrier", "broadcast", "reduce-scatter")}
    h.send(a, m.CollectiveInit(9, 8, 10, 0, kind=2, root=0, epoch=epoch))
    h.send(b, m.CollectiveInit(9, 8, 10, 0, kind=2, root=1, epoch=epoch))
    said = [r["text"] for r in h.story.recent]
    assert any("broadcast 8 x float32 from rank 0" in t and "from rank 1" in t for t in said)
