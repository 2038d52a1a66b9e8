"""Shared-state peer processes for the process tests; one JSON event per line on stdout.

Usage: python state_worker.py MASTER_ADDR[,MASTER_ADDR...] MODE ARG

  ddp REVISIONS  -- a DDP-like loop: sync the state (weights, momentum, a step counter),
                    all-reduce (AVG) a peer-specific gradient with retry, update in place,
                    revision + 1; prints the state hash after every sync; stops after
                    REVISIONS once three peers are in the group. A lost master
                    (MasterLostError) is ridden out: the call is retried. $STEP_SECONDS:
                    a pause per step that stands for its compute (default 0);
                    $STATE_ELEMS: elements of each tensor (default 65536).
  big MIB        -- hold a MIB-sized state; up-to-date peers (index from env PEER_INDEX != 'joiner')
                    fill it with a pattern, the joiner starts from zeros at revision 0 and syncs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np
import xxhash

import pccl_aio as pccl
from pccl_aio._peer import testing

PACE = float(os.environ.get("STEP_SECONDS", "0"))  # compute time of a step (default none)


def emit(**kw: object) -> None:
    print(json.dumps({"t": time.time(), **kw}), flush=True)


def state_hash(state: pccl.SharedState) -> str:
    h = xxhash.xxh3_64()
    for k in state.keys:
        h.update(state.view(k))
    return h.hexdigest()


T = TypeVar("T")


async def again(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, made again after a lost master: the call that raised, not the step around
    it (the others may have had the answers this peer missed). A peer that rejoined as a
    new member goes on as a joiner instead: the error is raised."""
    while True:
        try:
            return await call()
        except pccl.MasterLostError as exc:
            emit(event="retry", kind=type(exc).__name__, error=str(exc)[:300],
                 new_member=exc.new_member)
            if exc.new_member:
                raise


async def admit_round(comm: pccl.Communicator, first: bool) -> None:
    if not first and comm.peer_group_world_size >= 2 and await again(comm.are_peers_pending):
        emit(event="admitting")
        await again(comm.update_topology)
    while comm.peer_group_world_size < 2:
        await again(comm.update_topology)
        if comm.peer_group_world_size < 2:
            # Pacing, not synchronisation: alone, update_topology() returns after one master
            # round trip whether or not anybody is waiting, so without a pause this loop would
            # hammer the master. No outcome depends on the delay: the loop re-checks the size.
            await asyncio.sleep(0.05)


async def sync(comm: pccl.Communicator, state: pccl.SharedState) -> pccl.SyncInfo:
    """Sync, again after a failure (the group's verdict: every peer retries it)."""
    while True:
        try:
            return await again(lambda: comm.sync_shared_state(state))
        except pccl.SharedStateError as exc:
            emit(event="retry", kind=type(exc).__name__, error=str(exc)[:300])


async def ddp(comm: pccl.Communicator, revisions: int) -> None:
    n = int(os.environ.get("STATE_ELEMS", 1 << 16))  # float32 elements of w, m and g
    w, mom, step = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(1, np.int64)
    state = pccl.SharedState({"w": w, "m": mom, "step": step})
    first = True  # a joiner's first step syncs at once: the others admitted it
    while True:
        try:
            await admit_round(comm, first)
            first = False
            info = await sync(comm, state)
            emit(event="synced", revision=state.revision, hash=state_hash(state),
                 rx=info.rx_bytes, tx=info.tx_bytes, ws=comm.peer_group_world_size,
                 nbytes=state.nbytes, step=int(step[0]), peer=comm.peer_id)
            # Stop after REVISIONS once three peers take part (the test needs the joiner in);
            # a MIN all-reduce makes it one decision for all, whatever each saw.
            vote = np.array([state.revision >= revisions and comm.peer_group_world_size >= 3],
                            np.int64)
            await retrying(comm, vote, pccl.ReduceOp.MIN, 1)
            if vote[0]:
                break
            rng = np.random.default_rng(comm.peer_id * 100_003 + state.revision)
            g = rng.standard_normal(n).astype(np.float32)
            await retrying(comm, g, pccl.ReduceOp.AVG, 0)
        except pccl.MasterLostError:  # rejoined as a new member (again()): a joiner again
            first = True
            continue
        except pccl.TooFewPeersError as exc:  # alone for now: admit, then sync again
            emit(event="retry", kind=type(exc).__name__, error=str(exc)[:300])
            continue
        if PACE:
            await asyncio.sleep(PACE)  # stands for a training step's compute, not a sync
        mom *= np.float32(0.9)
        mom += g
        w -= np.float32(0.01) * mom
        step += 1
        state.revision += 1


async def retrying(comm: pccl.Communicator, x: np.ndarray, op: pccl.ReduceOp, tag: int) -> None:
    """All-reduce in place, retrying on the survivors after a lost peer or master (x is
    restored); a peer that rejoined as a new member raises."""
    while True:
        try:
            await comm.all_reduce(x, op=op, tag=tag)
            return
        except pccl.PeerLostError as exc:
            emit(event="lost", tag=tag, kind=type(exc).__name__, error=str(exc)[:300])
            if isinstance(exc, pccl.MasterLostError) and exc.new_member:
                raise


async def big(comm: pccl.Communicator, mib: int) -> None:
    joiner = os.environ.get("PEER_INDEX") == "joiner"
    n = mib * 2**20 // 4
    entries = {f"e{i}": np.zeros(n // 4, np.float32) for i in range(4)}
    if not joiner:
        for i, a in enumerate(entries.values()):
            a[:] = np.arange(a.size, dtype=np.float32) * (i + 1)
    state = pccl.SharedState(entries, revision=0 if joiner else 5)
    if not joiner:
        # (the test hook: no public API tells "a range was requested")
        server = testing.shared_state_sync(comm).server
        orig = server.lookup
        assert orig is not None
        told = False

        async def spy(peer: int, key: str, rev: int) -> memoryview | None:
            nonlocal told
            view = await orig(peer, key, rev)
            if not told and view is not None:  # a range of this sync is being served
                told = True
                emit(event="serving", key=key)
            return view

        server.lookup = spy
    emit(event="ready")
    info = await comm.sync_shared_state(state)
    emit(event="synced", revision=state.revision, hash=state_hash(state), rx=info.rx_bytes,
         tx=info.tx_bytes)


async def main() -> None:
    addrs, mode, arg = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    comm = pccl.Communicator(addrs if len(addrs) > 1 else addrs[0], heartbeat_interval=0.2,
                             heartbeat_timeout=2.0, data_timeout=3.0,
                             master_timeout=float(os.environ.get("MASTER_TIMEOUT", "60")))
    try:
        await comm.connect(attempts=20)
        emit(event="joined", peer_id=comm.peer_id, ws=comm.world_size)
        if mode == "ddp":
            await ddp(comm, arg)
        else:
            want = int(os.environ.get("WORLD", "2"))
            while comm.world_size < want:
                await comm.update_topology()
            emit(event="world", ws=comm.world_size)
            await big(comm, arg)
        emit(event="finished")
    except pccl.PcclError as exc:
        emit(event="error", kind=type(exc).__name__, error=str(exc))
    finally:
        await comm.close()


if __name__ == "__main__":
    if os.environ.get("PCCL_TEST_LOG"):  # e.g. INFO: the library's log, timed, on stderr
        logging.basicConfig(level=os.environ["PCCL_TEST_LOG"].upper(),
                            format="%(created).3f %(name)s %(message)s")
    pccl.run(main())
