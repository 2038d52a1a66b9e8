"""Issue 33, point 3 (begun): the staging of device tensors through host twins, on the CPU
(the logic is device-agnostic; "cpu" is added to the staged devices for the test)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pccl_aio as pccl  # noqa: E402
from pccl_aio._peer.core import staging  # noqa: E402

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def cpu_staged(monkeypatch):
    monkeypatch.setattr(staging, "DEVICES", frozenset({"cuda", "cpu"}))


def test_a_twin_is_loaded_stored_back_only_on_success_and_reused(cpu_staged):
    pool = staging.HostPool()
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    st = staging.Stages(pool)
    host = st.host(x, load=True, out=True)
    assert host.data_ptr() != x.data_ptr() and torch.equal(host, x)
    host.mul_(10)
    st.done(False)  # a failed collective: the tensor as it was
    assert torch.equal(x, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    st = staging.Stages(pool)
    again = st.host(x, load=True, out=True)
    assert again.data_ptr() == host.data_ptr()  # the same host buffer, reused
    again.mul_(10)
    st.done(True)
    assert torch.equal(x, 10 * torch.arange(6, dtype=torch.float32).reshape(2, 3))


def test_inputs_are_loaded_outputs_not_and_only_outputs_stored(cpu_staged):
    st = staging.Stages(staging.HostPool())
    src, dst = torch.ones(4), torch.full((4,), 7.0)
    hs, hd = st.host(src, load=True, out=False), st.host(dst, load=False, out=True)
    hs.fill_(2.0)
    hd.fill_(3.0)
    st.done(True)
    assert (src == 1).all() and (dst == 3).all()


def test_cpu_tensors_and_other_objects_are_not_staged_and_other_devices_are_refused():
    import numpy as np

    assert not staging.needs(torch.ones(2)) and not staging.needs(np.ones(2))
    with pytest.raises(pccl.InvalidUsageError, match="meta"):
        staging.needs(torch.empty(2, device="meta"))
    st = staging.Stages(staging.HostPool())
    x = torch.ones(2)
    assert st.host(x, load=True, out=True) is x and not st
