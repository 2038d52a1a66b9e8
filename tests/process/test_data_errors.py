"""Issue 45, items 2 and 5, in real processes: a NaN in one peer's data is a group matter.
Three peers, one with a NaN: its sparse average fails on every peer within 1 s (before, that
peer raised before the all-gather and the others waited in it for ever) and the next one
agrees everywhere; a quantized all-reduce with the NaN gives NaN, the same bytes on every
peer, never finite numbers (the stated policy: the NaN's quantization block decodes NaN)."""

from __future__ import annotations

import json

import pytest

from tests.process.procs import HERE, spawn, start_master

pytestmark = pytest.mark.timeout(90)

PEER = str(HERE / "data_error_peer.py")


async def test_a_nan_on_one_peer_fails_or_poisons_the_collective_on_every_peer(procs):
    _, port = await start_master(procs)
    peers = []
    for i in range(3):
        procs.append(p := await spawn(f"peer{i}", PEER, f"127.0.0.1:{port}", "3", str(i), "1"))
        peers.append(p)
    events = [[json.loads(await p.line(timeout=60)) for _ in range(3)] for p in peers]
    for evs in events:
        sparse, ok, quant = evs
        assert sparse["event"] == "sparse" and sparse["raised"], sparse
        assert sparse["type"] == "InvalidUsageError" and sparse["seconds"] < 1.0, sparse
        assert ok["event"] == "sparse_ok" and quant["event"] == "quant"
        assert 0 < quant["nans"] < 200_003 and quant["finite"] + quant["nans"] == 200_003
    assert len({evs[1]["digest"] for evs in events}) == 1  # the clean average agrees
    assert len({evs[2]["digest"] for evs in events}) == 1  # the same bytes, NaN included
    for p in peers:
        assert await p.proc.wait() == 0, p.name
