"""The torch group launches without blocking the caller (DDP's autograd thread goes on
computing): a launch is posted to the communicator's loop, its error surfaces at the work's
``wait()``, and the works complete on the loop thread without anyone waiting."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import pccl_aio as pccl  # noqa: E402
import pccl_aio.torch as pt  # noqa: E402
from pccl_aio import blocking  # noqa: E402
from tests.helpers import FAST, blocking_pair  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_posted_launches_from_one_thread_for_both_ranks_complete_unwaited():
    with blocking.Master("127.0.0.1", 0, admission_interval=0.0) as m:
        comms = blocking_pair(m.address)
        groups = [pt.ProcessGroup(c) for c in comms]
        try:
            # one thread launches both ranks' collectives: nothing blocks, so no deadlock
            xs = [[torch.full((4097,), float(r + 1) * (i + 1)) for i in range(6)]
                  for r in range(2)]
            works = [g.allreduce(x) for g, x in zip(groups, xs)]
            futs = [w.get_future() for w in works]
            sums = [torch.tensor([1.0]), torch.tensor([2.0])]
            avg = dist.AllreduceOptions()
            avg.reduceOp = dist.ReduceOp.AVG
            more = [g.allreduce([s], avg) for g, s in zip(groups, sums)]
            for f in futs:
                f.wait()  # (completed on the loop thread; no one called Work.wait())
            assert all(w.wait() for w in more)
            for x in xs:
                assert [float(t[0]) for t in x] == [3.0 * (i + 1) for i in range(6)]
            assert [float(s) for s in sums] == [1.5, 1.5]
        finally:
            for g, c in zip(groups, comms):
                g.close()
                c.close()


def test_a_launch_error_surfaces_at_wait_not_at_the_call():
    with (blocking.Master("127.0.0.1", 0, admission_interval=0.0) as m,
          blocking.Communicator(m.address, **FAST) as alone):
        alone.connect()
        group = pt.ProcessGroup(alone)
        try:
            work = group.allreduce([torch.ones(3)])  # (returns: the launch is posted)
            with pytest.raises(pccl.TooFewPeersError):
                work.wait()
            assert work.is_completed() and not work.is_success()
            assert isinstance(work.exception(), pccl.TooFewPeersError)
        finally:
            group.close()
