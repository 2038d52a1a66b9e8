"""Ring all-reduce correctness with several communicators and a master in one event loop."""

from __future__ import annotations

import asyncio
import gc
import socket

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._peer import testing
from pccl_aio._peer.data.core.ring import chunk_bounds

INT_DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]
OPS = list(pccl.ReduceOp)


def _inputs(dtype: str, n: int, ws: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lo = -3 if dtype.startswith(("int", "float")) else 0
    # Small integers: sums and products are exact in every dtype, so results compare exactly.
    return [rng.integers(lo, 4, n).astype(dtype) for _ in range(ws)]


def _expected(xs: list[np.ndarray], op: pccl.ReduceOp) -> np.ndarray:
    dt = xs[0].dtype
    acc = xs[0].astype(np.float64 if dt.kind == "f" else dt)
    for x in xs[1:]:
        if op in (pccl.ReduceOp.SUM, pccl.ReduceOp.AVG):
            acc = acc + x
        elif op == pccl.ReduceOp.PROD:
            acc = acc * x
        elif op == pccl.ReduceOp.MAX:
            acc = np.maximum(acc, x)
        else:
            acc = np.minimum(acc, x)
    if op == pccl.ReduceOp.AVG:
        if dt.kind == "f":
            calc = np.float32 if dt == np.float16 else dt.type
            return (np.asarray(acc, calc) / calc(len(xs))).astype(dt)
        wide = acc.astype(np.int64) if dt != np.uint64 else acc
        return np.trunc(wide / len(xs)).astype(dt)  # C division: toward zero
    return acc.astype(dt)


async def _reduce_all(comms, xs, op, *, in_place=True, tag=0):
    if in_place:
        outs = [x.copy() for x in xs]
        infos = await asyncio.gather(*(c.all_reduce(o, op=op, tag=tag)
                                       for c, o in zip(comms, outs)))
    else:
        outs = [np.empty_like(x) for x in xs]
        infos = await asyncio.gather(*(c.all_reduce(x, o, op=op, tag=tag)
                                       for c, x, o in zip(comms, xs, outs)))
    return outs, infos


@pytest.mark.parametrize("ws", [2, 3])
async def test_every_op_and_dtype_bit_identical(peers, ws):
    comms = await peers(ws)
    for dtype in INT_DTYPES + FLOAT_DTYPES:
        for op in OPS:
            for n in (0, 1, ws - 1, ws, 1025):
                xs = _inputs(dtype, n, ws, seed=n * 31 + op)
                outs, infos = await _reduce_all(comms, xs, op, in_place=(n % 2 == 1))
                want = _expected(xs, op)
                for o in outs:
                    assert o.tobytes() == outs[0].tobytes(), (dtype, op, n)
                np.testing.assert_array_equal(outs[0], want, err_msg=f"{dtype} {op!r} n={n}")
                assert all(i.world_size == ws for i in infos)


@pytest.mark.parametrize("op", [pccl.ReduceOp.SUM, pccl.ReduceOp.AVG, pccl.ReduceOp.MIN])
async def test_out_of_place_is_bit_identical_to_in_place_and_leaves_src(peers, op):
    """Out of place reads src and writes dst in one pass (no copy of src into dst first);
    the bytes must be those of the in-place run, and src must come back unchanged."""
    comms = await peers(3)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(3 * (1 << 19) + 5).astype(np.float32) for _ in range(3)]
    keep = [x.copy() for x in xs]
    outs, _ = await _reduce_all(comms, xs, op, in_place=False, tag=1)
    ins, _ = await _reduce_all(comms, xs, op, in_place=True, tag=2)
    for x, k in zip(xs, keep):
        assert x.tobytes() == k.tobytes()
    for o, i in zip(outs, ins):
        assert o.tobytes() == i.tobytes() == ins[0].tobytes()


async def test_large_float32_random_parity_and_tolerance(peers):
    comms = await peers(4, p2p_connections=3)
    rng = np.random.default_rng(7)
    xs = [rng.random(203_530, dtype=np.float32) for _ in comms]
    for op in (pccl.ReduceOp.SUM, pccl.ReduceOp.AVG):
        outs, infos = await _reduce_all(comms, xs, op, in_place=False)
        ref = np.sum(np.stack(xs).astype(np.float64), axis=0)
        if op == pccl.ReduceOp.AVG:
            ref /= len(comms)
        for o in outs:
            assert o.tobytes() == outs[0].tobytes()
        np.testing.assert_allclose(outs[0], ref, rtol=1e-5)
        w = len(comms)
        b = chunk_bounds(xs[0].size, w)
        size = [(b[c + 1] - b[c]) * 4 for c in range(w)]
        total = sum(size)
        for r, i in enumerate(infos):  # exact payload bytes; rank = join order
            assert i.tx_bytes == 2 * total - size[(r + 1) % w] - size[(r + 2) % w]
            assert i.rx_bytes == 2 * total - size[r] - size[(r + 1) % w]


async def test_integer_wraparound_and_truncating_avg(peers):
    comms = await peers(2)
    a = np.array([100, -100, 127, -7], np.int8)
    b = np.array([100, -100, 1, 0], np.int8)
    outs, _ = await _reduce_all(comms, [a, b], pccl.ReduceOp.SUM)
    assert outs[0].tolist() == [-56, 56, -128, -7]
    outs, _ = await _reduce_all(comms, [a, b], pccl.ReduceOp.AVG)
    assert outs[0].tolist() == [-28, 28, -64, -3]  # wrapped sum / 2, toward zero
    u = np.array([2**64 - 1], np.uint64)
    outs, _ = await _reduce_all(comms, [u, np.array([2], np.uint64)], pccl.ReduceOp.SUM)
    assert outs[0].tolist() == [1]


async def test_torch_tensors_including_bfloat16(peers):
    torch = pytest.importorskip("torch")
    comms = await peers(3)
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int16, torch.int64):
        ts = [torch.arange(0, 1001, dtype=torch.float32).to(dt) * (i + 1) % 7 for i in range(3)]
        want = (ts[0].double() + ts[1].double() + ts[2].double()).to(dt)
        outs = [t.clone() for t in ts]
        await asyncio.gather(*(c.all_reduce(o) for c, o in zip(comms, outs)))
        for o in outs:
            assert torch.equal(o, outs[0])
        assert torch.equal(outs[0], want), dt


async def test_concurrent_tags_and_reused_tag(peers):
    comms = await peers(2)
    a = [np.full(256, 10 * (i + 1), np.int32) for i in range(2)]
    b = [np.arange(256, dtype=np.int32) * (i + 1) for i in range(2)]
    hs = []
    for c, x, y in zip(comms, a, b):
        hs.append(c.all_reduce_async(x, tag=123, op=pccl.ReduceOp.SUM))
        hs.append(c.all_reduce_async(y, tag=456, op=pccl.ReduceOp.MAX))
    with pytest.raises(pccl.InvalidUsageError, match="already in flight"):
        comms[0].all_reduce_async(np.zeros(4, np.int32), tag=123)
    await asyncio.gather(*hs)
    assert (a[0] == 30).all() and (a[1] == 30).all()
    assert (b[0] == np.arange(256) * 2).all()


async def test_many_in_flight_over_a_pool(peers):
    comms = await peers(3, p2p_connections=4)
    xs = [[np.full(3000 + t, t + i, np.int64) for t in range(64)] for i in range(3)]
    hs = [[c.all_reduce_async(x, tag=t) for t, x in enumerate(row)] for c, row in zip(comms, xs)]
    await asyncio.gather(*(h for row in hs for h in row))
    for t in range(64):
        assert all((xs[i][t] == 3 * t + 3).all() for i in range(3))


async def test_descriptor_mismatch_rejected_everywhere(peers):
    comms = await peers(2)
    r = await asyncio.gather(comms[0].all_reduce(np.zeros(10, np.float32)),
                             comms[1].all_reduce(np.zeros(11, np.float32)),
                             return_exceptions=True)
    assert all(isinstance(e, pccl.InvalidUsageError) for e in r), r
    assert "disagree" in str(r[0])
    xs = [np.ones(10, np.float32) for _ in comms]  # the tag is free again
    await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))
    assert (xs[0] == 2).all()


async def test_bad_arguments_raise_before_sending(peers):
    comms = await peers(2)
    c = comms[0]
    with pytest.raises(pccl.InvalidUsageError, match="contiguous"):
        await c.all_reduce(np.arange(10.0)[::2])
    with pytest.raises(pccl.InvalidUsageError, match="read-only"):
        await c.all_reduce(np.frombuffer(b"\0" * 16, np.float32))
    with pytest.raises(pccl.InvalidUsageError, match="differ"):
        await c.all_reduce(np.zeros(4, np.float32), np.zeros(5, np.float32))
    with pytest.raises(pccl.InvalidUsageError, match="unsupported dtype"):
        await c.all_reduce(np.zeros(4, np.complex64))
    with pytest.raises(pccl.InvalidUsageError, match="reduce op"):
        await c.all_reduce(np.zeros(4, np.float32), op=17)
    with pytest.raises(pccl.InvalidUsageError, match="tag"):
        await c.all_reduce(np.zeros(4, np.float32), tag=-1)
    with pytest.raises(pccl.InvalidUsageError, match="restore_on_abort"):
        await c.all_reduce(np.zeros(4, np.float32), restore_on_abort="no")  # type: ignore[arg-type]
    launched = testing.control_plane(c).colls, testing.control_plane(comms[1]).colls
    assert not launched[0] and not launched[1]  # nothing was launched
    xs = [np.ones(3, np.float32) for _ in comms]
    await asyncio.gather(*(p.all_reduce(x) for p, x in zip(comms, xs)))
    assert (xs[1] == 2).all()


async def test_single_peer_too_few(peers):
    (c,) = await peers(1)
    assert (c.world_size, c.peer_group_world_size, c.num_peer_groups,
            c.largest_peer_group_world_size) == (1, 1, 1, 1)
    with pytest.raises(pccl.TooFewPeersError):
        await c.all_reduce(np.zeros(4, np.float32))
    with pytest.raises(pccl.TooFewPeersError):
        await c.all_reduce_multiple_with_retry([np.zeros(4, np.float32)])


def _tiny_send_buffers(monkeypatch) -> None:
    """Data connections get a 4 KiB kernel send buffer, so frames stay queued in the sender
    and links pause (back-pressure without a slow peer)."""
    from pccl_aio._peer.data import link as _link

    made = _link._Sender.connection_made

    def small_socket_buffer(self, transport):
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        made(self, transport)

    monkeypatch.setattr(_link._Sender, "connection_made", small_socket_buffer)


@pytest.mark.parametrize("saturated", [False, True])
async def test_segments_forwarded_inline_or_by_the_task_under_back_pressure(
        peers, monkeypatch, saturated):
    """A received segment is reduced and forwarded from the receive callback when the link has
    room, and by the run task (which waits for room) when it has none. Small segments and,
    for ``saturated``, a tiny kernel send buffer (so writes queue up and the link pauses)
    drive one path or the other; the bytes must be exact either way."""
    from pccl_aio._peer.data import link as _link
    from pccl_aio._peer.data import pipeline as _pipeline
    from pccl_aio._peer.data.paths import ring as _ring_path

    monkeypatch.setattr(_link, "WRITE_HIGH", 32 << 10)
    monkeypatch.setattr(_link, "WRITE_LOW", 8 << 10)
    monkeypatch.setattr(_ring_path, "SEGMENT_BYTES", 16 << 10)
    if saturated:
        _tiny_send_buffers(monkeypatch)
    paths = {"inline": 0, "task": 0}
    send_now, send = _pipeline.Pipeline._send_now, _pipeline.Pipeline._send

    def counted_now(self, *a, **k):
        paths["inline"] += 1
        return send_now(self, *a, **k)

    async def counted(self, *a, **k):
        paths["task"] += 1
        return await send(self, *a, **k)

    monkeypatch.setattr(_pipeline.Pipeline, "_send_now", counted_now)
    monkeypatch.setattr(_pipeline.Pipeline, "_send", counted)
    comms = await peers(3)
    rng = np.random.default_rng(11)
    xs = [rng.integers(-3, 4, (3 << 20) // 4 + 7).astype(np.float32) for _ in range(3)]
    want = _expected(xs, pccl.ReduceOp.SUM)
    for in_place in (True, False):
        outs, _ = await _reduce_all(comms, xs, pccl.ReduceOp.SUM, in_place=in_place)
        for o in outs:
            assert o.tobytes() == want.tobytes()
    first_sends = 3 * 2 * -(-(xs[0].nbytes // 3) // (16 << 10))  # our own chunk, per rank
    if saturated:
        assert paths["task"] > first_sends, paths  # forwards waited for room
    else:
        assert paths["inline"] > 0, paths


@pytest.mark.parametrize("slots_base,saturated", [(-2, False), (-2, True), (4, False),
                                                  (4, True)])
async def test_reduce_scatter_slots_reused_and_grown(peers, monkeypatch, slots_base, saturated):
    """Unquantized reduce-scatter frames land in reused segment slots taken in blocks (one
    slot per block for ``slots_base`` -2 with one connection; six by default); a slot
    forwarded from is reused only once its frame left the sender's queue, and when none is
    free another block is taken. ``saturated`` (a tiny kernel send buffer) keeps frames
    queued, so slots must wait for their sends and blocks must grow. Results are exact, in
    place and out of place, whichever way each frame went."""
    from pccl_aio._peer.data import collective as _collective
    from pccl_aio._peer.data import link as _link
    from pccl_aio._peer.data.core import slots as _slots
    from pccl_aio._peer.data.paths import ring as _ring_path

    monkeypatch.setattr(_ring_path, "SLOTS_BASE", slots_base)
    monkeypatch.setattr(_ring_path, "SEGMENT_BYTES", 16 << 10)
    written = {True: 0, False: 0}
    blocks = {"taken": 0, "collectives": 0}
    more, start = _slots.Slots._more, _collective.Collective.on_start

    def counted_more(self):
        blocks["taken"] += 1
        more(self)

    def counted_start(self, seq, *a, **kw):
        if seq != self.seq:  # not the master's confirmation of an early start (a ticket)
            blocks["collectives"] += 1
        start(self, seq, *a, **kw)

    monkeypatch.setattr(_slots.Slots, "_more", counted_more)
    monkeypatch.setattr(_collective.Collective, "on_start", counted_start)
    if saturated:
        _tiny_send_buffers(monkeypatch)
        was_written = _link._Sender.written

        def counted_written(self, position):
            done = was_written(self, position)
            written[done] += 1
            return done

        monkeypatch.setattr(_link._Sender, "written", counted_written)
    comms = await peers(3)
    rng = np.random.default_rng(5)
    for op in (pccl.ReduceOp.SUM, pccl.ReduceOp.AVG, pccl.ReduceOp.MAX):
        xs = [rng.integers(-3, 4, (1 << 20) // 4 + 13).astype(np.float32) for _ in range(3)]
        want = _expected(xs, op)
        for in_place in (True, False):
            outs, _ = await _reduce_all(comms, xs, op, in_place=in_place)
            for o in outs:
                assert o.tobytes() == want.tobytes()
    assert blocks["taken"] >= blocks["collectives"] == 3 * 3 * 2, blocks
    if saturated:  # some forwards were still queued when checked, some had left
        assert written[False] > 0 and written[True] > 0, written
        if slots_base < 0:  # one-slot blocks under queued sends: more had to be taken
            assert blocks["taken"] > blocks["collectives"], blocks


@pytest.mark.parametrize("quantized", [False, True], ids=["plain", "uint8"])
async def test_restore_on_abort_false_takes_no_backup_and_gives_the_same_bytes(peers, quantized):
    """In place with restore_on_abort=False: no buffer of the input's size is taken for a
    backup (the default takes one), and the result bytes equal the default path's."""
    comms = await peers(3)
    n = 3 * (1 << 19) + 5  # several segments per chunk, uneven chunks
    quant = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8") if quantized else None
    taken: list[int] = []
    for c in comms:
        take = testing.data_plane(c).scratch.take

        def spy(nbytes, take=take):
            taken.append(nbytes)
            return take(nbytes)

        testing.data_plane(c).scratch.take = spy
    results = {}
    for restore in (True, False):
        xs = [np.arange(n, dtype=np.float32) * (i + 1) - 7.25 for i in range(3)]
        taken.clear()
        await asyncio.gather(*(c.all_reduce(x, tag=5, quantization=quant,
                                            restore_on_abort=restore)
                               for c, x in zip(comms, xs)))
        assert xs[0].tobytes() == xs[1].tobytes() == xs[2].tobytes()
        results[restore] = xs[0].tobytes()
        backups = [t for t in taken if t == xs[0].nbytes]
        assert len(backups) == (3 if restore else 0), taken
    assert results[True] == results[False]


@pytest.mark.parametrize("n", [1024, 1 << 18])  # the small path and the ring
async def test_finished_all_reduces_leave_no_reference_cycles(peers, n):
    """A finished all-reduce is freed by reference counting: a cycle (the collective and its
    pipeline held each other) left every one to the garbage collector, whose passes cost
    the small all-reduce about a tenth of its time."""
    comms = await peers(2)
    xs = [np.ones(n, np.float32) for _ in comms]

    async def rounds(k: int) -> None:
        for _ in range(k):
            await asyncio.gather(*(c.all_reduce(x) for c, x in zip(comms, xs)))

    await rounds(5)  # links open, pools filled
    gc.collect()
    gc.disable()
    try:
        await rounds(100)
        garbage = gc.collect()
    finally:
        gc.enable()
    assert garbage < 100, garbage  # (a cycle per collective: about 40 objects per peer each)
