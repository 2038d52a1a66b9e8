"""The point-to-point receiving side driven byte by byte, as the event loop's transport
drives it (``get_buffer``/``buffer_updated``): a receive posted while its message is being
read aside takes what came and the rest lands in its buffer (the stash room given back at
once), a cancelled one stops being written, and stash buffers of one size are reused."""

from __future__ import annotations

import numpy as np
import pytest

from pccl_aio._peer.p2p.inbox import Inbox
from pccl_aio._peer.p2p.mailbox import Mailbox
from pccl_aio._wire.p2p import pack_header, user_key

pytestmark = pytest.mark.timeout(10)

PEER = 4
MIB = 1 << 20


class Transport:
    def __init__(self) -> None:
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def abort(self) -> None:
        pass


def feed(inbox: Inbox, data: bytes) -> None:
    """What the transport does with ``data`` from the socket."""
    view = memoryview(data)
    while view:
        buf = inbox.get_buffer(len(view))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        inbox.buffer_updated(n)
        view = view[n:]


def connected(mailbox: Mailbox) -> Inbox:
    inbox = Inbox(mailbox, set(), PEER)
    inbox.connection_made(Transport())  # type: ignore[arg-type]
    return inbox


async def test_a_receive_posted_mid_message_takes_the_rest_straight_into_its_buffer():
    mailbox = Mailbox()
    inbox = connected(mailbox)
    payload = np.random.default_rng(0).integers(0, 256, 2 * MIB, dtype=np.uint8).tobytes()
    feed(inbox, pack_header(user_key(5), len(payload)) + payload[:MIB + 3])
    assert mailbox.stashed == len(payload)  # (being read aside)
    out = bytearray(len(payload))
    recv = mailbox.post(PEER, user_key(5), memoryview(out))
    assert mailbox.stashed == 0 and not recv.future.done()  # (the room given back at once)
    feed(inbox, payload[MIB + 3:])
    assert recv.future.result() == (PEER, len(payload))
    assert bytes(out) == payload


async def test_a_cancelled_receive_is_not_written_after_it_was_withdrawn():
    mailbox = Mailbox()
    inbox = connected(mailbox)
    payload = b"\x07" * (2 * MIB)
    feed(inbox, pack_header(user_key(1), len(payload)) + payload[:100])
    out = bytearray(len(payload))
    recv = mailbox.post(PEER, user_key(1), memoryview(out))
    mailbox.withdraw(recv)
    feed(inbox, payload[100:] + pack_header(user_key(1), 3) + b"abc")
    assert recv.future.cancelled() and out[100:] == bytes(len(payload) - 100)
    nxt = bytearray(3)  # (the connection goes on: the next message arrives whole)
    later = mailbox.post(PEER, user_key(1), memoryview(nxt))
    assert later.future.result() == (PEER, 3) and nxt == b"abc"


async def test_a_wrong_size_receive_posted_mid_message_fails_and_the_stream_goes_on():
    mailbox = Mailbox()
    inbox = connected(mailbox)
    feed(inbox, pack_header(user_key(2), 10) + b"01234")
    small = bytearray(4)
    recv = mailbox.post(PEER, user_key(2), memoryview(small))
    feed(inbox, b"56789" + pack_header(user_key(2), 4) + b"wxyz")
    with pytest.raises(Exception, match="sent 10 bytes"):
        recv.future.result()
    again = mailbox.post(PEER, user_key(2), memoryview(small))
    assert again.future.result() == (PEER, 4) and small == b"wxyz"


async def test_a_stream_of_equal_messages_reuses_one_stash_buffer():
    mailbox = Mailbox()
    inbox = connected(mailbox)
    buffers = set()
    for i in range(4):
        payload = bytes([i]) * (2 * MIB)
        feed(inbox, pack_header(user_key(3), len(payload)) + payload)  # (before its receive)
        buffers.add(id(mailbox._messages[0].data))
        out = bytearray(len(payload))
        recv = mailbox.post(PEER, user_key(3), memoryview(out))
        assert recv.future.result() == (PEER, len(payload)) and out == payload
    assert len(buffers) == 1 and mailbox.stashed == 0
