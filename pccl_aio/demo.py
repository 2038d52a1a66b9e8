"""A self-checking demo: ``python -m pccl_aio.demo``.

Starts a master and 4 peer processes on 127.0.0.1, runs verified all-reduce steps, SIGKILLs
one peer mid-run, starts a newcomer that joins, prints live progress and ends with a one-line
verdict. The exit status is non-zero if any result was wrong or the run did not finish.

Each step every peer syncs a shared state (its revision is the step, so a newcomer learns it
and receives the weights), all-reduces a tensor whose exact sum is known, checks every element
and applies the result to the weights identically everywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

import numpy as np

from . import Communicator, Master, PeerLostError, ReduceOp, SharedState, run
from ._peer.core.shared_state import hash_bytes


def _exists(path: str) -> bool:
    return os.path.exists(path)  # one stat of a local temp file: fine on the event loop


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


def _pattern(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 1000) + 1  # small integers: sums are exact


async def _peer(addr: str, steps: int, count: int, stop_file: str) -> int:
    """One demo peer; prints JSON progress lines on stdout."""
    def emit(**kw: Any) -> None:
        print(json.dumps(kw), flush=True)

    async with Communicator(addr, p2p_connections=2, heartbeat_interval=0.2,
                            heartbeat_timeout=2.0, data_timeout=5.0) as comm:
        await comm.connect(attempts=20)
        emit(event="joined", peer=comm.peer_id, ws=comm.world_size)
        pattern = _pattern(count)
        weights = np.zeros(count, np.float32)
        state = SharedState({"weights": weights}, revision=0)
        first, bad = True, 0
        while True:
            # A newcomer starts at the sync: the others passed the vote already.
            if not first and comm.peer_group_world_size >= 2 and await comm.are_peers_pending():
                await comm.update_topology()
            first = False
            while comm.peer_group_world_size < 2:
                await comm.update_topology()  # alone: admit whoever is waiting
                if comm.peer_group_world_size < 2:
                    await asyncio.sleep(0.05)  # pacing only
            try:
                sync = await comm.sync_shared_state(state)
                emit(event="state", peer=comm.peer_id, revision=state.revision,
                     hash=hash_bytes(state.view("weights")).hex(), rx=sync.rx_bytes,
                     ws=comm.peer_group_world_size)
                if state.revision >= steps:
                    # Stop together once the controller saw the newcomer take part (it creates
                    # the stop file): a MIN all-reduce makes it one decision for all peers.
                    vote = np.array([_exists(stop_file)], np.int64)
                    await comm.all_reduce(vote, op=ReduceOp.MIN, tag=1)
                    if vote[0]:
                        break
                x = pattern.copy()
                t0 = time.perf_counter()
                info = await comm.all_reduce(x, tag=0)
                dt = time.perf_counter() - t0
            except PeerLostError as exc:
                emit(event="lost", peer=comm.peer_id, step=state.revision, error=str(exc))
                continue
            ok = bool(np.array_equal(x, pattern * np.float32(info.world_size)))
            bad += not ok
            busbw = x.nbytes * 2 * (info.world_size - 1) / info.world_size / dt
            emit(event="step", peer=comm.peer_id, step=state.revision, ws=info.world_size, ok=ok,
                 gbps=busbw / 1e9)
            weights += np.float32(1e-3) * x  # identical everywhere: the next sync moves nothing
            state.revision += 1
        emit(event="finished", peer=comm.peer_id, bad=bad)
        return 1 if bad else 0


async def _spawn(addr: str, steps: int, count: int, stop_file: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.demo", "--peer", addr, "--steps", str(steps),
        "--count", str(count), "--stop-file", stop_file, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def _controller(args: argparse.Namespace) -> int:
    tmp = tempfile.mkdtemp(prefix="pccl-aio-demo-")
    try:
        return await _control(args, os.path.join(tmp, "stop"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _control(args: argparse.Namespace, stop_file: str) -> int:
    async with Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=2.0) as master:
        print(f"master on {master.address}; starting {args.peers} peers "
              f"({args.count * 4 / 2**20:.0f} MiB float32 per all-reduce, {args.steps} steps)")
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        procs: list[asyncio.subprocess.Process] = []

        async def pump(p: asyncio.subprocess.Process) -> None:
            assert p.stdout is not None
            async for line in p.stdout:
                with contextlib.suppress(ValueError):
                    await events.put(json.loads(line))

        async def start() -> asyncio.subprocess.Process:
            p = await _spawn(master.address, args.steps, args.count, stop_file)
            procs.append(p)
            pumps.append(asyncio.ensure_future(pump(p)))
            return p

        pumps: list[asyncio.Task[None]] = []
        for _ in range(args.peers):
            await start()
        killed = joined = full = False
        newcomer = -1
        wrong, lost, finished = 0, 0, 0
        hashes: dict[int, set[str]] = {}
        newcomer_rx = -1
        world_at: dict[int, int] = {}
        deadline = time.monotonic() + args.timeout
        try:
            while finished < len(procs) - int(killed):
                ev = await asyncio.wait_for(events.get(), max(0.1, deadline - time.monotonic()))
                if ev["event"] == "step":
                    wrong += not ev["ok"]
                    if ev["peer"] == 1:
                        print(f"step {ev['step']:3d}  world {ev['ws']}  busbw {ev['gbps']:6.2f} GB/s"
                              f"  {'ok' if ev['ok'] else 'WRONG'}", flush=True)
                    full = full or ev["ws"] == args.peers
                    if not killed and full and ev["step"] >= args.steps // 3:
                        killed = True
                        print(f"--- SIGKILL peer process {procs[2].pid} mid-run", flush=True)
                        procs[2].send_signal(signal.SIGKILL)
                    elif killed and not joined and ev["step"] >= args.steps // 2:
                        joined = True
                        print("--- starting a newcomer", flush=True)
                        await start()
                elif ev["event"] == "state":
                    hashes.setdefault(ev["revision"], set()).add(ev["hash"])
                    world_at[ev["revision"]] = ev["ws"]
                    if joined and ev["peer"] == newcomer and newcomer_rx < 0:
                        newcomer_rx = ev["rx"]
                    if newcomer_rx >= 0 and ev["ws"] >= args.peers and not _exists(stop_file):
                        _touch(stop_file)  # the peers may stop now (they vote on it)
                elif ev["event"] == "lost":
                    lost += 1
                elif ev["event"] == "joined" and joined:
                    newcomer = ev["peer"]
                    print(f"--- newcomer joined as peer {newcomer}", flush=True)
                elif ev["event"] == "finished":
                    finished += 1
                    wrong += ev["bad"]
        except TimeoutError:
            print(f"VERDICT: FAIL - the run did not finish within {args.timeout:.0f} s")
            return 1
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
            await asyncio.gather(*(p.wait() for p in procs))
            for t in pumps:
                t.cancel()
        codes = [p.returncode for i, p in enumerate(procs) if i != 2]
        parity = bool(hashes) and all(len(h) == 1 for h in hashes.values())
        ok = (wrong == 0 and killed and joined and parity and newcomer_rx > 0
              and all(c in (0, -signal.SIGKILL) for c in codes))
        sizes = [w for r, w in sorted(world_at.items())]
        path = "->".join(str(w) for i, w in enumerate(sizes) if i == 0 or sizes[i - 1] != w)
        print(f"VERDICT: {'PASS' if ok else 'FAIL'} - {len(hashes) - 1} steps, world {path}, "
              f"1 peer killed, 1 joined (received {newcomer_rx / 2**20:.1f} MiB of state), "
              f"{lost} aborted collectives retried, {wrong} wrong results, state hash "
              f"{'identical on every peer at every' if parity else 'DIFFERENT at some'} "
              f"revision ({len(hashes)} revisions)")
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pccl_aio.demo", description=__doc__)
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--count", type=int, default=1 << 21, help="float32 elements per all-reduce")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--peer", metavar="MASTER", help=argparse.SUPPRESS)
    p.add_argument("--stop-file", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer:
        return run(_peer(args.peer, args.steps, args.count, args.stop_file))
    return run(_controller(args))


if __name__ == "__main__":
    sys.exit(main())
