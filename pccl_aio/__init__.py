"""pccl_aio: fault-tolerant collective communications over the internet, in pure asyncio.

A ``Master`` orchestrates a run; ``Communicator`` peers join and leave at any moment and run
ring all-reduces over pooled TCP connections with Cython kernels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import (
    AuthenticationError,
    DeadlockError,
    InvalidUsageError,
    KickedError,
    MasterConnectionError,
    MasterLostError,
    MembershipChangedError,
    PcclError,
    PcclTimeoutError,
    PeerLostError,
    ProtocolError,
    RemoteProtocolError,
    SharedStateError,
    TooFewPeersError,
    VersionMismatchError,
)
from ._master.server import Master
from ._net.credentials import load_secret, tls_contexts
from ._net.loops import new_loop
from ._peer.communicator import AllReduceHandle, Communicator
from ._peer.data.buckets import Buckets
from ._peer.p2p.calls import TransferHandle
from ._peer.state.core.shared_state import SharedState
from ._peer.state.progress import progress_bar
from ._types import (
    DataType,
    QuantAlgo,
    Quantization,
    ReduceInfo,
    ReduceOp,
    SyncInfo,
    SyncStrategy,
    TopologyInfo,
    TransferInfo,
)
from ._version import __version__

if TYPE_CHECKING:  # (imported on first use: it needs numpy, which ``import pccl_aio`` does not)
    from ._peer.compress import SparseCompressor

__all__ = [
    "AllReduceHandle",
    "AuthenticationError",
    "Buckets",
    "Communicator",
    "DataType",
    "DeadlockError",
    "InvalidUsageError",
    "KickedError",
    "Master",
    "MasterConnectionError",
    "PcclError",
    "PcclTimeoutError",
    "MasterLostError",
    "MembershipChangedError",
    "PeerLostError",
    "ProtocolError",
    "QuantAlgo",
    "Quantization",
    "ReduceInfo",
    "ReduceOp",
    "RemoteProtocolError",
    "SharedState",
    "SharedStateError",
    "SparseCompressor",
    "SyncInfo",
    "SyncStrategy",
    "TooFewPeersError",
    "TopologyInfo",
    "TransferHandle",
    "TransferInfo",
    "VersionMismatchError",
    "__version__",
    "load_secret",
    "progress_bar",
    "run",
    "tls_contexts",
]

_T = TypeVar("_T")


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` on uvloop when it is installed, else on the stock asyncio loop, as
    ``asyncio.run`` does (blocks until it returns; Ctrl-C cancels it)."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)


def __getattr__(name: str) -> Any:
    if name == "SparseCompressor":
        from ._peer.compress import SparseCompressor

        return SparseCompressor
    raise AttributeError(f"module 'pccl_aio' has no attribute {name!r}")
