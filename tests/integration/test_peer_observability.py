"""Issue 21, the peer's side: its log lines (with run, peer and group ids) and its opt-in
Prometheus ``/metrics``, on real sockets."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pccl_aio as pccl
from pccl_aio import _log
from pccl_aio._peer import testing
from tests.helpers import FAST, crash, join_peers

pytestmark = pytest.mark.timeout(60)


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return _log.fields_of(record)


def _first_start(comm: pccl.Communicator, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set when the master starts a collective of ``comm`` (its data begins to flow)."""
    from pccl_aio._peer.data import collective as _collective

    started = asyncio.Event()
    on_start = _collective.Collective.on_start

    def spy(self: Any, seq: int, ring_ids: list[int], me: int, early: bool = False) -> None:
        on_start(self, seq, ring_ids, me, early)
        if self.env is testing.data_plane(comm):
            started.set()

    monkeypatch.setattr(_collective.Collective, "on_start", spy)
    return started


async def test_a_peers_info_log_tells_connect_admission_lost_peer_abort_and_retry(
        peers, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="pccl_aio")
    comms = await peers(3, p2p_connections=1)
    survivors, victim = comms[:2], comms[2]
    me = survivors[0]
    # connected and admitted, each line with the run, peer and group ids
    for c in comms:
        mine = [r for r in _lines(caplog, "connected to the master at")
                if _fields(r).get("peer") == c.peer_id]
        assert mine, c.peer_id
        f = _fields(mine[-1])
        assert f["run"] and f["group"] == 0 and f["term"] >= 1 and ":" in f["master"]
        admitted = [r for r in _lines(caplog, "admitted to the run")
                    if _fields(r).get("peer") == c.peer_id]
        assert len(admitted) == 1
        assert _fields(admitted[0])["run"] == f["run"]
    assert any("waiting for admission" in r.getMessage()
               for r in _lines(caplog, "connected to the master at"))
    caplog.clear()

    started = _first_start(victim, monkeypatch)
    tensors = [[np.full(40_000, t + 1.0, np.float64) for t in range(6)] for _ in range(3)]
    tasks = [asyncio.ensure_future(c.all_reduce_multiple_with_retry(ts, max_in_flight=3))
             for c, ts in zip(comms, tensors)]
    await started.wait()
    crash(victim)
    tasks[2].cancel()
    await asyncio.gather(*tasks[:2])
    await asyncio.gather(tasks[2], return_exceptions=True)

    def of(text: str, comm: pccl.Communicator) -> list[dict[str, Any]]:
        return [_fields(r) for r in _lines(caplog, text) if _fields(r).get("peer") == comm.peer_id]

    for c in survivors:
        lost = of("lost peer", c)
        assert len(lost) == 1, lost
        assert lost[0]["lost"] == [victim.peer_id] and lost[0]["world"] == 2
        assert sorted(lost[0]["ring"]) == sorted(s.peer_id for s in survivors)
        assert lost[0]["run"] and lost[0]["group"] == 0
    aborted = of(" aborted: ", me)
    assert aborted, [r.getMessage() for r in caplog.records]
    assert all(f["tag"] in range(6) and f["cause"] for f in aborted)
    assert any(f["seq"] > 0 and f["cause"] == f"peer {victim.peer_id} left the run"
               for f in aborted)
    retried = of("retrying all-reduce", me)
    assert sorted(f["tag"] for f in retried) == sorted(f["tag"] for f in aborted)
    assert all(f["attempt"] >= 2 and f["cause"] for f in retried)
    # INFO: nothing per collective completed
    assert not _lines(caplog, "completed:")


async def test_debug_logs_one_line_per_collective_completed(peers, caplog):
    a, b = await peers(2)
    caplog.set_level(logging.DEBUG, logger="pccl_aio")
    x, y = np.ones(1000, np.float32), np.ones(1000, np.float32)
    await asyncio.gather(a.all_reduce(x, tag=5), b.all_reduce(y, tag=5))
    done = [_fields(r) for r in _lines(caplog, "completed:") if _fields(r).get("peer") == a.peer_id]
    assert len(done) == 1
    assert done[0]["tag"] == 5 and done[0]["seq"] > 0 and done[0]["bytes"] == 4000
    assert done[0]["seconds"] >= 0 and done[0]["run"]


async def test_log_level_from_the_environment(monkeypatch):
    lib = logging.getLogger("pccl_aio")
    level, handlers = lib.level, list(lib.handlers)
    monkeypatch.setenv("PCCL_AIO_LOG_LEVEL", "debug")
    try:
        pccl.Communicator("127.0.0.1:1")
        assert lib.level == logging.DEBUG
    finally:
        lib.setLevel(level)
        for h in [h for h in lib.handlers if h not in handlers]:
            lib.removeHandler(h)


async def _scrape(port: int, path: str = "/metrics") -> tuple[str, str]:
    """(status line and headers, body) of a plain HTTP GET on 127.0.0.1."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        async with asyncio.timeout(10):
            raw = await reader.read()  # Connection: close
    finally:
        writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return head, body


async def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    head, body = await _scrape(port)
    assert head.startswith("HTTP/1.1 200"), head
    assert "text/plain" in head
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(ms: dict, name: str, **labels: str) -> float:
    return ms.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_count_bytes_per_neighbour_and_latency_by_size_class(master):
    comms = await join_peers(master, 3, metrics_port=0, p2p_connections=1)
    try:
        ports = [c.metrics_port for c in comms]
        assert all(isinstance(p, int) and p > 0 for p in ports) and len(set(ports)) == 3
        c0 = comms[0]
        ring = [p.peer_id for p in testing.control_plane(c0).membership.ring]
        me = ring.index(c0.peer_id)
        succ, pred = str(ring[(me + 1) % 3]), str(ring[me - 1])
        before = await _metrics(ports[0])
        assert _get(before, "pccl_peer_world_size") == 3
        assert _get(before, "pccl_peer_group_world_size") == 3
        assert _get(before, "pccl_peer_info", run=testing.control_plane(c0).run_id,
                    peer=str(c0.peer_id), group="0") == 1

        n = 1 << 16  # 256 KiB of float32: the ring, size class <1MiB
        infos = []
        for tag in range(3):
            xs = [np.full(n, i + 1.0, np.float32) for i in range(3)]
            res = await asyncio.gather(*(c.all_reduce(x, tag=tag) for c, x in zip(comms, xs)))
            infos.append(res[0])
            assert (xs[0] == 6).all()
        small = [np.ones(100, np.float32) for _ in comms]  # the small path, <64KiB
        infos.append((await asyncio.gather(*(c.all_reduce(x, tag=9)
                                             for c, x in zip(comms, small))))[0])
        after = await _metrics(ports[0])

        def moved(name: str, **labels: str) -> float:
            return _get(after, name, **labels) - _get(before, name, **labels)

        tx, rx = sum(i.tx_bytes for i in infos), sum(i.rx_bytes for i in infos)
        assert tx > 4 * n * 4 * 2 // 3 > 0 and rx > 0
        assert moved("pccl_peer_sent_bytes_total", neighbour=succ) == tx
        assert moved("pccl_peer_received_bytes_total", neighbour=pred) == rx
        assert moved("pccl_peer_sent_bytes_total", neighbour=pred) == 0
        assert moved("pccl_peer_received_bytes_total", neighbour=succ) == 0
        assert moved("pccl_peer_allreduce_seconds_count", size="<1MiB") == 3
        assert moved("pccl_peer_allreduce_seconds_count", size="<64KiB") == 1
        assert moved("pccl_peer_allreduce_seconds_count", size="<16MiB") == 0
        assert moved("pccl_peer_allreduce_seconds_bucket", size="<1MiB", le="+Inf") == 3
        assert moved("pccl_peer_allreduce_seconds_sum", size="<1MiB") > 0
        assert moved("pccl_peer_allreduces_total", outcome="completed") == 4
        assert moved("pccl_peer_allreduces_total", outcome="aborted") == 0
        assert _get(after, "pccl_peer_retries_total") == 0
        assert _get(after, "pccl_peer_master_wait_seconds_total", reason="vote") > 0
        assert _get(after, "pccl_peer_collectives_in_flight") == 0

        head, _ = await _scrape(ports[0], "/other")
        assert head.startswith("HTTP/1.1 404")
    finally:
        for c in comms:
            await c.close()
    with pytest.raises(OSError):  # closed with the communicator
        await asyncio.open_connection("127.0.0.1", ports[0])


async def test_metrics_count_an_abort_and_its_retry(master, monkeypatch):
    comms = await join_peers(master, 3, metrics_port=0, p2p_connections=1)
    try:
        started = _first_start(comms[2], monkeypatch)
        tensors = [[np.full(40_000, 1.0, np.float64) for _ in range(4)] for _ in range(3)]
        tasks = [asyncio.ensure_future(c.all_reduce_multiple_with_retry(ts, max_in_flight=2))
                 for c, ts in zip(comms, tensors)]
        await started.wait()
        crash(comms[2])
        tasks[2].cancel()
        await asyncio.gather(*tasks[:2])
        await asyncio.gather(tasks[2], return_exceptions=True)
        ms = await _metrics(comms[0].metrics_port)
        aborted = _get(ms, "pccl_peer_allreduces_total", outcome="aborted")
        assert aborted >= 1
        assert _get(ms, "pccl_peer_retries_total") == aborted
        assert _get(ms, "pccl_peer_allreduces_total", outcome="completed") == 4
        assert _get(ms, "pccl_peer_world_size") == 2
    finally:
        for c in comms:
            await c.close()


@pytest.mark.parametrize("bad", [-1, 65536, "9100", 1.5, True])
async def test_metrics_port_must_be_a_port(bad):
    with pytest.raises(pccl.InvalidUsageError, match="metrics_port"):
        pccl.Communicator("127.0.0.1:1", metrics_port=bad)


async def test_metrics_host_and_environment_default_are_checked(monkeypatch):
    with pytest.raises(pccl.InvalidUsageError, match="metrics_host"):
        pccl.Communicator("127.0.0.1:1", metrics_port=0, metrics_host="")
    assert pccl.Communicator("127.0.0.1:1").metrics_port is None
    monkeypatch.setenv("PCCL_AIO_METRICS_PORT", "nine")
    with pytest.raises(pccl.InvalidUsageError, match="PCCL_AIO_METRICS_PORT"):
        pccl.Communicator("127.0.0.1:1")
    monkeypatch.setenv("PCCL_AIO_METRICS_PORT", "0")
    assert pccl.Communicator("127.0.0.1:1").metrics_port == 0
    assert pccl.Communicator("127.0.0.1:1", metrics_port=5).metrics_port == 5


async def test_a_metrics_port_in_use_fails_connect_cleanly(master):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        comm = pccl.Communicator(master.address, metrics_port=port, **FAST)
        with pytest.raises(pccl.InvalidUsageError, match="metrics"):
            await comm.connect()
        await comm.close()


def _new_master(port: int = 0) -> pccl.Master:
    return pccl.Master("127.0.0.1", port, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                       admission_interval=0.0)


async def test_a_master_outage_is_logged_with_the_ids_and_counted(caplog):
    caplog.set_level(logging.INFO, logger="pccl_aio")
    first = _new_master()
    await first.start()
    port = first.port
    try:
        a, b = await join_peers(first, 2, metrics_port=0)
    finally:
        await first.close()
    xs = [np.full(1000, i + 1.0, np.float32) for i in range(2)]
    calls = [asyncio.ensure_future(c.all_reduce(x)) for c, x in zip((a, b), xs)]
    second = _new_master(port)
    await second.start()
    try:
        await asyncio.gather(*calls)  # waited for the next master, then ran
        assert all((x == 3.0).all() for x in xs)
        ms = await _metrics(a.metrics_port)
        assert _get(ms, "pccl_peer_master_outages_total") == 1
        assert _get(ms, "pccl_peer_master_wait_seconds_total", reason="outage") > 0
        assert _get(ms, "pccl_peer_allreduces_total", outcome="completed") == 1
        for c in (a, b):
            lost = [_fields(r) for r in _lines(caplog, "lost (")
                    if _fields(r).get("peer") == c.peer_id]
            back = [_fields(r) for r in _lines(caplog, "rejoined the run at")
                    if _fields(r).get("peer") == c.peer_id]
            assert len(lost) == 1 and len(back) == 1
            assert lost[0]["run"] and lost[0]["term"] == 1 and lost[0]["cause"]
            assert back[0]["term"] == 2 and back[0]["seconds"] > 0
            connected = [_fields(r) for r in _lines(caplog, "connected to the master at")
                         if _fields(r).get("peer") == c.peer_id]
            assert [f["term"] for f in connected][-1] == 2
    finally:
        await asyncio.gather(a.close(), b.close())
        await second.close()
