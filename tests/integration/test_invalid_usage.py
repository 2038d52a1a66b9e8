"""Typed errors at the door: argument errors of the public API, and calls from another
event loop or thread, are InvalidUsageError, raised before anything is sent (issue 16's
list of traps, the peer side)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer import testing
from pccl_aio._peer.core.config import PeerConfig
from tests.helpers import record_sends, reduce_ok

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("addr", [
    ("127.0.0.1", 48148),  # a tuple, as socket APIs take it
    "127.0.0.1:99999", "127.0.0.1:0", "http://127.0.0.1:48148", "127.0.0.1:48148/",
    "127.0.0.1", ":48148", "127.0.0.1:port", "host name:48148", b"127.0.0.1:48148",
])
def test_bad_master_addresses_are_refused_at_construction(addr):
    t0 = time.monotonic()
    with pytest.raises(pccl.InvalidUsageError, match="master"):
        pccl.Communicator(addr)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 0.5  # refused, not retried


@pytest.mark.parametrize("addr", ["localhost:48148:1", "10.0.0.1:48148:2", "[::1:48148"])
def test_an_address_with_a_colon_too_many_is_malformed_and_names_the_form(addr):
    """``MASTER=localhost:48148:1`` is not tried five times as host ``localhost:48148``."""
    t0 = time.monotonic()
    with pytest.raises(pccl.InvalidUsageError, match="malformed") as err:
        pccl.Communicator(addr)
    assert "'host:port'" in str(err.value) and "[::1]:48148" in str(err.value), err.value
    assert time.monotonic() - t0 < 0.5


@pytest.mark.parametrize("addr", ["[::1]:48148", "::1:48148", "localhost:48148"])
def test_ipv6_in_brackets_and_plain_hosts_still_parse(addr):
    config = PeerConfig.parse(addr)
    assert config.masters == ((addr.rpartition(":")[0].strip("[]"), 48148),)


@pytest.mark.parametrize("kw", [{"peer_group": -1}, {"p2p_connections": 0},
                                {"heartbeat_timeout": 0}, {"data_timeout": -1.0}])
def test_bad_options_are_refused_at_construction(kw):
    with pytest.raises(pccl.InvalidUsageError):
        pccl.Communicator("127.0.0.1:48148", **kw)


async def test_a_listen_host_that_cannot_bind_is_invalid_usage(master):
    comm = pccl.Communicator(master.address, listen_host="192.0.2.1")  # not an address here
    with pytest.raises(pccl.InvalidUsageError, match="cannot listen"):
        await comm.connect(attempts=1)
    await comm.close()


async def _reachable(host: str, port: int) -> bool:
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    except ConnectionRefusedError:
        return False
    w.close()
    return True


@pytest.mark.parametrize(("listen_host", "everywhere"), [("", False), ("0.0.0.0", True)])
async def test_listeners_bind_the_interface_that_reaches_the_master(master, listen_host,
                                                                    everywhere):
    """Issue 31: by default the data and state listeners bind only the interface this host
    reaches the master through (here loopback's 127.0.0.1: 127.0.0.2, another loopback
    address, is refused); ``listen_host="0.0.0.0"`` binds all, as the old default did."""
    async with pccl.Communicator(master.address, listen_host=listen_host) as c:
        await c.connect()
        for port in (testing.data_plane(c).listener.port,
                     testing.shared_state_sync(c).server.port):
            assert await _reachable("127.0.0.1", port)
            assert await _reachable("127.0.0.2", port) is everywhere


async def test_bad_arguments_of_calls_are_invalid_usage_and_send_nothing(peers):
    a, b = await peers(2)
    sent = record_sends(a)
    x = np.ones(8, np.float32)
    calls = [
        lambda: a.all_reduce(x, op="median"),
        lambda: a.all_reduce(x, tag=-1),
        lambda: a.all_reduce(x, quantization="uint8"),
        lambda: a.all_reduce(np.ones(8, np.complex64)),
        lambda: a.all_reduce(x, np.ones(9, np.float32)),
        lambda: a.all_reduce_multiple_with_retry([x], max_in_flight=0),
        lambda: a.all_reduce_multiple_with_retry([x], max_in_flight=True),
        lambda: a.all_reduce_multiple_with_retry([x], max_attempts=0),
        lambda: a.all_reduce_multiple_with_retry([x], restore_on_abort=1),
        lambda: a.all_reduce_multiple_with_retry([]),
        lambda: a.all_reduce_multiple_with_retry([x], first_tag=-1),
        lambda: a.all_reduce_multiple_with_retry([np.ones(8, np.int32)],
                                                 quantization=pccl.Quantization(
                                                     pccl.QuantAlgo.MIN_MAX, pccl.DataType.UINT8)),
        lambda: a.sync_shared_state(pccl.SharedState({"x": x}), progress=3),
        lambda: a.sync_shared_state(pccl.SharedState({"x": x}), strategy=7),
        lambda: a.sync_shared_state({"x": x}),
    ]
    for call in calls:
        with pytest.raises(pccl.InvalidUsageError):
            await call()
    with pytest.raises(pccl.InvalidUsageError, match="connect"):
        await a.connect()
    assert sent == []
    infos = await asyncio.gather(a.all_reduce(x), b.all_reduce(x.copy()))
    assert infos[0].world_size == 2 and (x == 2).all()


# Such a call used to corrupt the group.
@pytest.mark.timeout(60)
async def test_a_call_from_another_loop_or_thread_raises_and_sends_nothing(peers):
    a, b = await peers(2)
    sent = record_sends(a)
    x = np.ones(16, np.float32)

    def from_a_thread() -> list[type[BaseException]]:
        seen: list[type[BaseException]] = []

        async def other_loop() -> None:
            for call in (lambda: a.all_reduce(x), a.update_topology, a.are_peers_pending,
                         lambda: a.sync_shared_state(pccl.SharedState({"x": x})), a.close):
                try:
                    await asyncio.wait_for(call(), 5)
                except BaseException as exc:
                    seen.append(type(exc))

        asyncio.run(other_loop())
        try:  # no event loop at all in this thread
            a.all_reduce_async(x)
        except BaseException as exc:
            seen.append(type(exc))
        return seen

    seen = await asyncio.to_thread(from_a_thread)
    assert seen == [pccl.InvalidUsageError] * 6
    assert sent == []
    await reduce_ok([a, b])  # the group did not notice
