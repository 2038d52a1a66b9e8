"""A peer process for ``test_kill_kinds.py``: rounds of broadcast, all-gather, reduce-scatter
and barrier, each with one peer frozen mid-collective for the test to SIGKILL; one JSON
event per line on stdout.

Usage: python kinds_peer.py MASTER_ADDR WORLD [joiner]

Initial peers join until WORLD peers are accepted, then run the rounds ``broadcast`` (the
victim is the root, the last rank), ``all_gather`` (rank 1), ``reduce_scatter`` (rank 0),
admit one joiner (``update_topology`` until three are in), check every kind, and run a
``barrier`` round (rank 1 never arrives). A joiner starts at that check. In a round every peer
prints "round" (its rank), launches the kind on 8 MiB; the victim, right after sending its
first data frame (or, in a barrier, instead of arriving) prints "frozen" and stops itself
(SIGSTOP) for the test to kill; the others print "lost" (the time, the error, whether their
inputs are as they were), then "verified": every kind again in the new world, each result
checked here against its numpy value.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np

import pccl_aio as pccl
from pccl_aio._peer.data import pipeline as _pipeline

COUNT = 1 << 21  # 8 MiB of float32 per round: eight data frames
N = 100_003  # the checks: odd, two frames
ROUNDS = [("broadcast", -1), ("all_gather", 1), ("reduce_scatter", 0)]
FROZEN = [False]  # armed: freeze after the next data frame this peer sends


def emit(**kw: object) -> None:
    print(json.dumps({"t": time.time(), **kw}), flush=True)


def freeze() -> None:
    emit(event="frozen")
    os.kill(os.getpid(), signal.SIGSTOP)


def arm_freeze() -> None:
    send_now = _pipeline.Pipeline._send_now

    def sending(self: Any, *args: Any, **kw: Any) -> None:
        send_now(self, *args, **kw)
        if FROZEN[0]:
            FROZEN[0] = False
            freeze()

    _pipeline.Pipeline._send_now = sending  # type: ignore[method-assign]


def launch(comm: pccl.Communicator, kind: str, n: int, tag: int
           ) -> tuple[pccl.AllReduceHandle, list[np.ndarray], np.ndarray | None]:
    """The handle, the inputs (unchanged after a failure) and the output, if any."""
    w, r = comm.peer_group_world_size, comm.rank
    if kind == "broadcast":
        x = np.full(n, r + 1.0, np.float32)
        root = w - 1 if n == COUNT else 0  # (the round's root is the victim)
        return comm.broadcast_async(x, root=root, tag=tag, restore_on_abort=True), [x], x
    if kind == "all_gather":
        x, out = np.arange(n, dtype=np.float32) + 1000 * r, np.zeros(w * n, np.float32)
        return comm.all_gather_async(x, out, tag=tag), [x], out
    if kind == "reduce_scatter":
        src, out = np.arange(w * n, dtype=np.float32) * (r + 1), np.zeros(n, np.float32)
        return comm.reduce_scatter_async(src, out, tag=tag), [src], out
    return comm.barrier_async(tag=tag), [], None


def expected(kind: str, w: int, r: int) -> np.ndarray | None:
    if kind == "broadcast":
        return np.full(N, 1.0, np.float32)  # rank 0's
    if kind == "all_gather":
        return np.concatenate([np.arange(N, dtype=np.float32) + 1000 * q for q in range(w)])
    if kind == "reduce_scatter":
        whole = np.arange(w * N, dtype=np.float32) * (w * (w + 1) // 2)
        return whole[r * N : (r + 1) * N]
    return None


async def verify(comm: pccl.Communicator) -> None:
    # the world as launched in (after the last call a finished peer may have left already)
    ok, digest, world, rank = True, "", comm.peer_group_world_size, comm.rank
    for tag, kind in enumerate(["broadcast", "all_gather", "reduce_scatter", "barrier"], 1):
        h, _, out = launch(comm, kind, N, tag)
        info = await h
        want = expected(kind, info.world_size, rank)
        ok = ok and info.world_size == world
        if want is not None and out is not None:
            ok = ok and out.tobytes() == want.tobytes()
        if kind == "all_gather" and out is not None:
            digest = hashlib.sha256(out.tobytes()).hexdigest()[:16]
    emit(event="verified", ok=ok, ws=world, hash=digest)


async def run_round(comm: pccl.Communicator, kind: str, victim: int) -> None:
    w = comm.peer_group_world_size
    emit(event="round", kind=kind, rank=comm.rank, ws=w)
    if comm.rank == victim % w:
        if kind == "barrier":
            freeze()  # never arrives
        FROZEN[0] = True
    h, inputs, _ = launch(comm, kind, COUNT, 10)
    saved = [x.copy() for x in inputs]
    try:
        await h
    except pccl.PeerLostError as exc:
        same = all(x.tobytes() == s.tobytes() for x, s in zip(inputs, saved))
        emit(event="lost", kind=kind, error=str(exc), restored=same,
             ws=comm.peer_group_world_size)
    else:
        emit(event="error", kind=kind, error="completed although a peer was frozen")
        return
    await verify(comm)


async def main() -> None:
    addr, world = sys.argv[1], int(sys.argv[2])
    joiner = sys.argv[3:] == ["joiner"]
    comm = pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                             data_timeout=5.0)
    arm_freeze()
    await comm.connect(attempts=20)
    emit(event="joined", peer_id=comm.peer_id)
    try:
        if not joiner:
            while comm.peer_group_world_size < world:
                await comm.update_topology()
            emit(event="world", ws=comm.peer_group_world_size)
            for kind, victim in ROUNDS:
                await run_round(comm, kind, victim)
            while comm.peer_group_world_size < 3:
                await comm.update_topology()  # admits the joiner
        await verify(comm)
        await run_round(comm, "barrier", 1)
        emit(event="done")
    except pccl.PcclError as exc:
        emit(event="error", kind=type(exc).__name__, error=str(exc))
    finally:
        await comm.close()


if __name__ == "__main__":
    pccl.run(main())
