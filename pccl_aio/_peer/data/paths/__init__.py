"""One data path per collective kind, chosen at the start (``start``).

A ``Collective`` (``collective.py``) keeps what every kind shares: its verdict, future,
seq, input backup and ``Phase``; its ``Pipeline`` (``pipeline.py``) moves one attempt's
frames. What differs by kind is a ``DataPath`` (``base.py``): where a received frame lands
(``target``), what a segment becomes (``process``), what this peer sends of its own
(``first_sends``), what is left once all is in (``finish``) and its buffers (``release``).

- ``ring.py``: the ring all-reduce (reduce-scatter, then all-gather), unquantized;
- ``quant.py``: the same ring with quantized codes on the wire;
- ``gather.py``: the small all-reduce (every input once round the ring);
- ``bruck.py``: the small all-reduce and all-gather from 4 peers up, in log2 P rounds
  (driven by ``rounds.Rounds``, not the ring's pipeline);
- ``allgather.py``: the all-gather (every block once round the ring, in segments);
- ``broadcast.py``: the root's tensor pipelined once along the ring;
- ``scatter.py``: the reduce-scatter (the ring's first half, rank r keeping chunk r).

A barrier moves nothing (``base.Nothing``). Adding a kind is one new module here with a class
that implements ``DataPath`` (its own plan in a sans-IO ``core/`` module if it needs one),
one branch in ``start`` choosing it from what every peer of the collective agrees on, and the
master's start rule for it in ``_master/core/collectives.py``. The collective, its life
cycle, the pipeline and the receiver stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from ...._types import CollectiveKind, Quantization, ReduceOp
from ...core.buffers import Buffer
from ..core import bruck as _bruck
from ..core.backup import InputBackup
from ..core.gather import chosen as _small
from ..core.slots import Pool
from .allgather import AllGatherPath
from .base import DataPath, Nothing
from .broadcast import BroadcastPath
from .bruck import BruckPath, BruckReducePath
from .gather import GatherPath
from .quant import QuantRingPath
from .ring import SEGMENT_BYTES, RingPath
from .scatter import reduce_scatter


def start(kind: CollectiveKind, rank: int, world: int, src: Buffer, dst: Buffer,
          op: ReduceOp, quant: Quantization | None, root: int, pool: Pool,
          backup: InputBackup | None, connections: Callable[[], int],
          copy_own: bool = True) -> DataPath:
    """The data path of rank ``rank`` of ``world`` for a collective of ``kind`` (the choice
    depends only on what every peer agrees on: kind, count, dtype, quantization and world
    size), laid out; ``connections()`` (per link: the ring sizes its receive slots by it) is
    asked only by the ring kinds; ``copy_own``: an all-gather's input is not its slot of
    ``dst`` already."""
    if kind == CollectiveKind.BARRIER:
        return Nothing()
    if kind == CollectiveKind.BROADCAST:
        return BroadcastPath(rank, world, root, dst.view, SEGMENT_BYTES, backup)
    if kind == CollectiveKind.ALL_GATHER:
        if _bruck.chosen(src.count * src.dtype.itemsize, world, False):
            return BruckPath(rank, world, src.view, dst.view, pool)
        return AllGatherPath(rank, world, src.view, dst.view, SEGMENT_BYTES, copy=copy_own)
    if kind == CollectiveKind.REDUCE_SCATTER:
        return reduce_scatter(rank, world, src, dst, op, quant, pool, connections())
    if _bruck.chosen(dst.count * dst.dtype.itemsize, world, quant is not None):
        return BruckReducePath(rank, world, src, dst, op, pool, backup)
    if quant is None and _small(dst.count * dst.dtype.itemsize, world, False):
        return GatherPath(rank, world, src, dst, op, pool, backup)
    path = RingPath if quant is None else QuantRingPath
    return path(rank, world, src, dst, op, quant, pool, backup, connections())
