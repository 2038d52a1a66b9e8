"""A self-checking demo: ``python -m pccl_aio.demo``.

Starts a master and 4 peer processes on 127.0.0.1 and runs verified all-reduce steps. One peer
SIGKILLs itself in the middle of an all-reduce, so every survivor's all-reduce raises
``PeerLostError`` and is retried by the remaining three; then a newcomer joins, receives the
shared state (a progress bar on stderr, with tqdm on a terminal) and takes part. Every peer's
progress is printed with its peer id, and the run ends with a one-line verdict. The exit status
is non-zero if any result was wrong or the run did not finish. ``--status-port`` serves the
master's live status page; ``--hold`` keeps it up before the run and after the verdict.

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
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import Communicator, Master, PeerLostError, ReduceOp, SharedState, TooFewPeersError, run
from ._compute import ops as _ops
from ._launch.hold import hold
from ._net.credentials import SECRET_ENV
from ._peer.data.core.gather import GATHER_MAX
from ._peer.state.core.shared_state import hash_bytes
from ._peer.state.progress import progress_bar
from ._text import plural


def kernel_warning() -> str:
    """A loud warning when the numpy reference kernels run instead of the compiled ones, else ""."""
    if _ops.IMPLEMENTATION != "numpy":
        return ""
    if _ops.NO_EXTENSIONS:
        why = "PCCL_AIO_NO_EXTENSIONS is set in the environment: unset it."
    else:
        # the package folder, where the compiled pccl_aio._kernels belongs
        where = os.path.dirname(os.path.dirname(os.path.abspath(_ops.__file__)))
        why = (f"No compiled extension in {where}. Running from the repository root imports "
               "the source tree, which has none unless it was built there: run "
               "`python -m pip install -e '.[numpy]'` or `python setup.py build_ext --inplace` "
               "in the repository root (or run the demo from another directory after "
               "`python -m pip install '.[numpy]'`).")
    return ("WARNING: pccl_aio is running its slow numpy reference kernels, not the compiled "
            f"Cython ones; all-reduces will be several times slower.\n  {why}")


def _exists(path: str) -> bool:
    return os.path.exists(path)  # one stat of a local temp file: fine on the event loop


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


def _pattern(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 1000) + 1  # small integers: sums are exact


async def _peer(addr: str, steps: int, count: int, stop_file: str, die_at: int,
                full: int) -> int:
    """One demo peer; prints JSON progress lines on stdout.

    ``die_at`` > 0: SIGKILL this process in the middle of an all-reduce (after the master
    started it, before it completes): the first at or after step ``die_at`` once one all-reduce
    ran on ``full`` peers.
    """
    def emit(**kw: Any) -> None:
        print(json.dumps(kw), flush=True)

    async with Communicator(addr, p2p_connections=2, heartbeat_interval=0.2,
                            heartbeat_timeout=2.0, data_timeout=5.0) as comm:
        await comm.connect(attempts=20)
        me = comm.peer_id
        emit(event="joined", peer=me, ws=comm.world_size)
        pattern = _pattern(count)
        weights = np.zeros(count, np.float32)
        state = SharedState({"weights": weights}, revision=0)
        bad, was_full = 0, False
        bar = progress_bar(f"peer {me}: shared state")  # the newcomer's fetch, on stderr
        # Every peer makes the same calls in the same order. A newcomer's first call is the
        # vote at the top of the loop, which is where the others go after admitting it.
        while True:
            doing = "the vote on pending peers"  # what raised, for the "lost" line
            try:
                if await comm.are_peers_pending():  # a joint vote of every peer
                    await comm.update_topology()  # admit the newcomers
                    continue
                if comm.peer_group_world_size < 2:  # alone: asleep until a peer joins
                    await comm.wait_for_peers(2)
                    continue
                doing = "the shared-state sync"
                sync = await comm.sync_shared_state(state, progress=bar)
                emit(event="state", peer=me, revision=state.revision,
                     hash=hash_bytes(state.view("weights")).hex(), rx=sync.rx_bytes,
                     ws=comm.peer_group_world_size)
                if state.revision >= steps:
                    # Stop together once the controller saw the newcomer take part (it creates
                    # the stop file): a MIN all-reduce makes it one decision for all peers.
                    vote = np.array([_exists(stop_file)], np.int64)
                    doing = "the stop vote, all-reduce tag 1"
                    await comm.all_reduce(vote, op=ReduceOp.MIN, tag=1)
                    if vote[0]:
                        break
                x = pattern.copy()
                t0 = time.perf_counter()
                # A tag per step (2 + step: tag 1 is the stop vote): a reused tag would start
                # early on its ticket, and a small all-reduce could then finish before the
                # master's start reaches the victim.
                handle = comm.all_reduce_async(x, tag=2 + state.revision)
                doing = f"its all-reduce, tag {handle.tag}"
                if die_at and was_full and state.revision >= die_at and await handle.started():
                    # The master started the collective and data is flowing: die now, with
                    # no goodbye, as a crashed machine would.
                    emit(event="dying", peer=me, step=state.revision, tag=handle.tag,
                         pid=os.getpid())
                    os.kill(os.getpid(), signal.SIGKILL)
                info = await handle
                dt = time.perf_counter() - t0
            except (PeerLostError, TooFewPeersError) as exc:
                # Aborted (the input x is restored) or the group shrank to one: vote again.
                emit(event="lost", peer=me, step=state.revision, doing=doing,
                     error=f"{type(exc).__name__}: {exc}")
                continue
            ok = bool(np.array_equal(x, pattern * np.float32(info.world_size)))
            bad += not ok
            was_full = was_full or info.world_size >= full
            busbw = x.nbytes * 2 * (info.world_size - 1) / info.world_size / dt
            emit(event="step", peer=me, step=state.revision, ws=info.world_size, ok=ok,
                 gbps=busbw / 1e9)
            weights += np.float32(1e-3) * x  # identical everywhere: the next sync moves nothing
            state.revision += 1
        emit(event="finished", peer=me, bad=bad)
        return 1 if bad else 0


async def _spawn(addr: str, args: argparse.Namespace, stop_file: str, secret: str,
                 die_at: int = 0) -> asyncio.subprocess.Process:
    """One peer process; it reads the run ``secret`` from its environment."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.demo", "--peer", addr, "--steps", str(args.steps),
        "--count", str(args.count), "--peers", str(args.peers), "--stop-file", stop_file,
        "--die-at", str(die_at), stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", SECRET_ENV: secret})


async def _controller(args: argparse.Namespace) -> int:
    tmp = tempfile.mkdtemp(prefix="pccl-aio-demo-")
    try:
        return await _control(args, os.path.join(tmp, "stop"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ids(peers: Iterable[int]) -> str:
    return ", ".join(str(p) for p in sorted(peers))


async def _control(args: argparse.Namespace, stop_file: str) -> int:
    secret = secrets.token_hex(16)  # a fresh run secret, handed to the peers' environment
    async with Master("127.0.0.1", 0, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                      secret=secret, status_port=args.status_port) as master:
        print(f"master on {master.address}; starting {plural(args.peers, 'peer')} "
              f"({args.count * 4 / 2**20:.2f} MiB float32 per all-reduce, {args.steps} steps)",
              flush=True)
        if master.status_address:
            print(f"status page: {master.status_address} (live while the demo runs)",
                  flush=True)
        if args.hold and not await hold(
                args.hold, f"holding {args.hold:g} s before starting the peers: open the status "
                "page, then press Enter to start now (Ctrl-C ends the demo)", sys.stdout,
                enter=True):
            print("interrupted before the peers started", file=sys.stderr, flush=True)
            return 130
        code = await _demo(master, args, stop_file, secret)
        if args.hold:
            await hold(args.hold, f"the status page stays up for {args.hold:g} s "
                        f"(Ctrl-C ends the demo now): {master.status_address}", sys.stderr)
        return code


async def _demo(master: Master, args: argparse.Namespace, stop_file: str, secret: str) -> int:
    """Start the peers, follow their progress and print the verdict; the exit status."""
    victim = 2  # index of the process that dies mid-all-reduce
    events: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
    procs: list[asyncio.subprocess.Process] = []
    pumps: list[asyncio.Task[None]] = []

    async def pump(i: int, p: asyncio.subprocess.Process) -> None:
        assert p.stdout is not None
        async for line in p.stdout:
            with contextlib.suppress(ValueError):
                await events.put((i, json.loads(line)))
        await events.put((i, {"event": "exited"}))

    async def start(die_at: int = 0) -> None:
        p = await _spawn(master.address, args, stop_file, secret, die_at)
        procs.append(p)
        pumps.append(asyncio.ensure_future(pump(len(procs) - 1, p)))

    for i in range(args.peers):
        await start(max(1, args.steps // 3) if i == victim else 0)
    peer_of: dict[int, int] = {}  # process index -> peer id
    killed, joined = -1, False  # killed: the victim's peer id once it died
    newcomer, newcomer_rx = -1, -1
    wrong = 0
    finished: set[int] = set()  # process indices
    lost: dict[int, int] = {}  # peer id -> PeerLostErrors it raised
    reports: dict[int, dict[int, tuple[int, bool, float]]] = {}  # step -> peer -> report
    hashes: dict[int, set[str]] = {}
    world_at: dict[int, int] = {}  # step -> world size of its (completed) all-reduce
    deadline = time.monotonic() + args.timeout
    try:
        while len(finished) < len(procs) - int(killed >= 0):
            i, ev = await asyncio.wait_for(events.get(), max(0.1, deadline - time.monotonic()))
            peer = ev.get("peer", -1)
            if ev["event"] == "step":
                wrong += not ev["ok"]
                world_at[ev["step"]] = ev["ws"]
                done = reports.setdefault(ev["step"], {})
                done[peer] = (ev["ws"], ev["ok"], ev["gbps"])
                if len(done) == ev["ws"]:  # every peer of that all-reduce reported it
                    _print_step(ev["step"], reports.pop(ev["step"]))
                if killed >= 0 and not joined and ev["step"] >= args.steps // 2:
                    joined = True
                    print("--- starting a newcomer", flush=True)
                    await start()
            elif ev["event"] == "state":
                hashes.setdefault(ev["revision"], set()).add(ev["hash"])
                if peer == newcomer and newcomer_rx < 0:
                    newcomer_rx = ev["rx"]
                    print(f"peer {peer}: received {newcomer_rx / 2**20:.2f} MiB of shared "
                          f"state, continuing at step {ev['revision']}", flush=True)
                if newcomer_rx >= 0 and ev["ws"] >= args.peers and not _exists(stop_file):
                    _touch(stop_file)  # the peers may stop now (they vote on it)
            elif ev["event"] == "dying":
                killed = peer
                print(f"--- peer {peer} (pid {ev['pid']}) SIGKILLs itself in the middle of "
                      f"the all-reduce of step {ev['step']} (tag {ev['tag']})", flush=True)
            elif ev["event"] == "lost":
                lost[peer] = lost.get(peer, 0) + 1
                print(f"peer {peer}: step {ev['step']} ({ev['doing']}) raised "
                      f"{ev['error']}; retrying", flush=True)
            elif ev["event"] == "joined":
                peer_of[i] = peer
                if joined:
                    newcomer = peer
                    print(f"--- newcomer joined as peer {peer}", flush=True)
                else:
                    print(f"peer {peer} joined (process {procs[i].pid})", flush=True)
            elif ev["event"] == "finished":
                finished.add(i)
                wrong += ev["bad"]
                print(f"peer {peer} finished", flush=True)
            elif ev["event"] == "exited" and i not in finished and i != victim:
                code = await procs[i].wait()
                print(f"VERDICT: FAIL - peer {peer_of.get(i, '?')} (process {procs[i].pid}) "
                      f"exited with status {code} before the end")
                return 1
        with contextlib.suppress(TimeoutError):  # they finished: let them exit
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 10)
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
    for step, done in sorted(reports.items()):  # all-reduces some peer did not report
        _print_step(step, done)
    codes = [p.returncode for i, p in enumerate(procs) if i != victim]
    survivors = {peer_of[i] for i in range(args.peers) if i != victim and i in peer_of}
    parity = bool(hashes) and all(len(h) == 1 for h in hashes.values())
    failed = [why for why, bad in [
        ("wrong results", wrong > 0), ("no peer was killed", killed < 0),
        ("no newcomer joined", not joined), ("the state hashes differ", not parity),
        ("the newcomer received no state", newcomer_rx <= 0),
        ("a survivor saw no PeerLostError", not survivors or not survivors <= set(lost)),
        (f"exit statuses {codes}", any(c != 0 for c in codes))] if bad]
    ok = not failed
    _print_master(master.status.snapshot())
    sizes = [w for _, w in sorted(world_at.items())]
    path = "->".join(str(w) for i, w in enumerate(sizes) if i == 0 or sizes[i - 1] != w)
    print(f"VERDICT: {'PASS' if ok else 'FAIL'} - {len(hashes) - 1} steps, world {path}, "
          f"peer {killed} killed mid-all-reduce, PeerLostError retried on peers "
          f"{_ids(set(lost)) or 'none'} (survivors {_ids(survivors)}), peer {newcomer} "
          f"joined (received {max(newcomer_rx, 0) / 2**20:.2f} MiB of state), {wrong} "
          f"wrong results, state hash "
          f"{'identical on every peer at every' if parity else 'DIFFERENT at some'} "
          f"revision ({len(hashes)} revisions){''.join(f'; {w}' for w in failed)}")
    return 0 if ok else 1


_DEPARTED = {"closed": "killed (connection dropped)", "heartbeat": "killed (no heartbeat)"}


def _print_master(status: dict[str, Any]) -> None:
    """What the master saw of the run (``Master.status``: the status page's data)."""
    c = status["counts"]
    aborted = ", ".join(f"{n} {why}" for why, n in sorted(c["aborted"].items())) or "none"
    gone = ", ".join(f"{n} {_DEPARTED.get(why, why)}"
                     for why, n in sorted(c["departures"].items())) or "none"
    print(f"master saw: {plural(c['joins'], 'peer')} joined, departures: {gone}; {c['completed']} "
          f"collectives completed, aborted: {aborted}; {c['syncs'].get('completed', 0)} "
          f"syncs, {c['sync_bytes'] / 2**20:.2f} MiB fetched", flush=True)


def _print_step(step: int, done: dict[int, tuple[int, bool, float]]) -> None:
    ws = max(r[0] for r in done.values())
    bad = sorted(p for p, r in done.items() if not r[1])
    gbps = sum(r[2] for r in done.values()) / len(done)
    verdict = f"WRONG on peers {_ids(bad)}" if bad else "ok"
    print(f"step {step:3d}  world {ws}  peers {_ids(done):<14}  {verdict}  busbw {gbps:6.2f} GB/s",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pccl_aio.demo", description=__doc__)
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--count", type=int, default=1 << 21,
                   help=f"float32 elements per all-reduce (above {GATHER_MAX // 4})")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--status-port", type=int, metavar="PORT",
                   help="serve the master's live status page on this port (0: any)")
    p.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                   help="with --status-port: keep the master and its page up SECONDS before "
                   "starting the peers (open the page, then press Enter to start at once) and "
                   "SECONDS after the verdict; Ctrl-C during a hold ends the demo")
    p.add_argument("--peer", metavar="MASTER", help=argparse.SUPPRESS)
    p.add_argument("--stop-file", default="", help=argparse.SUPPRESS)
    p.add_argument("--die-at", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer:
        return run(_peer(args.peer, args.steps, args.count, args.stop_file, args.die_at,
                         args.peers))
    warning = kernel_warning()
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if args.hold < 0 or (args.hold and args.status_port is None):
        p.error("--hold takes a number of seconds >= 0 and needs --status-port")
    if args.peers < 3:
        p.error("--peers must be at least 3 (one is killed, the survivors go on)")
    if args.count * 4 <= GATHER_MAX:  # its inputs can all reach the victim before it dies
        p.error(f"--count must be above {GATHER_MAX // 4}: a smaller all-reduce takes the "
                "small path, which can finish before the victim's kill lands")
    return run(_controller(args))


if __name__ == "__main__":
    sys.exit(main())
