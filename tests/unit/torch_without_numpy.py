"""pccl_aio with torch and no numpy; run by ``test_torch_without_numpy.py`` and by CI.

numpy is made unimportable before anything imports it. A master and two communicators on
127.0.0.1 (one event loop) all-reduce float32 and bfloat16 torch tensors, in place and out of
place, and sync a SharedState of torch tensors. Exits 0 and prints "ok" only if every result
is right and numpy was never imported. Usage: ``python tests/unit/torch_without_numpy.py``.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class NoNumpy(importlib.abc.MetaPathFinder):
    """A finder that makes ``numpy`` and its submodules unimportable."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


def block_numpy() -> None:
    assert "numpy" not in sys.modules, "numpy was imported before it could be blocked"
    sys.meta_path.insert(0, NoNumpy())


block_numpy()

import asyncio  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch, at import
import torch  # noqa: E402

import pccl_aio as pccl  # noqa: E402
from pccl_aio._compute import ops as _ops  # noqa: E402

FAST = {"heartbeat_interval": 0.2, "heartbeat_timeout": 2.0}


async def join(master: pccl.Master) -> tuple[pccl.Communicator, pccl.Communicator]:
    a, b = (pccl.Communicator(master.address, **FAST) for _ in range(2))
    await a.connect()
    joining = asyncio.ensure_future(b.connect())
    while not await a.are_peers_pending():  # a joint vote: a real round trip each time
        assert not joining.done() or joining.exception() is None
    await a.update_topology()
    await joining
    return a, b


async def all_reduces(a: pccl.Communicator, b: pccl.Communicator) -> None:
    n = 3 * (1 << 18) + 5  # several segments
    for dtype in (torch.float32, torch.bfloat16):
        xs = [(torch.arange(n, dtype=torch.float32) % 97 + i).to(dtype) for i in (1, 2)]
        want = (xs[0].double() + xs[1].double()).to(dtype)  # small integers: exact
        ins, keep = [x.clone() for x in xs], [x.clone() for x in xs]
        await asyncio.gather(a.all_reduce(ins[0]), b.all_reduce(ins[1]))
        outs = [torch.empty_like(x) for x in xs]
        infos = await asyncio.gather(a.all_reduce(xs[0], outs[0], tag=1),
                                     b.all_reduce(xs[1], outs[1], tag=1))
        assert all(i.world_size == 2 for i in infos), infos
        for got in (*ins, *outs):
            assert got.dtype == dtype and torch.equal(got, want), dtype
        assert all(torch.equal(x, k) for x, k in zip(xs, keep)), "src was written"
    quant = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8")
    qs = [torch.full((1000,), 1.5, dtype=torch.bfloat16) for _ in range(2)]
    await asyncio.gather(a.all_reduce(qs[0], quantization=quant, tag=2),
                         b.all_reduce(qs[1], quantization=quant, tag=2))
    assert all(bool((q == 3.0).all()) for q in qs)


async def shared_state(a: pccl.Communicator, b: pccl.Communicator) -> None:
    src = {"w": torch.linspace(-1, 1, 5000), "h": torch.arange(300, dtype=torch.bfloat16),
           "step": torch.tensor([7], dtype=torch.int64)}
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    sa, sb = pccl.SharedState(src), pccl.SharedState(dst)
    infos = await asyncio.gather(a.sync_shared_state(sa), b.sync_shared_state(sb))
    assert infos[1].rx_bytes == sa.nbytes and infos[0].tx_bytes == sa.nbytes, infos
    for k in src:
        assert torch.equal(src[k], dst[k]), k


async def main() -> None:
    assert _ops.IMPLEMENTATION == "cython", _ops.IMPLEMENTATION
    async with pccl.Master("127.0.0.1", 0, **FAST) as master:
        a, b = await join(master)
        async with a, b:
            await all_reduces(a, b)
            await shared_state(a, b)


if __name__ == "__main__":
    pccl.run(main())
    assert "numpy" not in sys.modules, "numpy got imported"
    print("ok")
