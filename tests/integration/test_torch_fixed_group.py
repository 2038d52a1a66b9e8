"""The by-name group (``dist.init_process_group("pccl_aio")``) in one process: ranks met
through a torch store (``rendezvous.create``, one thread per rank), torch's ranks mapped onto a
ring in another order (every collective with a root or block order against what torch's
semantics give; point-to-point, all-to-all, reduce and coalescing too), the typed errors of a
bad rank or a rank that never comes, and rank 0's teardown waiting for the others to leave
before closing the master."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import HashStore  # noqa: E402

import pccl_aio as pccl  # noqa: E402
from pccl_aio import blocking  # noqa: E402
from pccl_aio._torch import rendezvous  # noqa: E402
from pccl_aio._torch.fixed import FixedGroup  # noqa: E402
from tests.helpers import FAST  # noqa: E402

pytestmark = pytest.mark.timeout(60)

WORLD = 3


def _rotated_groups(address: str) -> list[FixedGroup]:
    """Three communicators admitted one after another (ring: admission order), given torch
    ranks in another order: rank r at ring position ``(2, 0, 1)[r]``; in rank order."""
    comms = [blocking.Communicator(address, **FAST) for _ in range(WORLD)]
    comms[0].connect()
    with ThreadPoolExecutor(WORLD) as pool:
        for i in range(1, WORLD):
            joining = pool.submit(comms[i].connect)
            waits = [pool.submit(c.wait_for_peers, i + 1, timeout=20) for c in comms[:i]]
            joining.result(timeout=20)
            for w in waits:
                w.result(timeout=20)
    ring = comms[0].ranks
    order = [ring[2], ring[0], ring[1]]
    groups = sorted((FixedGroup(c, order) for c in comms), key=lambda g: g.rank())
    assert [g.position for g in groups] == [(2, 0, 1)] * WORLD
    assert [g.comm.rank for g in groups] == [2, 0, 1]
    return groups


def met(world: int = WORLD) -> list[FixedGroup]:
    """``world`` by-name groups met through one store (one thread per rank), in rank order."""
    store = HashStore()
    with ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(rendezvous.create, store, r, world, timedelta(seconds=30))
                   for r in range(world)]
        return sorted((f.result(timeout=40) for f in futures), key=lambda g: g.rank())


def _all(works: list) -> None:
    for w in works:
        assert w.wait()


def _root(r: int) -> dist.BroadcastOptions:
    opts = dist.BroadcastOptions()
    opts.rootRank = r
    return opts


def test_torch_ranks_on_a_ring_in_another_order_give_torchs_results():
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0, **FAST) as master:
        groups = _rotated_groups(master.address)
        try:
            xs = [torch.arange(4.0) + 10 * r for r in range(WORLD)]
            everyone = torch.cat(xs)

            outs = [torch.empty(4 * WORLD) for _ in groups]
            _all([g.all_gather_single(o, x) for g, o, x in zip(groups, outs, xs)])
            assert all(torch.equal(o, everyone) for o in outs)
            lists = [[torch.empty(4) for _ in range(WORLD)] for _ in groups]
            _all([g.allgather([ls], [x]) for g, ls, x in zip(groups, lists, xs)])
            assert all(torch.equal(torch.cat(ls), everyone) for ls in lists)
            outs = [torch.empty(4 * WORLD) for _ in groups]
            _all([g.allgather_into_tensor_coalesced([o], [x]) for g, o, x in zip(groups, outs, xs)])
            assert all(torch.equal(o, everyone) for o in outs)

            for root in (0, 2):
                bs = [x.clone() for x in xs]
                _all([g.broadcast([b], _root(root)) for g, b in zip(groups, bs)])
                assert all(torch.equal(b, xs[root]) for b in bs), root

            parts = [torch.full((4,), 100.0 + r) for r in range(WORLD)]
            got = [torch.empty(4) for _ in groups]
            _all([g.scatter([o], [parts] if g.rank() == 1 else [], _root(1))
                  for g, o in zip(groups, got)])
            assert all(torch.equal(o, parts[r]) for r, o in enumerate(got))
            gathered = [[torch.empty(4) for _ in range(WORLD)] for _ in groups]
            _all([g.gather([ls] if g.rank() == 2 else [], [x], _root(2))
                  for g, ls, x in zip(groups, gathered, xs)])
            assert torch.equal(torch.cat(gathered[2]), everyone)

            ys = [torch.arange(2.0 * WORLD) * (r + 1) for r in range(WORLD)]
            total = sum(ys)
            for how in ("single", "list", "coalesced"):
                rs = [torch.empty(2) for _ in groups]
                if how == "single":
                    ws = [g.reduce_scatter_single(o, y) for g, o, y in zip(groups, rs, ys)]
                elif how == "list":
                    ws = [g.reduce_scatter([o], [list(y.chunk(WORLD))])
                          for g, o, y in zip(groups, rs, ys)]
                else:
                    ws = [g.reduce_scatter_tensor_coalesced([o], [y])
                          for g, o, y in zip(groups, rs, ys)]
                _all(ws)
                assert all(torch.equal(o, total[2 * r:2 * r + 2]) for r, o in enumerate(rs)), how

            sums = [x.clone() for x in xs]
            _all([g.allreduce([s]) for g, s in zip(groups, sums)])
            assert all(torch.equal(s, sum(xs)) for s in sums)
            with pytest.raises(pccl.InvalidUsageError, match="root 3"):
                groups[0].broadcast([xs[0]], _root(3))
        finally:
            for g in groups:
                g.close()
                g.comm.close()


def test_point_to_point_all_to_all_reduce_and_coalescing_on_a_rotated_ring():
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0, **FAST) as master:
        groups = _rotated_groups(master.address)
        try:
            # send/recv by torch rank: r sends r * 10 + [0..4] to r + 1
            got = [torch.empty(5, dtype=torch.int64) for _ in groups]
            ws = []
            for g in groups:
                r = g.rank()
                ws.append(g.send([torch.arange(5) + 10 * r], (r + 1) % WORLD, 3))
                ws.append(g.recv([got[r]], (r - 1) % WORLD, 3))
            _all(ws)
            assert all(torch.equal(got[r], torch.arange(5) + 10 * ((r - 1) % WORLD))
                       for r in range(WORLD))
            # a receive from any rank names the sender's torch rank
            anyone = groups[0].recv_anysource([torch.empty(2)], 9)
            _all([groups[2].send([torch.ones(2)], 0, 9)])
            assert anyone.wait() and anyone._source_rank() == 2
            # all_to_all_single, unequal splits: rank r sends r + j + 1 rows to rank j
            ins = [torch.cat([torch.full((r + j + 1,), 100.0 * r + j) for j in range(WORLD)])
                   for r in range(WORLD)]
            outs = [torch.empty(sum(r + j + 1 for j in range(WORLD))) for r in range(WORLD)]
            _all([g.alltoall_base(outs[g.rank()], ins[g.rank()],
                                  [g.rank() + j + 1 for j in range(WORLD)],
                                  [g.rank() + j + 1 for j in range(WORLD)]) for g in groups])
            for r in range(WORLD):
                want = torch.cat([torch.full((j + r + 1,), 100.0 * j + r) for j in range(WORLD)])
                assert torch.equal(outs[r], want), r
            # reduce to torch rank 2: its tensor holds the sum, the others' are untouched
            ts = [torch.full((3,), float(r + 1)) for r in range(WORLD)]
            opts = dist.ReduceOptions()
            opts.rootRank = 2
            _all([g.reduce([ts[g.rank()]], opts) for g in groups])
            assert torch.equal(ts[2], torch.full((3,), 6.0))
            assert all(torch.equal(ts[r], torch.full((3,), float(r + 1))) for r in (0, 1))
            # coalescing: the works launched in between are waited for as one
            sums = [[torch.full((2,), float(r + i)) for i in range(3)] for r in range(WORLD)]
            for g in groups:
                g._start_coalescing(torch.device("cpu"))
                for t in sums[g.rank()]:
                    g.allreduce([t])
            joined = [g._end_coalescing(torch.device("cpu")) for g in groups]
            _all(joined)
            assert all(torch.equal(sums[r][i], torch.full((2,), 3.0 + 3 * i))
                       for r in range(WORLD) for i in range(3))
            with pytest.raises(pccl.InvalidUsageError, match="without _start_coalescing"):
                groups[0]._end_coalescing(torch.device("cpu"))
        finally:
            for g in groups:
                g.close()
                g.comm.close()


def test_ranks_meet_through_the_store_and_rank_0_closes_the_master_after_the_others():
    store = HashStore()
    with ThreadPoolExecutor(WORLD) as pool:
        futures = [pool.submit(rendezvous.create, store, r, WORLD, timedelta(seconds=30))
                   for r in reversed(range(WORLD))]
        groups = sorted((f.result(timeout=40) for f in futures), key=lambda g: g.rank())
    assert [(g.rank(), g.size()) for g in groups] == [(r, WORLD) for r in range(WORLD)]
    assert len({g.order for g in groups}) == 1 and groups[0].master is not None
    assert all(g.master is None for g in groups[1:])
    address = bytes(store.get("pccl_aio/0/master")).decode()
    assert address == groups[0].master.address and address.startswith("127.0.0.1:")
    sums = [torch.full((3,), float(r)) for r in range(WORLD)]
    _all([g.allreduce([s]) for g, s in zip(groups, sums)])
    assert all(torch.equal(s, torch.full((3,), 3.0)) for s in sums)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(groups[0].shutdown)  # lingers: the others are still members
        assert not first.done() and not groups[0].comm.closed
        for g in groups[1:]:
            g.shutdown()
        started = time.monotonic()
        first.result(timeout=20)
    assert time.monotonic() - started < 10 and groups[0].comm.closed
    _refused(address)


def test_tls_from_the_environment_for_master_peers_and_links(tmp_path, monkeypatch):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(tmp_path / "peer.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "peer.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    for name, file in zip(rendezvous.TLS_ENV, ("peer.pem", "peer.key", "ca.pem")):
        monkeypatch.setenv(name, str(tmp_path / file))
    groups = met()
    try:
        assert all(g.comm.config.ssl is not None and g.comm.config.ssl_server is not None
                   for g in groups)
        sums = [torch.full((3,), float(r)) for r in range(WORLD)]
        _all([g.allreduce([s]) for g, s in zip(groups, sums)])
        assert all(torch.equal(s, torch.full((3,), 3.0)) for s in sums)
        plain = blocking.Communicator(groups[0].master.address, **FAST)  # no TLS: refused
        with pytest.raises(pccl.MasterConnectionError):
            plain.connect(attempts=1, timeout=5)
        plain.close()
    finally:
        with ThreadPoolExecutor(WORLD) as pool:
            list(pool.map(lambda g: g.shutdown(), groups))
    monkeypatch.delenv(rendezvous.TLS_ENV[1])
    with pytest.raises(pccl.InvalidUsageError, match="both"):
        rendezvous.tls_from_env()


def _refused(address: str) -> None:
    host, port = address.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), 2):
        pass


@pytest.mark.parametrize(("rank", "world"), [(3, 3), (-1, 2), (0, 1)])
def test_a_bad_rank_or_world_size_is_refused_before_anything_starts(rank, world):
    store = HashStore()
    with pytest.raises(pccl.InvalidUsageError, match=r"rank|world_size"):
        rendezvous.create(store, rank, world, timedelta(seconds=5))
    assert not store.check(["pccl_aio/ranks"])


def test_ranks_that_never_come_time_out_typed_and_nothing_is_left_running():
    store = HashStore()
    started = time.monotonic()
    with pytest.raises(pccl.PcclTimeoutError, match=r"1 of 2 ranks.*ranks \[1\]"):
        rendezvous.create(store, 0, 2, timedelta(seconds=1.5))
    assert time.monotonic() - started < 10
    _refused(bytes(store.get("pccl_aio/0/master")).decode())  # rank 0's master: closed
    with pytest.raises(pccl.PcclTimeoutError, match="rank 0's master address"):
        rendezvous.create(HashStore(), 1, 2, timedelta(seconds=0.5))


def test_a_collective_not_done_within_the_groups_timeout_raises_then_can_still_end():
    """gloo's rule on the by-name group: ``Work.wait()`` gives up after the group's timeout
    (``init_process_group(timeout=)``) with a ``PcclTimeoutError``; the collective goes on
    and ends once the others call it (PyTorch's test_barrier_timeout_*)."""
    groups = met()
    try:
        assert groups[0].timeout == 30.0
        groups[0].timeout = 1.0
        work = groups[0].barrier()
        started = time.monotonic()
        with pytest.raises(pccl.PcclTimeoutError, match=r"within 1 s \(its wait's timeout"):
            work.wait()
        assert time.monotonic() - started >= 0.9
        others = [g.barrier() for g in groups[1:]]
        assert all(w.wait() for w in others) and work.wait(timedelta(seconds=20))
    finally:
        with ThreadPoolExecutor(WORLD) as pool:
            list(pool.map(lambda g: g.shutdown(), groups))
