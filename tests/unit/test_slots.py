"""Receive slots: reuse order, reuse only after the send, growth by blocks, release."""

from __future__ import annotations

from pccl_aio._peer.data.core.slots import Slots


class _Pool:
    def __init__(self) -> None:
        self.out: list[bytearray] = []
        self.back: list[bytearray] = []

    def take(self, nbytes: int) -> tuple[bytearray, memoryview]:
        b = bytearray(nbytes)
        self.out.append(b)
        return b, memoryview(b)

    def give(self, b: bytearray) -> None:
        self.back.append(b)


class _Sender:
    def __init__(self) -> None:
        self.passed = 0

    def written(self, position: int) -> bool:
        return self.passed >= position


def test_last_freed_slot_is_reused_first_and_views_are_cut_to_length():
    pool = _Pool()
    s = Slots(pool, 8, 3)
    a = s.land(0, 8)
    b = s.land(8, 5)
    assert len(a) == 8 and len(b) == 5 and s.landed.keys() == {0, 8}
    s.free(s.landed.pop(8))
    a[:] = b"x" * 8
    c = s.land(16, 8)
    c[:5] = b"hello"
    assert bytes(a) == b"x" * 8  # c is b's slot again, not a's
    assert len(pool.out) == 1


def test_a_forwarded_slot_waits_for_its_send_and_blocks_grow_meanwhile():
    pool, sender = _Pool(), _Sender()
    s = Slots(pool, 4, 1)
    s.land(0, 4)
    s.free_when_written(sender, 100, s.landed.pop(0))
    s.land(4, 4)  # the only slot is still being sent: a new block
    assert len(pool.out) == 2
    s.free(s.landed.pop(4))
    sender.passed = 100
    s.land(8, 4)
    s.land(12, 4)  # the freed one, then the reclaimed one: no third block
    assert len(pool.out) == 2


def test_a_slot_already_written_is_free_at_once_and_release_gives_every_block_back():
    pool, sender = _Pool(), _Sender()
    sender.passed = 10
    s = Slots(pool, 4, 1)
    s.land(0, 4)
    s.free_when_written(sender, 10, s.landed.pop(0))
    s.land(4, 4)
    assert len(pool.out) == 1
    s.land(8, 4)
    assert len(pool.out) == 2
    s.release()
    assert pool.back == pool.out and s.landed == {}
