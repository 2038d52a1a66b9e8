"""Replacing a lost rank of the by-name group in one process (``_torch/reconfigure.py``;
the SIGKILL and the DeviceMesh are ``tests/process/test_torch_replace.py``'s): a rank made
to join at reconfigure refuses every call until then, the survivors and it reconfigure and
every collective gives torch's results in rank order again; handles that do not fit are
refused on every rank, typed, and leave the group working; a replacement that never comes
is a ``PcclTimeoutError``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")

import pccl_aio as pccl  # noqa: E402
import pccl_aio.torch as pt  # noqa: E402
from pccl_aio._torch.fixed import FixedGroup  # noqa: E402
from pccl_aio._torch.reconfigure import Handle, reconfigure  # noqa: E402
from tests.integration.test_torch_fixed_group import met  # noqa: E402

pytestmark = pytest.mark.timeout(90)

WORLD = 3


@pytest.fixture
def world():
    groups = met(WORLD)
    yield groups
    for g in groups[1:]:
        g.close()
        g.comm.close()
    groups[0].linger = 0.0
    groups[0].shutdown()


def _gathered(groups: list[FixedGroup]) -> list[torch.Tensor]:
    outs = [torch.empty(2 * WORLD) for _ in groups]
    works = [g.all_gather_single(o, torch.full((2,), float(g.rank())))
             for g, o in zip(groups, outs)]
    for w in works:
        assert w.wait()
    return outs


def _reconfigured(groups: list[FixedGroup], uuids: list[int], handles: list[str],
                  timeout: float = 30) -> list[BaseException | None]:
    def one(g: FixedGroup, uuid: int) -> BaseException | None:
        try:
            reconfigure(g, uuid, handles, timeout)
        except BaseException as e:  # (returned to the test)
            return e
        return None

    with ThreadPoolExecutor(len(groups)) as pool:
        return list(pool.map(one, groups, uuids))


def test_a_replacement_takes_the_lost_rank_and_collectives_work_in_rank_order(world):
    lost = world[2]
    lost.close()
    lost.comm.close()  # (rank 2 leaves; the process test SIGKILLs it)
    new = FixedGroup(None, rank=2, size=WORLD, timeout=30)
    assert not new.joined and (new.rank(), new.size()) == (2, WORLD)
    with pytest.raises(pccl.InvalidUsageError, match="joins its group at reconfigure"):
        new.allreduce([torch.ones(2)])
    with pytest.raises(pccl.InvalidUsageError, match="joins its group at reconfigure"):
        new.broadcast([torch.ones(2)])
    with pytest.raises(pccl.InvalidUsageError, match="joins its group at reconfigure"):
        new.send([torch.ones(2)], 0, 0)
    groups = [world[0], world[1], new]
    handles = [g.get_reconfigure_handle() for g in groups]
    assert Handle.parse(handles[2]).master == ""  # (it knows no master yet)
    assert Handle.parse(handles[0]).master == world[0].address
    assert _reconfigured(groups, [7] * WORLD, handles) == [None] * WORLD
    assert new.joined and new.comm.peer_id not in lost.order
    assert all(g.order == groups[0].order for g in groups)
    expected = torch.arange(WORLD, dtype=torch.float32).repeat_interleave(2)
    assert all(torch.equal(o, expected) for o in _gathered(groups))
    sums = [torch.full((3,), float(g.rank())) for g in groups]
    for w in [g.allreduce([s]) for g, s in zip(groups, sums)]:
        assert w.wait()
    assert all(torch.equal(s, torch.full((3,), 3.0)) for s in sums)
    new.close()
    new.comm.close()


@pytest.mark.parametrize("bad", ["garbage", "pccl_aio;1;x;m;n", "pccl_aio;2;0;m;n", 5])
def test_a_malformed_handle_is_refused_before_anything_is_sent(world, bad):
    handles = [g.get_reconfigure_handle() for g in world]
    with pytest.raises(pccl.InvalidUsageError, match="not a pccl_aio reconfigure handle"):
        reconfigure(world[0], 1, [bad, *handles[1:]], 5)


def test_handles_that_do_not_fit_are_refused_and_the_group_keeps_working(world):
    handles = [g.get_reconfigure_handle() for g in world]
    g = world[0]
    with pytest.raises(pccl.InvalidUsageError, match="one handle per rank"):
        reconfigure(g, 1, handles[:2], 5)
    with pytest.raises(pccl.InvalidUsageError, match="one handle per rank"):
        reconfigure(g, 1, [handles[1], handles[0], handles[2]], 5)  # (a list: rank order)
    with pytest.raises(pccl.InvalidUsageError, match="not this process's"):
        reconfigure(world[1], 1, [handles[0], world[2].get_reconfigure_handle()
                                  .replace(";1;", ";1;", 1).replace(";2;", ";1;"),
                                  handles[2]], 5)
    other = str(Handle(1, "127.0.0.1:1", Handle.parse(handles[1]).nonce))
    with pytest.raises(pccl.InvalidUsageError, match="one master"):
        reconfigure(world[1], 1, [handles[0], other, handles[2]], 5)
    with pytest.raises(pccl.InvalidUsageError, match=r"for a group of dist\.init_process_group"):
        pt.reconfigure_handle(object())
    # ranks that disagree on the uuid: every one of them raises, the group stays as it was
    errors = _reconfigured(world, [1, 1, 2], set(handles))
    assert all(isinstance(e, pccl.InvalidUsageError) and "different uuids" in str(e)
               for e in errors), errors
    expected = torch.arange(WORLD, dtype=torch.float32).repeat_interleave(2)
    assert all(torch.equal(o, expected) for o in _gathered(world))


def test_a_replacement_that_never_comes_times_out_typed(world):
    lost = world[2]
    lost.close()
    lost.comm.close()
    absent = FixedGroup(None, rank=2, size=WORLD)
    handles = [world[0].get_reconfigure_handle(), world[1].get_reconfigure_handle(),
               absent.get_reconfigure_handle()]
    errors = _reconfigured(world[:2], [3, 3], handles, timeout=1.5)
    assert all(isinstance(e, pccl.PcclTimeoutError) for e in errors), errors
    absent.close()
