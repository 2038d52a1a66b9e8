"""Issue 17: a master process with a run secret, fuzzed over real sockets (``socket_fuzz.py``,
in its own process: at least 10^5 frames of a fixed seed, before and after the handshake)
while a real group of 2 peers reduces exactly throughout. The master stays alive and admitting,
its memory bounded, and no fuzz client ever enters the ring."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pccl_aio as pccl
from pccl_aio._net.handshake import LOG_BURST, LOG_WINDOW
from tests.helpers import FAST, admit, raw_master, rss
from tests.process.procs import HERE as PROCESS
from tests.process.procs import Proc, spawn

FUZZER = str(Path(__file__).resolve().parent / "socket_fuzz.py")
FRAMES = 100_000
SEED = 17
COUNT = 64 << 10  # float32 elements per all-reduce
HEARTBEAT_TIMEOUT = 2.0


async def _lines(stream: asyncio.StreamReader | None, into: list[str]) -> None:
    """Keep reading a child's pipe (a full pipe would block the child's logging)."""
    assert stream is not None
    while line := await stream.readline():
        into.append(line.decode(errors="replace").rstrip())


class Group:
    """Two peers reducing continuously, checking every result, timing every step."""

    def __init__(self, comms: list[pccl.Communicator]) -> None:
        self.comms = comms
        rng = np.random.default_rng(SEED)
        # Small integers: every sum is exact in float32, so results compare with ==.
        self.bases = [rng.integers(-1000, 1000, COUNT).astype(np.float32) for _ in comms]
        self.steps = 0
        self.done_at: list[float] = []  # loop time of each completed step
        self.rss: list[int] = []  # the master's RSS after each step (if watched)
        self.watch: int | None = None
        self.stop = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop.is_set():
            self.steps += 1
            k = np.float32(self.steps % 1000)
            xs = [b + k for b in self.bases]
            want = sum(self.bases) + k * len(xs)
            await asyncio.gather(*(c.all_reduce(x) for c, x in zip(self.comms, xs)))
            for i, x in enumerate(xs):
                assert np.array_equal(x, want), f"step {self.steps}, peer {i}: wrong result"
            sizes = [(c.world_size, c.peer_group_world_size) for c in self.comms]
            assert sizes == [(2, 2)] * 2, f"step {self.steps}: world sizes {sizes}"
            self.done_at.append(loop.time())
            if self.watch is not None:
                self.rss.append(rss(self.watch))


async def _fuzz(port: int, secret: str, frames: int, seed: int, group: Group
                ) -> tuple[dict[str, Any], int, float, float]:
    """Run the fuzzer's process; (its stats, steps and longest gap between steps during
    the fuzz, seconds of fuzz)."""
    fuzzer = await spawn("fuzzer", FUZZER, "--frames", str(frames), "--seed", str(seed),
                         "--port", str(port), "--secret", secret, "--json")
    err: list[str] = []
    errors = asyncio.ensure_future(_lines(fuzzer.proc.stderr, err))
    try:
        assert json.loads(await fuzzer.line())["event"] == "start"
        loop = asyncio.get_running_loop()
        t0, first = loop.time(), len(group.done_at)
        stats = json.loads(await fuzzer.line(90))
        t1 = loop.time()
        assert await fuzzer.proc.wait() in (0, 1), err[-20:]
    finally:
        fuzzer.signal(signal.SIGKILL)
        await fuzzer.proc.wait()
        await errors
    assert not err, "the fuzzer's stderr:\n" + "\n".join(err[-30:])
    times = [t0, *group.done_at[first:], t1]
    gap = max(b - a for a, b in itertools.pairwise(times))
    return stats, len(group.done_at) - first, gap, t1 - t0


@pytest.mark.timeout(120)
async def test_socket_fuzz_of_the_authenticated_master_while_a_group_reduces():
    secret = secrets.token_hex(16)
    master: Proc = await spawn("master", str(PROCESS / "masterproc.py"), str(HEARTBEAT_TIMEOUT),
                               env={"PCCL_AIO_SECRET": secret})
    log: list[str] = []
    logging_ = asyncio.ensure_future(_lines(master.proc.stderr, log))
    comms: list[pccl.Communicator] = []
    reducing: asyncio.Future[None] | None = None
    try:
        port = int(await master.line())
        addr = f"127.0.0.1:{port}"
        comms = [pccl.Communicator(addr, secret=secret, **FAST) for _ in range(2)]
        await comms[0].connect()
        await admit(comms[:1], comms[1])
        group = Group(comms)
        reducing = asyncio.ensure_future(group.run())

        started = asyncio.get_running_loop().time()
        # Warm-up: the master's code paths (and allocator) see every kind of fuzz once.
        warm, _, _, _ = await _fuzz(port, secret, 5_000, SEED + 1, group)
        assert not warm["anomalies"], warm["anomalies"]
        before = rss(master.proc.pid)
        group.watch = master.proc.pid

        stats, steps, gap, seconds = await _fuzz(port, secret, FRAMES, SEED, group)
        group.watch = None
        after = rss(master.proc.pid)
        peak = max([after, *group.rss])
        group.stop.set()
        await asyncio.wait_for(reducing, 10)
        summary = {k: stats[k] for k in (
            "frames", "connections", "pre_handshake_frames", "refused", "accepted",
            "after_handshake_frames", "hellos", "closed_by_master", "lingered", "admitted")}
        print(f"\nsocket fuzz: {seconds:.1f} s, {steps} steps during it (longest gap "
              f"{gap:.3f} s), master RSS {before >> 20} -> {after >> 20} MiB (peak "
              f"{peak >> 20} MiB); {summary}; refusals {stats['refusals']}; endings "
              f"{stats['endings']}; replies {stats['replies']}")

        # The fuzz happened, and was not vacuous.
        assert not stats["anomalies"], stats["anomalies"]
        assert stats["frames"] >= FRAMES, stats
        for k in ("pre_handshake_frames", "refused", "accepted", "after_handshake_frames",
                  "hellos", "closed_by_master", "lingered"):
            assert stats[k] > 0, (k, stats)
        assert stats["replies"].get("Kicked", 0) > 0 and stats["replies"].get("Welcome", 0) > 0
        # No fuzz client became a member (the group never ran update_topology).
        assert stats["admitted"] == 0, stats
        # The group reduced exactly (checked at every step) and was never stuck.
        assert steps >= 20, (steps, seconds)
        assert gap < HEARTBEAT_TIMEOUT / 2, f"the group stalled {gap:.2f} s"
        # The master: alive, memory bounded, and still admitting an honest client.
        assert master.proc.returncode is None
        assert peak - before < 64 << 20, f"master grew by {(peak - before) >> 20} MiB"
        _, writer = await raw_master(port, secret)
        writer.close()
        assert master.proc.returncode is None
        # Refusals logged (rate-limited: LOG_BURST lines per LOG_WINDOW, then a count), and
        # nothing worse in the master's log.
        refused = sum("refused a connection" in line for line in log)
        windows = 2 + int((asyncio.get_running_loop().time() - started) // LOG_WINDOW)
        assert min(LOG_BURST, stats["refused"]) <= refused <= LOG_BURST * windows, (
            refused, stats["refused"])
        assert not [line for line in log if "Traceback" in line or "exception" in line.lower()], (
            "\n".join(log[-40:]))
    finally:
        if reducing is not None and not reducing.done():
            reducing.cancel()
            with contextlib.suppress(BaseException):
                await reducing
        for c in comms:
            with contextlib.suppress(Exception):
                await c.close()
        master.signal(signal.SIGKILL)
        await master.proc.wait()
        await logging_
