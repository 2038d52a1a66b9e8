"""``pccl_aio.torch`` without a run: the op mapping, the Work objects (typed errors from
``wait()``, futures completed with nobody waiting), the backend registration and the device
check, before anything is sent."""

from __future__ import annotations

from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import pccl_aio as pccl  # noqa: E402
import pccl_aio.torch as pt  # noqa: E402
from pccl_aio._torch.work import Completions, Work  # noqa: E402
from pccl_aio._torch.work import joined as joined_works  # noqa: E402

pytestmark = pytest.mark.timeout(30)


def test_reduce_ops_map_and_the_others_are_refused():
    assert pt.reduce_op(dist.ReduceOp.SUM) is pccl.ReduceOp.SUM
    assert pt.reduce_op(dist.ReduceOp.PRODUCT) is pccl.ReduceOp.PROD
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    assert pt.reduce_op(opts) is pccl.ReduceOp.AVG
    with pytest.raises(pccl.InvalidUsageError, match="not supported"):
        pt.reduce_op(dist.ReduceOp.BAND)


class _Handle:
    """A collective in flight as ``Work`` sees one: ``end()`` (here on the test's thread, the
    loop thread in use) runs the done callbacks; ``result()`` then returns or raises."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error, self.ended = error, False
        self.callbacks: list = []

    def add_done_callback(self, fn) -> None:
        self.callbacks.append(fn)

    def end(self) -> None:
        self.ended = True
        for fn in self.callbacks:
            fn(self)

    def result(self) -> None:
        assert self.ended, "result() before the end"
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("inline", [False, True])
def test_wait_raises_the_typed_error_and_the_future_completes_unwaited(inline):
    completions = Completions()
    ok, lost = _Handle(), _Handle(pccl.PeerLostError("peer 3 left the run"))
    works = [Work([ok], lambda: "done", completions, inline),
             Work([lost], lambda: None, completions, inline)]
    futures = [w.get_future() for w in works]
    assert not any(f.done() for f in futures)
    ok.end()
    lost.end()
    assert works[0].wait() and futures[0].wait() == "done" and works[0].is_success()
    with pytest.raises(pccl.PeerLostError, match="peer 3"):
        works[1].wait()
    assert futures[1].done() and not works[1].is_success()
    assert isinstance(works[1].exception(), pccl.PeerLostError)
    completions.close()


def test_a_work_of_several_collectives_completes_when_the_last_ended():
    completions = Completions()
    a, b = _Handle(), _Handle()
    fut = Work([a, b], lambda: "both", completions, True).get_future()
    a.end()
    assert not fut.done()
    b.end()
    assert fut.done() and fut.wait() == "both"
    completions.close()


def test_wait_with_a_timeout_raises_if_it_has_not_ended_and_later_succeeds():
    completions = Completions()
    h = _Handle()
    work = Work([h], lambda: "late", completions, True)
    with pytest.raises(pccl.PcclTimeoutError, match=r"within 0\.05 s"):
        work.wait(timedelta(seconds=0.05))
    h.end()
    assert work.wait(timedelta(seconds=5)) and work.wait(timedelta(0))
    joined = joined_works([work, Work([], lambda: None, completions)], completions)
    assert joined.wait(1.0) and joined.is_success()
    completions.close()


def test_importing_registers_the_backend_and_a_world_of_one_is_refused():
    assert "pccl_aio" in dist.Backend.backend_list
    with pytest.raises(pccl.InvalidUsageError, match=r"world_size must be an int >= 2"):
        dist.init_process_group("pccl_aio", store=dist.HashStore(), rank=0, world_size=1)


class _Comm:
    rank, peer_group_world_size, peer_id, ranks = 0, 2, 7, [7, 9]

    def all_reduce_async(self, *a, **kw):
        raise AssertionError("nothing may be sent")


def test_a_tensor_off_the_cpu_is_refused_before_anything_is_sent():
    group = pt.ProcessGroup(_Comm())  # type: ignore[arg-type]
    try:
        with pytest.raises(pccl.InvalidUsageError, match="meta"):
            group.allreduce([torch.empty(4, device="meta")])
        assert (group.rank(), group.size(), group.getBackendName()) == (0, 2, "pccl_aio")
    finally:
        group.close()


def test_an_unconnected_communicator_has_no_group():
    class Unconnected(_Comm):
        rank = -1

    with pytest.raises(pccl.InvalidUsageError, match="connect"):
        pt.ProcessGroup(Unconnected())  # type: ignore[arg-type]


def test_the_local_group_is_a_world_of_one_whose_collectives_are_local_copies():
    g = pt.local_group()
    assert g is pt.local_group() and (g.rank(), g.size()) == (0, 1)
    x = torch.arange(6.0)
    assert g.allreduce([x]).wait() and (x == torch.arange(6.0)).all()
    out = [[torch.zeros(6)]]
    g.allgather(out, [x]).wait()
    flat = torch.zeros(6)
    g.all_gather_single(flat, x).wait()
    rs = torch.zeros(6)
    g.reduce_scatter([rs], [[x]]).wait()
    assert all((t == x).all() for t in (out[0][0], flat, rs))
    assert g.barrier().is_completed()


def _bucket_layouts(net: torch.nn.Module, iters: int) -> list[list[tuple[int, tuple]]]:
    layouts: list[list[tuple[int, tuple]]] = []

    def hook(_, bucket):  # (no annotations: DDP checks them, and they are strings here)
        layouts[-1].append((bucket.index(), tuple(tuple(p.shape) for p in bucket.parameters())))
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    net.register_comm_hook(None, hook)
    for _ in range(iters):
        layouts.append([])
        net(torch.randn(4, 16)).sum().backward()
    return layouts


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def test_ddp_on_the_local_group_keeps_one_bucket_layout_from_the_first_iteration():
    """Why ``pt.DistributedDataParallel`` sets ``find_unused_parameters``: by default DDP lays
    its buckets out anew after the first iteration, so a joiner's first step would meet the
    others' buckets with other parameters at each offset."""
    default = torch.nn.parallel.DistributedDataParallel(
        _model(), process_group=pt.local_group(), bucket_cap_mb=0.001)
    first, *later = _bucket_layouts(default, 3)
    assert first != later[0]  # (what would go wrong)
    fixed = torch.nn.parallel.DistributedDataParallel(
        _model(), process_group=pt.local_group(), bucket_cap_mb=0.001,
        find_unused_parameters=True)
    first, *later = _bucket_layouts(fixed, 3)
    assert len(first) > 1 and all(layout == first for layout in later)


def test_distributed_data_parallel_refuses_what_it_sets_and_needs_a_pccl_group():
    for kw in ({"process_group": pt.local_group()}, {"find_unused_parameters": False}):
        with pytest.raises(pccl.InvalidUsageError, match="is set by"):
            pt.DistributedDataParallel(_model(), **kw)
    with pytest.raises(pccl.InvalidUsageError, match="must be a pccl_aio"):
        pt.DistributedDataParallel(_model(), group=pt.local_group())  # type: ignore[arg-type]
    if not dist.is_initialized():
        with pytest.raises(pccl.InvalidUsageError, match="init_process_group"):
            pt.DistributedDataParallel(_model())


def failed(exc: BaseException) -> Work:
    """A work already failed with ``exc``."""

    def finish() -> None:
        raise exc

    return Work([], finish, None)


def test_a_failed_work_fails_torchs_future_as_an_error_and_ddp_backward_raises():
    """The cause of the survivors' segfault: a Python ``Future.set_exception`` stores the
    exception as the future's *value*, which DDP's C++ reducer took for the bucket's tensors
    (an empty tensor list read at index 0). The future of a failed work now holds an error
    torch's C++ side sees: ``backward()`` raises, naming the typed error, every time."""
    work = failed(pccl.PeerLostError("peer 3 left the run"))
    with pytest.raises(pccl.PeerLostError, match="peer 3"):
        work.wait()
    with pytest.raises(RuntimeError, match="PeerLostError: peer 3"):
        work.get_future().wait()
    assert isinstance(work.exception(), pccl.PeerLostError) and not work.is_success()

    class Failing(pt.LocalGroup):
        def allreduce(self, tensors, opts=None):
            return failed(pccl.PeerLostError("peer 3 left the run"))

    net = torch.nn.parallel.DistributedDataParallel(_model(), process_group=Failing())
    for _ in range(3):
        with pytest.raises(RuntimeError, match="PeerLostError: peer 3"):
            net(torch.randn(4, 16)).sum().backward()


def test_a_group_is_its_membership_when_made_and_says_when_that_changed():
    comm = _Comm()
    group = pt.ProcessGroup(comm)  # type: ignore[arg-type]
    try:
        assert group.members == (7, 9) and not group.membership_changed
        lost = pccl.PeerLostError("all-reduce tag 1 aborted")
        assert group._typed(lost) is lost  # (nothing changed: the error as it is)
        comm.ranks = [7]  # peer 9 lost: the group keeps its size, torch's C++ side its own
        assert group.membership_changed and (group.rank(), group.size()) == (0, 2)
        typed = group._typed(lost)
        assert isinstance(typed, pccl.MembershipChangedError) and typed.__cause__ is lost
        assert "renew_process_group" in str(typed)
        comm.ranks, comm.peer_id = [7, 9], 11  # rejoined as a new member under a new id
        assert group.membership_changed
    finally:
        group.close()


@pytest.mark.parametrize(("call", "args", "match"), [
    ("send", ([torch.zeros(2)], 0, 0), "not another rank"),  # (this rank itself)
    ("send", ([torch.zeros(2)], 2, 0), "not another rank"),
    ("recv", ([torch.zeros(2)], -1, 0), "not another rank"),
    ("send", ([torch.zeros(2), torch.zeros(2)], 1, 0), "one tensor"),
    ("alltoall", ([torch.zeros(1)], [torch.zeros(1)]), "takes 2 tensors"),
    ("alltoall_base", (torch.zeros(3), torch.zeros(3), [], []), "equal blocks"),
    ("alltoall_base", (torch.zeros(3), torch.zeros(3), [1, 1], [2, 1]), "split sizes"),
    ("reduce", ([torch.zeros(2)], type("Opts", (), {"rootRank": 5})()), "root 5"),
])
def test_bad_arguments_raise_before_anything_is_sent(call, args, match):
    group = pt.ProcessGroup(_Comm())  # type: ignore[arg-type]  # (it sends nothing)
    try:
        with pytest.raises(pccl.InvalidUsageError, match=match):
            getattr(group, call)(*args)
    finally:
        group.close()
