"""What the master's HTTP ports serve: ``/status.json``, the status page and ``/metrics``.

Everything is computed when asked, from the master's state (``core.access.StateAccess``) and its
``story.Story``: nothing runs per collective, and a request costs the control plane one short
pass over the peers (the routes run on the master's event loop, between its events).
"""

from __future__ import annotations

import collections
import functools
import json
import time
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._net.http import HttpServer, Limits, Response, Route, check_port, request_host
from .core.state import MasterState
from .story import Story

__all__ = ["Limits", "Status", "http_servers", "metrics_hint"]

_WINDOW = 10.0  # seconds the rates average over
_RUNNING = 100  # running collectives listed at most
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def metrics_hint(elsewhere: bool) -> dict[str, str]:
    """The 404 of ``/metrics`` on a status port: where the metrics are (``elsewhere``: on
    the master's metrics port), or how to serve them."""
    if elsewhere:
        where = ("they are served at /metrics on the master's metrics port (--metrics-port, "
                 "Master(metrics_port=)), not here")
    else:
        where = ("this master serves none: start it with --metrics-port PORT (or "
                 "Master(metrics_port=PORT)) and scrape /metrics on that port")
    return {"/metrics": f"not found: this port serves the master's status page, not "
                        f"Prometheus metrics; {where}"}


def reachable(address: str) -> str:
    """``address`` ("host:port") as the asker can reach it: a wildcard host (0.0.0.0, ::)
    becomes the host the HTTP request was sent to (its Host header), if any."""
    host, _, port = address.rpartition(":")
    asked = request_host()
    return f"{asked}:{port}" if asked and host.strip("[]") in _WILDCARDS else address


class Status:
    """The run at a glance (``snapshot``), as a page and as Prometheus metrics.
    ``clock`` is the master's loop clock (heartbeat ages are measured with it)."""

    def __init__(self, state: MasterState, story: Story, clock: Callable[[], float],
                 address: Callable[[], str]) -> None:
        self._state, self._story, self._clock, self._address = state, story, clock, address
        self._started = time.time()
        self._samples: collections.deque[tuple[float, int, int]] = collections.deque()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def routes(self, status: bool, metrics: bool) -> dict[str, Route]:
        """The paths of one HTTP port: the page and its JSON, ``/metrics``, or all."""
        out: dict[str, Route] = {}
        if status:
            out["/"] = out["/index.html"] = self.page
            out["/status.json"] = self.json
        if metrics:
            out["/metrics"] = self.metrics
        return out

    def sample(self) -> None:
        """Record the counters now (the master's ticker calls this): the rates' window."""
        now, c = time.monotonic(), self._story.counts
        self._samples.append((now, c.completed, c.reduced_bytes))
        while self._samples and now - self._samples[0][0] > _WINDOW:
            self._samples.popleft()

    def rates(self) -> tuple[float, float]:
        """Collectives completed per second and payload bytes reduced per second, over the
        last ``_WINDOW`` seconds."""
        if len(self._samples) < 2:
            return 0.0, 0.0
        (t0, c0, b0), (t1, c1, b1) = self._samples[0], self._samples[-1]
        span = max(t1 - t0, 1e-9)
        return (c1 - c0) / span, (b1 - b0) / span

    def snapshot(self) -> dict[str, Any]:
        """The whole status as plain data (what ``/status.json`` serves)."""
        st, story, access = self._state, self._story, self._state.access
        now = self._clock()
        position = {c: (g, i) for g in access.groups() for i, c in enumerate(st.ring(g))}
        recovery = access.recovery()
        rejoined = set(recovery[0]) if recovery else set()
        peers = []
        for p in access.peers():
            if not p.registered:
                continue
            member = story.members.get(p.conn)
            peers.append({
                "id": p.conn, "host": p.host, "port": p.port, "group": p.group,
                "state": "member" if p.accepted else "rejoining" if p.conn in rejoined
                else "waiting",
                "ring_position": position.get(p.conn, (0, -1))[1],
                "last_heartbeat_s": round(max(now - p.last_seen, 0.0), 3),
                "since": member.since if member else None})
        revisions = access.revisions()
        groups = []
        for g in access.groups():
            sync = story.syncs.get(g)
            groups.append({
                "group": g, "ring": st.ring(g), "revision": revisions.get(g),
                "sync": None if sync is None else {
                    "revision": sync.revision, "fingerprint": sync.fingerprint,
                    "agreed": sync.agreed, "fetchers": sync.fetchers,
                    "completed": sync.completed, "at": sync.at}})
        per_s, bytes_per_s = self.rates()
        c = story.counts
        return {
            "run": st.run_id, "term": st.term, "epoch": st.epoch,
            "address": reachable(self._address()),
            "now": time.time(), "uptime_s": round(time.time() - self._started, 1),
            "world_size": len(st.accepted()), "pending": st.pending(),
            "recovering": None if recovery is None else {
                "rejoined": recovery[0], "missing": recovery[1]},
            "peers": peers, "groups": groups,
            "rates": {"collectives_per_s": round(per_s, 2), "bytes_per_s": round(bytes_per_s)},
            "running": [{"group": g, "tag": tag, "seq": seq, "waiting_for": waiting}
                        for g, tag, seq, waiting in access.running()[:_RUNNING]],
            "counts": {"started": c.started, "completed": c.completed,
                       "kinds": _by_kind(c.kinds),
                       "reduced_bytes": c.reduced_bytes, "aborted": dict(c.aborted),
                       "rejected": dict(c.rejected), "votes": dict(c.votes),
                       "syncs": dict(c.syncs), "sync_bytes": c.sync_bytes, "joins": c.joins,
                       "departures": dict(c.departures)},
            "recent": list(story.recent)[::-1],
            "links": [{"src": s, "dst": d, "bps": bps, "latency_s": lat}
                      for (s, d), (bps, lat) in sorted(st.links().items())]}

    def json(self) -> Response:
        return "application/json", json.dumps(self.snapshot()).encode()

    def page(self) -> Response:
        """The status page: static HTML whose script renders ``/status.json`` every second;
        the current status is embedded, so the page is complete on its first paint."""
        data = json.dumps(self.snapshot()).replace("</", "<\\/")
        html = _page().replace("/*STATUS*/null", data, 1)
        return "text/html; charset=utf-8", html.encode()

    def metrics(self) -> Response:
        return "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry)


def _by_kind(kinds: collections.Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """{kind: {"started": n, "completed": m}} of the counts by (kind, event)."""
    out: dict[str, dict[str, int]] = {}
    for (kind, event), n in sorted(kinds.items()):
        out.setdefault(kind, {"started": 0, "completed": 0})[event] = n
    return out


@functools.cache
def _page() -> str:
    return resources.files("pccl_aio._master").joinpath("status.html").read_text("utf-8")


class _Collector(Collector):
    """Prometheus families read from the story's counters and the state at scrape time."""

    def __init__(self, status: Status) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        st, story = self._status._state, self._status._story
        access, c = st.access, story.counts
        yield _gauge("pccl_master_peers", "Registered peers by state (member, waiting).",
                     {("member",): len(st.accepted()), ("waiting",): len(st.pending())},
                     ["state"])
        yield _gauge("pccl_master_groups", "Peer groups with members.", {(): len(access.groups())})
        yield _gauge("pccl_master_epoch", "Membership version.", {(): st.epoch})
        yield _gauge("pccl_master_term", "The master's term (failover).", {(): st.term})
        yield _gauge("pccl_master_group_world_size", "Members of each group.",
                     {(str(g),): len(st.accepted(g)) for g in access.groups()}, ["group"])
        yield _gauge("pccl_master_shared_state_revision", "Last elected revision per group.",
                     {(str(g),): r for g, r in access.revisions().items()}, ["group"])
        yield _gauge("pccl_master_collectives_running", "Collectives started and not ended.",
                     {(): len(access.running_seqs())})
        yield _counter("pccl_master_collectives_started", "Collectives started.",
                       {(): c.started})
        yield _counter("pccl_master_collectives_completed", "Collectives completed.",
                       {(): c.completed})
        yield _counter("pccl_master_collectives_aborted", "Collectives aborted, by cause.",
                       {(k,): v for k, v in c.aborted.items()}, ["cause"])
        yield _counter("pccl_master_collectives_rejected", "Collectives rejected, by cause.",
                       {(k,): v for k, v in c.rejected.items()}, ["cause"])
        yield _counter("pccl_master_collectives", "Collectives by kind (all-reduce, "
                       "broadcast, all-gather, reduce-scatter, barrier) and event (started, "
                       "completed).", {(k, e): float(n) for (k, e), n in c.kinds.items()},
                       ["kind", "event"])
        yield _counter("pccl_master_reduced_bytes", "Payload bytes of completed collectives.",
                       {(): c.reduced_bytes})
        yield _counter("pccl_master_votes", "Joint votes answered (and rejected), by kind.",
                       {(k,): v for k, v in c.votes.items()}, ["kind"])
        yield _counter("pccl_master_syncs", "Shared-state syncs by outcome (started, "
                       "completed, failed).", {(k,): v for k, v in c.syncs.items()}, ["outcome"])
        yield _counter("pccl_master_sync_bytes", "Bytes peers fetched in shared-state syncs.",
                       {(): c.sync_bytes})
        yield _counter("pccl_master_joins", "Peers registered.", {(): c.joins})
        yield _counter("pccl_master_departures", "Peers gone, by cause (left, heartbeat, "
                       "closed, kicked, refused, superseded, other).",
                       {(k,): v for k, v in c.departures.items()}, ["cause"])
        links = st.links()
        yield _gauge("pccl_master_link_bandwidth_bits_per_second", "Measured link bandwidth "
                     "(optimize_topology), by source and destination peer.",
                     {(str(s), str(d)): bps for (s, d), (bps, _) in links.items()},
                     ["src", "dst"])
        yield _gauge("pccl_master_link_latency_seconds", "Measured one-way link latency.",
                     {(str(s), str(d)): lat for (s, d), (_, lat) in links.items()},
                     ["src", "dst"])


def _gauge(name: str, doc: str, values: dict[tuple[str, ...], float],
           labels: list[str] | None = None) -> Metric:
    return _family(GaugeMetricFamily(name, doc, labels=labels or []), values)


def _counter(name: str, doc: str, values: dict[tuple[str, ...], float],
             labels: list[str] | None = None) -> Metric:
    return _family(CounterMetricFamily(name, doc, labels=labels or []), values)


def _family(family: GaugeMetricFamily | CounterMetricFamily,
            values: dict[tuple[str, ...], float]) -> Metric:
    for key, v in values.items():
        family.add_metric(list(key), v)
    return family


def http_servers(status: Status, host: str, status_port: int | None,
                 metrics_port: int | None, limits: Limits | None = None) -> list[HttpServer]:
    """One HTTP server per distinct port asked for (status and metrics may share one), each
    within ``limits`` (connections at once, in all and per address; the head's deadline)."""
    check_port("status_port", status_port)
    check_port("metrics_port", metrics_port)
    if status_port is not None and status_port == metrics_port and status_port != 0:
        return [HttpServer(status.routes(True, True), host, status_port, limits=limits,
                           name="pccl_aio master status and metrics")]
    out = []
    if status_port is not None:
        out.append(HttpServer(status.routes(True, False), host, status_port, limits=limits,
                              name="pccl_aio master status page",
                              missing=metrics_hint(metrics_port is not None)))
    if metrics_port is not None:
        out.append(HttpServer(status.routes(False, True), host, metrics_port, limits=limits,
                              name="pccl_aio master metrics"))
    return out
