"""A peer's Prometheus metrics, served on an opt-in HTTP port (``metrics_port``).

Nothing is counted for Prometheus on the data path: the counters are the plain ints of
``core/stats.py`` and the communicator's own state, which a custom collector reads when
``/metrics`` is scraped, on the event loop (``_net/http.py``). Each communicator has its own
``CollectorRegistry`` (several may share a process), never the global one.

Metrics (all prefixed ``pccl_peer_``): ``info`` (run, peer, group), ``sent_bytes_total`` and
``received_bytes_total`` by ``neighbour`` (payload bytes of all-reduces, collectives in flight
included), ``allreduce_seconds`` (histogram of completed all-reduces, launch to verdict, by
``size`` class), ``allreduces_total`` by ``outcome`` (completed, aborted, failed),
``retries_total``, ``master_wait_seconds_total`` by ``reason`` (vote: waiting for a vote's
answer; outage: the master lost), ``master_outages_total``, ``world_size``,
``group_world_size`` and ``collectives_in_flight``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..._errors import InvalidUsageError
from ..._net.http import HttpServer, Response, check_port
from .core.stats import FORMER, PeerStats, add_traffic

if TYPE_CHECKING:
    from ..session.control import ControlPlane

__all__ = ["ENV_PORT", "PeerMetrics", "check_options"]

ENV_PORT = "PCCL_AIO_METRICS_PORT"
_P = "pccl_peer_"


def check_options(port: object, host: object) -> tuple[int | None, str]:
    """``(metrics_port, metrics_host)`` checked; a None port defaults to
    ``$PCCL_AIO_METRICS_PORT`` (unset or empty: no metrics). Raises InvalidUsageError."""
    if port is None and (env := os.environ.get(ENV_PORT, "").strip()):
        try:
            port = int(env)
        except ValueError:
            raise InvalidUsageError(f"{ENV_PORT}={env!r} is not a port number") from None
    port = check_port("metrics_port", port)
    if not isinstance(host, str) or not host:
        raise InvalidUsageError(f"metrics_host must be a non-empty str, not {host!r}")
    return port, host


class PeerMetrics:
    """``/metrics`` of one communicator on ``host:port`` (0: the OS picks; ``port`` tells;
    None: no metrics, ``start`` and ``close`` do nothing)."""

    def __init__(self, control: ControlPlane, stats: PeerStats, port: int | None,
                 host: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_PeerCollector(control, stats))
        self.http = None if port is None else HttpServer(
            {"/metrics": self.render}, host, port, name="pccl_aio peer metrics")

    @property
    def port(self) -> int | None:
        return self.http.port if self.http is not None else None

    def render(self) -> Response:
        """The Prometheus text exposition of every metric (a scrape)."""
        return CONTENT_TYPE_LATEST, generate_latest(self.registry)

    async def start(self) -> None:
        """Listen; InvalidUsageError if the address cannot be bound."""
        if self.http is None:
            return
        try:
            await self.http.start()
        except OSError as exc:
            raise InvalidUsageError(
                f"cannot serve metrics on {self.http.host}:{self.http.port}: "
                f"{exc.strerror or exc}") from exc

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()


class _PeerCollector(Collector):
    """Reads the counters and the communicator's state at each scrape."""

    def __init__(self, control: ControlPlane, stats: PeerStats) -> None:
        self.control, self.stats = control, stats
        # the byte counters never go down: an early attempt that starts over drops its count
        self._shown: dict[tuple[str, int], int] = {}

    def collect(self) -> Iterator[Metric]:
        cp, st = self.control, self.stats
        yield InfoMetricFamily(_P[:-1], "This peer: its run, peer id and group.", value={
            "run": cp.run_id, "peer": str(cp.peer_id), "group": str(cp.config.peer_group)})
        sent, received = dict(st.sent), dict(st.received)
        for coll in cp.colls.values():  # in flight: counted at their verdict, shown now
            if coll.seq:
                add_traffic(sent, received, coll.traffic())
        yield self._bytes("sent", sent, "Collective payload bytes sent to a peer (a ring "
                         "neighbour, or a round's partner of a small collective).")
        yield self._bytes("received", received,
                          "Collective payload bytes received from a peer (a "
                          "ring neighbour, or a round's partner).")
        hist = HistogramMetricFamily(
            f"{_P}allreduce_seconds", "Completed all-reduces, launch to verdict, by size "
            "class of the buffer.", labels=["size"])
        for size, lat in st.latency.items():
            hist.add_metric([size], lat.cumulative(), lat.sum)
        yield hist
        yield _counter("allreduces", "All-reduce attempts ended, by outcome.", "outcome",
                       (("completed", st.completed), ("aborted", st.aborted),
                        ("failed", st.failed)))
        yield CounterMetricFamily(f"{_P}retries", "All-reduces relaunched by "
                                  "all_reduce_multiple_with_retry.", value=st.retries)
        out = cp.outage
        now = asyncio.get_running_loop().time()
        outage = out.seconds + (now - out.since if out.since is not None
                                and cp.failure is None else 0.0)
        yield _counter("master_wait_seconds", "Seconds blocked waiting for the master: for "
                       "vote answers, and without a master (outages).", "reason",
                       (("vote", cp.votes.seconds), ("outage", outage)))
        yield CounterMetricFamily(f"{_P}master_outages", "Master connections lost and "
                                  "ridden out.", value=out.count)
        ms = cp.membership
        yield GaugeMetricFamily(f"{_P}world_size", "Accepted peers of the run, all groups.",
                                value=ms.global_world_size if ms else 0)
        yield GaugeMetricFamily(f"{_P}group_world_size", "Peers of this peer's group (its "
                                "ring).", value=cp.peer_group_world_size)
        yield GaugeMetricFamily(f"{_P}collectives_in_flight", "All-reduces launched and not "
                                "ended.", value=len(cp.colls))

    def _bytes(self, way: str, counts: dict[int, int], doc: str) -> Metric:
        fam = CounterMetricFamily(f"{_P}{way}_bytes", doc, labels=["neighbour"])
        for peer in sorted(counts):
            key = (way, peer)
            shown = self._shown[key] = max(self._shown.get(key, 0), counts[peer])
            fam.add_metric(["former" if peer == FORMER else str(peer)], shown)
        for key in [k for k in self._shown if k[0] == way and k[1] not in counts]:
            del self._shown[key]  # a neighbour that left: its bytes count under "former" now
        return fam


def _counter(name: str, doc: str, label: str,
             values: Iterable[tuple[str, float]]) -> CounterMetricFamily:
    fam = CounterMetricFamily(f"{_P}{name}", doc, labels=[label])
    for value, n in values:
        fam.add_metric([value], n)
    return fam
