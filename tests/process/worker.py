"""A peer process for the process tests; prints one JSON object per line on stdout.

Usage: python worker.py MASTER_ADDR PEER_INDEX EXPECTED_WORLD MODE [COUNT [TENSORS IN_FLIGHT]]

Modes:
  reduce  -- join, wait until EXPECTED_WORLD peers are accepted, run one in-place SUM
             all-reduce (tag 0) of COUNT float32 = (index+1) * arange, print "started" once
             data flows, and on PeerLostError retry with the same tag; report hashes.
  multi   -- all_reduce_multiple_with_retry over TENSORS tensors of COUNT float32 (10 x 16K,
             8 in flight by default).
  sparse  -- as reduce, with a ``SparseCompressor`` (all kept, 8-bit codes: a large part):
             compress, all-gather the parts ("started" once data flows), decompress and
             commit; on PeerLostError report whether the error buffer is unchanged, then
             ``average`` again over the survivors.
  vote    -- join, wait for the world, then call update_topology() and report the world size.
  idle    -- join and wait for the world, then loop on are_peers_pending() (master-loss test).

In every mode SIGUSR1 arms a cut: the next data segment this peer receives makes it reset its
receiving data sockets from inside (as ``ss -K`` or a middlebox reset would); it prints
"cut" with the number of sockets.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np

import pccl_aio as pccl
from pccl_aio._peer import testing


def emit(**kw: object) -> None:
    print(json.dumps({"t": time.time(), **kw}), flush=True)


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()[:16]


def launched(comm: pccl.Communicator, n: int) -> asyncio.Future[None]:
    """A future set once ``comm`` has launched ``n`` collectives (sent their votes).

    all_reduce_multiple_with_retry has no public "window launched" signal, so this wraps the
    ``launch`` of the communicator's control plane (reached through the test hook
    ``pccl_aio._peer.testing``); what the process test asserts (the window size) is read from
    its ``colls`` too.
    """
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    control = testing.control_plane(comm)
    launch, count = control.launch, 0

    def counting(coll: Any) -> None:
        nonlocal count
        launch(coll)
        count += 1
        if count >= n and not done.done():
            done.set_result(None)

    control.launch = counting  # type: ignore[method-assign]
    return done


def arm_cut_on_sigusr1(comm: pccl.Communicator) -> None:
    from pccl_aio._peer.data import collective as _collective

    armed = [False]
    on_segment = _collective.Collective.on_segment

    def cutting(self: Any, *args: Any) -> None:
        on_segment(self, *args)
        if armed[0] and self.env is testing.data_plane(comm):
            armed[0] = False
            conns = list(testing.data_plane(comm).listener.conns)
            for r in conns:  # abort: the kernel sends a reset, as `ss -K` would
                r.close()
            emit(event="cut", sockets=len(conns))

    _collective.Collective.on_segment = cutting  # type: ignore[method-assign]
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1,
                                                  lambda: armed.__setitem__(0, True))


async def sparse(comm: pccl.Communicator, index: int, count: int) -> None:
    comp = pccl.SparseCompressor(count, density=1.0, bits=8)
    x = np.arange(count, dtype=np.float32) * (index + 1)
    out = np.empty(count, np.float32)
    before = comp.error.copy()
    gathered = np.empty(comm.peer_group_world_size * comp.nbytes, np.uint8)
    h = comm.all_gather_async(comp.compress(x), gathered)  # (what ``average`` does)
    await h.started()
    emit(event="started")
    try:
        await h
        comp.decompress(gathered, out)
        comp.commit()
        emit(event="done", hash=digest(out))
    except pccl.PeerLostError as exc:
        emit(event="lost", error=str(exc), ws=comm.peer_group_world_size,
             unchanged=bool(np.array_equal(comp.error, before)))
        info = await comp.average(comm, x, out)
        emit(event="retried", ws=info.world_size, hash=digest(out),
             changed=bool(comp.error.any()))


async def main() -> None:
    addr, index, world, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    count = int(sys.argv[5]) if len(sys.argv) > 5 else 1 << 20
    comm = pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                             data_timeout=3.0, p2p_connections=2,
                             master_timeout=float(os.environ.get("MASTER_TIMEOUT", "60")))
    arm_cut_on_sigusr1(comm)
    await comm.connect(attempts=20)
    emit(event="joined", peer_id=comm.peer_id, ws=comm.world_size)
    while comm.world_size < world:
        await comm.update_topology()
    emit(event="world", ws=comm.world_size)
    try:
        if mode == "reduce":
            x = np.arange(count, dtype=np.float32) * (index + 1)
            orig = x.copy()
            h = comm.all_reduce_async(x, tag=0)
            await h.started()
            emit(event="started")
            try:
                info = await h
                emit(event="done", ws=info.world_size, hash=digest(x))
            except pccl.PeerLostError as exc:
                emit(event="lost", error=str(exc), ws=comm.peer_group_world_size,
                     restored=bool(x.tobytes() == orig.tobytes()))
                info = await comm.all_reduce(x, tag=0)
                emit(event="retried", ws=info.world_size, hash=digest(x),
                     first=float(x[1]), last=float(x[-1]))
        elif mode == "multi":
            n_tensors, in_flight = (int(a) for a in sys.argv[6:8]) if len(sys.argv) > 7 else (10, 8)
            ts = [np.full(count, index + 1 + t, np.float32) for t in range(n_tensors)]
            window = launched(comm, min(in_flight, n_tensors))
            task = asyncio.ensure_future(
                comm.all_reduce_multiple_with_retry(ts, max_in_flight=in_flight))
            await asyncio.wait([task, window], return_when=asyncio.FIRST_COMPLETED)
            window.cancel()
            emit(event="started", in_flight=len(testing.control_plane(comm).colls))
            infos = await task
            emit(event="done", ws=[i.world_size for i in infos],
                 hash=digest(np.concatenate(ts)), firsts=[float(t[0]) for t in ts])
        elif mode == "sparse":
            await sparse(comm, index, count)
        elif mode == "vote":
            emit(event="started")
            while True:
                await comm.update_topology()
                emit(event="voted", ws=comm.world_size)
        elif mode == "idle":
            emit(event="started")
            while True:  # joint votes until the master goes away: pending or next call fails
                await comm.are_peers_pending()
    except pccl.PcclError as exc:
        emit(event="error", kind=type(exc).__name__, error=str(exc))
    finally:
        await comm.close()


if __name__ == "__main__":
    pccl.run(main())
