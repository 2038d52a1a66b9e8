"""A peer for ``test_data_errors.py``; prints JSON lines.

Usage: python data_error_peer.py MASTER_ADDR WORLD INDEX BAD_INDEX

Joins, waits for WORLD peers, then runs, each on the same inputs everywhere but for peer
BAD_INDEX's: (1) ``SparseCompressor.average`` with a NaN in that peer's ``x``, then a clean
one; (2) a quantized (uint8, MIN_MAX) all-reduce with a NaN in that peer's input. Prints
"sparse" (whether it raised, the error's type, seconds inside the call), "sparse_ok" (the
clean average's digest) and "quant" (the result's digest and its NaN count).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import numpy as np

import pccl_aio as pccl
from pccl_aio.blocking import Communicator

N = 200_003


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()[:16]


def main() -> None:
    addr, world, index, bad = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0) as comm:
        comm.connect()
        comm.wait_for_peers(world, timeout=60)
        comp = pccl.SparseCompressor(N, density=0.01, bits=4)
        x = np.random.default_rng(index).standard_normal(N).astype(np.float32)
        if index == bad:
            x[12345] = np.nan
        out = np.empty(N, np.float32)
        t0 = time.monotonic()
        try:
            comp.average_blocking(comm, x, out, tag=1, timeout=20)
        except pccl.PcclError as exc:
            emit(event="sparse", raised=True, type=type(exc).__name__,
                 seconds=time.monotonic() - t0)
        else:
            emit(event="sparse", raised=False, seconds=time.monotonic() - t0)
        x = np.random.default_rng(100 + index).standard_normal(N).astype(np.float32)
        comp.average_blocking(comm, x, out, tag=2, timeout=20)
        emit(event="sparse_ok", digest=digest(out))
        y = np.linspace(-1, 1, N, dtype=np.float32) * (index + 1)
        if index == bad:
            y[7] = np.nan
        quant = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype=pccl.DataType.UINT8)
        comm.all_reduce(y, tag=3, quantization=quant, timeout=20)
        emit(event="quant", digest=digest(y), nans=int(np.isnan(y).sum()),
             finite=int(np.isfinite(y).sum()))


if __name__ == "__main__":
    main()
