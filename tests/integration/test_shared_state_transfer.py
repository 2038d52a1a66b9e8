"""Shared-state transfers end to end: joining peers, dtypes, exact byte counts, ranges spread
over several sources, inequality-allowed entries.

Scenarios 54-55 of the behaviour reference (§3) and the late joiner of scenario 8. Shared
helpers: ``state_harness``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio import DataType
from tests.helpers import FAST, admit
from tests.integration.state_harness import PIECE, RO, SO, random_bits, raw, sync, torch, tx_rx, u8

# ---- scenarios 54-55: joining peers ---------------------------------------------------------


async def test_async_diloco_insertion(master, peers):
    """Scenario 54: veterans' second sync is SEND_ONLY, the joiner's RECEIVE_ONLY: the joiner
    receives the post-outer-step state, veterans receive nothing."""
    vets = await peers(2)
    ws = [np.zeros(2000, np.float32) for _ in vets]
    states = [pccl.SharedState({"w": w}) for w in ws]
    await sync(vets, states)
    async with pccl.Communicator(master.address, **FAST) as joiner:
        await admit(vets, joiner)
        for w, s in zip(ws, states):
            w += 0.5  # the outer step
            s.revision = 1
        wj = np.zeros(2000, np.float32)
        sj = pccl.SharedState({"w": wj})
        infos = await sync([*vets, joiner], [*states, sj], [SO, SO, RO])
        assert infos[2].rx_bytes == 8000 and infos[0].rx_bytes == infos[1].rx_bytes == 0
        assert infos[0].tx_bytes + infos[1].tx_bytes == 8000
        assert (wj == 0.5).all() and sj.revision == 1


@pytest.mark.parametrize("identical", [True, False])
async def test_peer_joining_between_steps(master, peers, identical):
    """Scenario 55: a peer admitted after step 2 syncs at the next revision with the others."""
    vets = await peers(2)
    xs = [u8(0) for _ in vets]
    states = [pccl.SharedState({"k": x}) for x in xs]
    for step in range(3):
        for x, s in zip(xs, states):
            x[:] = step
            s.revision = step
        await sync(vets, states)
    async with pccl.Communicator(master.address, **FAST) as joiner:
        await admit(vets, joiner)
        for x, s in zip(xs, states):
            x[:] = 3
            s.revision = 3
        xj = u8(3 if identical else 77)
        infos = await sync([*vets, joiner], [*states, pccl.SharedState({"k": xj}, revision=3)])
        if identical:
            assert tx_rx(infos) == [(0, 0)] * 3
        else:
            assert infos[2].rx_bytes == 1024 and (xj == 3).all()
            assert infos[0].tx_bytes + infos[1].tx_bytes == 1024


async def test_late_joiner_receives_everything_then_nothing(master, peers):
    """Scenario 8: a late joiner's first sync has rx = the total bytes; afterwards all peers
    advance deterministically (revision + 1, identical in-place updates) with rx = tx = 0."""
    def fresh_tensors():
        return {"w": np.zeros((64, 33), np.float32), "b": np.zeros(7, np.float64),
                "step": np.zeros(1, np.int64), "h": np.zeros(100, np.float16)}

    def advance(t, s):
        t["w"] *= np.float32(0.5)
        t["w"] += np.float32(1.25)
        t["b"] -= 0.1
        t["step"] += 1
        t["h"] += np.float16(0.125)
        s.revision += 1

    vets = await peers(2)
    ts = [fresh_tensors() for _ in vets]
    states = [pccl.SharedState(t) for t in ts]
    total = states[0].nbytes
    await sync(vets, states)
    for _ in range(2):
        for t, s in zip(ts, states):
            advance(t, s)
        assert tx_rx(await sync(vets, states)) == [(0, 0), (0, 0)]
    async with pccl.Communicator(master.address, **FAST) as joiner:
        await admit(vets, joiner)
        comms = [*vets, joiner]
        ts.append(fresh_tensors())
        states.append(pccl.SharedState(ts[2]))  # revision 0, all zeros
        for t, s in zip(ts[:2], states[:2]):
            advance(t, s)
        infos = await sync(comms, states)
        assert infos[2].rx_bytes == total and infos[2].tx_bytes == 0
        assert infos[0].tx_bytes + infos[1].tx_bytes == total
        assert infos[0].rx_bytes == infos[1].rx_bytes == 0
        assert states[2].revision == 3 and int(ts[2]["step"][0]) == 3
        for step in range(4, 8):
            for t, s in zip(ts, states):
                advance(t, s)
            infos = await sync(comms, states)
            assert tx_rx(infos) == [(0, 0)] * 3, step
            assert [i.revision for i in infos] == [step] * 3
            for k in ts[0]:
                assert ts[0][k].tobytes() == ts[1][k].tobytes() == ts[2][k].tobytes(), (step, k)



# ---- dtypes, byte counts, spreading, inequality --------------------------------------------


NP_DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
             "float16", "float32", "float64"]


async def test_every_dtype_synced_bit_exactly(peers):
    """Every dtype (float16, int16 included), random bit patterns (NaN payloads, -0.0, inf):
    the receiver's bytes equal the sender's exactly; rx = total bytes. (PCCL gives int16,
    float16 and bfloat16 entries size 0, so they are never hashed nor transferred.)"""
    a, b = await peers(2)
    src = {dt: random_bits((37, 3), dt, i) for i, dt in enumerate(NP_DTYPES)}
    dst = {dt: np.zeros((37, 3), dt) for dt in NP_DTYPES}
    sa, sb = pccl.SharedState(src), pccl.SharedState(dst)
    assert [e[1] for e in sa.entries()] == [int(DataType.parse(dt)) for dt in NP_DTYPES]
    infos = await sync([a, b], [sa, sb])
    assert tx_rx(infos) == [(sa.nbytes, 0), (0, sa.nbytes)]
    for dt in NP_DTYPES:
        assert dst[dt].tobytes() == src[dt].tobytes(), dt
    sa.revision = sb.revision = 1
    assert tx_rx(await sync([a, b], [sa, sb])) == [(0, 0), (0, 0)]  # and now they hash equal


@pytest.mark.skipif(torch is None, reason="torch not installed")
async def test_torch_half_bfloat16_and_int16_synced_bit_exactly(peers):
    """torch float16 / bfloat16 / int16 (and float32, 2-D) entries are hashed and transferred;
    each entry differs in a single element so only the dirty entries move."""
    a, b = await peers(2)
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "i16": torch.int16,
              "f32": torch.float32}

    def t(name, seed):
        bits = torch.from_numpy(random_bits((16, 34), np.int16, seed).copy())
        if dtypes[name] == torch.float32:
            return bits.view(torch.float32)
        return bits.view(dtypes[name])

    src = {k: t(k, i) for i, k in enumerate(dtypes)}
    dst = {k: v.clone() for k, v in src.items()}
    dst["f16"].view(torch.int16)[3, 4] ^= 1
    dst["bf16"].view(torch.int16)[0, 0] ^= 0x7FFF
    dst["i16"][15, 32] += 1
    sa, sb = pccl.SharedState(src), pccl.SharedState(dst)
    kinds = {k: DataType(dt) for k, dt, _, _ in sa.entries()}
    assert kinds == {"f16": DataType.FLOAT16, "bf16": DataType.BFLOAT16, "i16": DataType.INT16,
                     "f32": DataType.FLOAT32}
    infos = await sync([a, b], [sa, sb])
    dirty = 3 * 16 * 34 * 2
    assert tx_rx(infos) == [(dirty, 0), (0, dirty)]
    for k in dtypes:
        assert raw(dst[k]) == raw(src[k]), k
        assert dst[k].dtype == dtypes[k]


@pytest.mark.skipif(torch is None, reason="torch not installed")
async def test_numpy_and_torch_holding_the_same_bytes_are_equal(peers):
    """A numpy float16 entry and a torch float16 entry with the same bytes hash equal."""
    a, b = await peers(2)
    x = random_bits(1000, np.float16, 9)
    infos = await sync([a, b], [pccl.SharedState({"k": x}),
                                pccl.SharedState({"k": torch.from_numpy(x.copy())})])
    assert tx_rx(infos) == [(0, 0), (0, 0)]


async def test_multi_piece_entries_of_odd_sizes(peers):
    """Entries larger than one range piece and of sizes that are no multiple of it (nor of
    each other) arrive intact; only the dirty entries are counted."""
    a, b = await peers(2)
    sizes = {"a": PIECE + 1, "b": 2 * PIECE - 3, "c": 5, "d": 0}
    src = {k: random_bits(n, np.uint8, i) for i, (k, n) in enumerate(sizes.items())}
    dst = {k: np.zeros(n, np.uint8) for k, n in sizes.items()}
    dst["c"][:] = src["c"]
    infos = await sync([a, b], [pccl.SharedState(src), pccl.SharedState(dst)])
    dirty = sizes["a"] + sizes["b"]
    assert tx_rx(infos) == [(dirty, 0), (0, dirty)]
    for k in sizes:
        assert dst[k].tobytes() == src[k].tobytes(), k


async def test_ranges_spread_over_several_sources(master, peers):
    """3 up-to-date peers + 1 outdated joiner, a 40 MiB state (5 x 8 MiB ranges + a tail; hashed
    in a worker thread): the joiner's rx = the dirty bytes = the sum of the sources' tx, and at
    least two sources took part."""
    vets = await peers(3)
    n = 5 * PIECE + 12345
    good = random_bits(n, np.uint8, 11)
    xs = [good.copy() for _ in vets]
    small = [np.arange(10, dtype=np.int32) for _ in vets]
    states = [pccl.SharedState({"big": x, "small": s}, 2) for x, s in zip(xs, small)]
    async with pccl.Communicator(master.address, **FAST) as joiner:
        await admit(vets, joiner)
        xj = np.zeros(n, np.uint8)
        sj = pccl.SharedState({"big": xj, "small": np.arange(10, dtype=np.int32)})
        infos = await sync([*vets, joiner], [*states, sj])
        assert infos[3].rx_bytes == n and infos[3].tx_bytes == 0
        txs = [i.tx_bytes for i in infos[:3]]
        assert sum(txs) == n, txs
        assert sum(t > 0 for t in txs) >= 2, txs
        assert all(i.rx_bytes == 0 for i in infos[:3])
        assert xj.tobytes() == good.tobytes() and sj.revision == 2


async def test_inequality_allowed_entries(master, peers):
    """allow_content_inequality: differing contents are not synced between up-to-date peers
    (nor to a drag-along peer that synced before), but a fresh joiner whose revision is behind
    receives them (PCCL sends them with hash 0, so never, not even to a joiner)."""
    vets = await peers(2)
    locals_ = [u8(1, 300), u8(2, 300)]
    shared = [u8(0, 500), u8(0, 500)]
    states = [pccl.SharedState({"shared": s, "local": lo}, 0, allow_content_inequality={"local"})
              for s, lo in zip(shared, locals_)]
    assert tx_rx(await sync(vets, states)) == [(0, 0), (0, 0)]
    assert (locals_[0] == 1).all() and (locals_[1] == 2).all()
    # the second veteran stays behind (drag-along, not fresh): it gets "shared" only
    shared[0][:] = 9
    states[0].revision = 1
    infos = await sync(vets, states)
    assert tx_rx(infos) == [(500, 0), (0, 500)]
    assert (locals_[1] == 2).all() and (shared[1] == 9).all()
    async with pccl.Communicator(master.address, **FAST) as joiner:
        await admit(vets, joiner)
        states[0].revision = states[1].revision = 2
        sh_j, lo_j = u8(0, 500), u8(7, 300)
        sj = pccl.SharedState({"shared": sh_j, "local": lo_j}, allow_content_inequality=["local"])
        infos = await sync([*vets, joiner], [*states, sj])
        assert infos[2].rx_bytes == 800, infos
        assert infos[0].tx_bytes + infos[1].tx_bytes == 800
        assert (sh_j == 9).all() and lo_j[0] in (1, 2) and (lo_j == lo_j[0]).all()
        assert (locals_[0] == 1).all() and (locals_[1] == 2).all()
        # now synced (no longer fresh): its own local content is kept from here on
        lo_j[:] = 8
        for s in [*states, sj]:
            s.revision = 3
        assert tx_rx(await sync([*vets, joiner], [*states, sj])) == [(0, 0)] * 3
        assert (lo_j == 8).all()


async def test_fresh_peer_already_up_to_date_keeps_its_inequality_entries(peers):
    """A never-synced peer at the target revision is not outdated: it keeps its own
    inequality-allowed entry, even when it fetches a drifted strict entry."""
    comms = await peers(3)
    strict = [u8(1, 64), u8(1, 64), u8(0, 64)]
    loose = [u8(1, 32), u8(2, 32), u8(3, 32)]
    states = [pccl.SharedState({"s": s, "l": lo}, 5, allow_content_inequality=["l"])
              for s, lo in zip(strict, loose)]
    infos = await sync(comms, states)
    assert infos[2].rx_bytes == 64 and infos[0].tx_bytes + infos[1].tx_bytes == 64
    assert (strict[2] == 1).all() and [int(lo[0]) for lo in loose] == [1, 2, 3]
