"""The master's EOF check before a failure report aborts a collective (``_net/stream.at_eof``):
a SIGKILLed peer's control connection may still hold an unread heartbeat before its EOF."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest

from pccl_aio._net.stream import at_eof

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as lst:
        client = socket.create_connection(lst.getsockname())
        server, _ = lst.accept()
        with client, server:
            yield client, server


def test_an_open_idle_connection_is_not_at_eof(pair):
    _, server = pair
    assert not at_eof(server)


def test_unread_bytes_before_the_eof_do_not_hide_it(pair):
    client, server = pair
    client.sendall(b"\x00\x00\x00\x02hb")  # a heartbeat frame the master has not read yet
    client.shutdown(socket.SHUT_WR)  # then the peer's kernel closes the connection
    assert select.select([server], [], [], 5)[0]
    assert server.recv(64, socket.MSG_PEEK)  # a peek sees the bytes, not the EOF behind them
    assert at_eof(server)


def test_a_reset_connection_is_at_eof(pair):
    client, server = pair
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()  # linger 0: an RST
    assert select.select([server], [], [], 5)[0]
    assert at_eof(server)
