"""``pccl_aio.torch`` without a run: the op mapping, the Work objects (typed errors from
``wait()``, futures completed with nobody waiting), the backend registration and the device
check, before anything is sent."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import pccl_aio as pccl  # noqa: E402
import pccl_aio.torch as pt  # noqa: E402
from pccl_aio._torch.work import Completions, Work  # noqa: E402

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
    """A collective in flight as ``Work`` sees one: ``wait()`` blocks, then returns or raises."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.go, self.error = threading.Event(), error

    def wait(self) -> None:
        assert self.go.wait(10)
        if self.error is not None:
            raise self.error


def test_wait_raises_the_typed_error_and_the_future_completes_unwaited():
    completions = Completions()
    ok, lost = _Handle(), _Handle(pccl.PeerLostError("peer 3 left the run"))
    works = [Work([ok], lambda: "done", completions), Work([lost], lambda: None, completions)]
    futures = [w.get_future() for w in works]
    assert not any(f.done() for f in futures)
    ok.go.set()
    lost.go.set()
    assert works[0].wait() and futures[0].wait() == "done" and works[0].is_success()
    with pytest.raises(pccl.PeerLostError, match="peer 3"):
        works[1].wait()
    assert futures[1].done() and not works[1].is_success()
    assert isinstance(works[1].exception(), pccl.PeerLostError)
    completions.close()


def test_importing_registers_the_backend_and_only_init_process_group_makes_one():
    assert "pccl_aio" in dist.Backend.backend_list
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.init_process_group("pccl_aio", store=dist.HashStore(), rank=0, world_size=1)


class _Comm:
    rank, peer_group_world_size = 0, 2

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
