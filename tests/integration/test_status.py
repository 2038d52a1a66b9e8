"""The master's HTTP ports in-process: ``Master(status_port=, metrics_port=, http_host=)``
serves the page, ``/status.json`` and ``/metrics``; bad ports are typed errors; clients that
misbehave on those ports never disturb the run; ``close`` closes them."""

from __future__ import annotations

import asyncio
import json

import pytest

import pccl_aio as pccl
from tests.helpers import crash, join_peers, reduce_ok

pytestmark = pytest.mark.timeout(60)


async def get(url: str) -> tuple[str, str]:
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, port = hostport.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /{path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return head, body


def master(**kw: object) -> pccl.Master:
    return pccl.Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                       admission_interval=0.0, **kw)  # type: ignore[arg-type]


async def test_status_json_page_and_metrics_follow_the_run():
    async with master(status_port=0, metrics_port=0) as m:
        assert m.status_address.startswith("http://127.0.0.1:")
        assert m.metrics_address.endswith("/metrics")
        assert m.status_address.rsplit(":", 1)[1] != m.metrics_address.rsplit(":", 1)[1]
        comms = await join_peers(m, 3)
        try:
            await reduce_ok(comms)
            head, body = await get(m.status_address + "status.json")
            assert "200 OK" in head and "application/json" in head
            status = json.loads(body)
            assert status["world_size"] == 3 and status["counts"]["completed"] == 1
            assert [g["ring"] for g in status["groups"]] == [[c.peer_id for c in comms]]
            crash(comms[2])
            await reduce_ok(comms[:2])
            status = json.loads((await get(m.status_address + "status.json"))[1])
            assert sorted(p["id"] for p in status["peers"]) == [comms[0].peer_id, comms[1].peer_id]
            assert status["counts"]["departures"] == {"closed": 1}
            assert any(f"peer {comms[2].peer_id} dead" in e["text"] for e in status["recent"])
            head, page = await get(m.status_address)
            assert "text/html" in head and "<title>pccl_aio run status</title>" in page
            assert f'"run": "{status["run"]}"' in page
            _, metrics = await get(m.metrics_address)
            assert "pccl_master_collectives_completed_total 2.0" in metrics
            assert (await get(m.status_address + "metrics"))[0].startswith("HTTP/1.1 404")
        finally:
            for c in comms[:2]:
                await c.close()


async def test_status_and_metrics_can_share_one_port():
    async with master(status_port=0) as m:
        assert m.metrics_address == ""
    with pytest.raises(OSError):  # closed with the master
        await get(m.status_address)
    async with master(metrics_port=0) as m:
        assert m.status_address == ""
        assert (await get(m.metrics_address))[0].startswith("HTTP/1.1 200")
    import socket

    with socket.socket() as s:  # a free port, for both
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with master(status_port=port, metrics_port=port) as m:
        assert m.status_address == f"http://127.0.0.1:{port}/"
        assert m.metrics_address == f"http://127.0.0.1:{port}/metrics"
        assert "pccl_master_peers" in (await get(m.metrics_address))[1]
        assert json.loads((await get(m.status_address + "status.json"))[1])["world_size"] == 0


async def test_metrics_asked_of_a_status_port_answer_where_they_are():
    """Not a bare 404: the body says metrics are on the metrics port, or how to serve them."""
    async with master(status_port=0) as m:
        head, body = await get(m.status_address + "metrics")
        assert head.startswith("HTTP/1.1 404"), head
        assert "--metrics-port PORT" in body and "Master(metrics_port=PORT)" in body, body
    async with master(status_port=0, metrics_port=0) as m:
        head, body = await get(m.status_address + "metrics")
        assert head.startswith("HTTP/1.1 404"), head
        assert "on the master's metrics port (--metrics-port" in body, body


async def test_a_master_on_every_interface_shows_the_address_the_page_was_reached_at():
    """Listening on 0.0.0.0, the page shows the Host header's host with the master's port
    (an address a peer can use), not 0.0.0.0; a master on one address shows that one."""
    async with pccl.Master("0.0.0.0", 0, status_port=0, heartbeat_interval=0.2) as m:
        assert m.address.startswith("0.0.0.0:")
        reachable = f"127.0.0.1:{m.port}"
        assert json.loads((await get(m.status_address + "status.json"))[1])["address"] \
            == reachable
        assert f'"address": "{reachable}"' in (await get(m.status_address))[1]
        async with pccl.Communicator(reachable, heartbeat_interval=0.2) as c:
            await c.connect(attempts=1)  # the address shown is one a peer can use
        assert m.status.snapshot()["address"] == m.address  # in-process: no request
    async with master(status_port=0) as m:
        status = json.loads((await get(m.status_address + "status.json"))[1])
        assert status["address"] == m.address


@pytest.mark.parametrize("bad", [-1, 65536, "8080", 1.5, True])
def test_bad_http_ports_are_typed_errors(bad):
    with pytest.raises(pccl.InvalidUsageError, match="status_port must be a port"):
        master(status_port=bad)
    with pytest.raises(pccl.InvalidUsageError, match="metrics_port must be a port"):
        master(metrics_port=bad)


async def test_an_http_port_in_use_fails_start_and_leaves_nothing_open():
    async with master(status_port=0) as first:
        port = int(first.status_address.rsplit(":", 1)[1].strip("/"))
        m = master(metrics_port=port)
        with pytest.raises(OSError) as err:
            await m.start()
        assert err.value.filename == f"127.0.0.1:{port}"
        with pytest.raises(OSError):  # its peer port was closed again
            await asyncio.open_connection("127.0.0.1", m.port)


async def test_clients_misbehaving_on_the_status_port_do_not_disturb_the_run():
    async with master(status_port=0, metrics_port=0) as m:
        comms = await join_peers(m, 2)
        host, port = m.status_address.removeprefix("http://").strip("/").rsplit(":", 1)
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(40)]
        for _, w in idle[:20]:
            w.write(b"\x00\xff garbage that is no request\r\n\r\n")
        try:
            for _ in range(5):
                await reduce_ok(comms)
            assert json.loads((await get(m.status_address + "status.json"))[1])["world_size"] == 2
        finally:
            for _, w in idle:
                w.close()
            for c in comms:
                await c.close()


async def test_a_measured_bandwidth_matrix_is_served_as_json_and_metrics():
    async with master(status_port=0, metrics_port=0) as m:
        comms = await join_peers(m, 3)
        try:
            status = json.loads((await get(m.status_address + "status.json"))[1])
            assert status["links"] == []  # not measured yet
            infos = await asyncio.gather(*(c.optimize_topology(timeout=30) for c in comms))
            ids = sorted(c.peer_id for c in comms)
            status = json.loads((await get(m.status_address + "status.json"))[1])
            links = {(link["src"], link["dst"]): link for link in status["links"]}
            assert sorted(links) == [(a, b) for a in ids for b in ids if a != b]
            assert all(link["bps"] > 0 and 0 <= link["latency_s"] < 1 for link in links.values())
            assert status["groups"][0]["ring"] == list(infos[0].ring)
            assert status["counts"]["votes"]["optimize_topology"] == 1
            _, metrics = await get(m.metrics_address)
            for a, b in links:
                assert f'pccl_master_link_bandwidth_bits_per_second{{dst="{b}",src="{a}"}}' \
                    in metrics
            assert any(e["event"] == "optimized" for e in status["recent"])
        finally:
            for c in comms:
                await c.close()
