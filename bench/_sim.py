"""Simulated peers and a master process for ``bench/master_scale.py``.

``MasterProc``: a real ``python -m pccl_aio.master`` child (its addresses from its JSON log,
its CPU seconds from ``/proc``). ``Swarm``: many ``SimPeer``s in this process,
each one TCP connection to the master speaking the library's own handshake
(``_net.handshake.connect``), framing and msgspec codec; they open no data-plane listener
(``Hello.p2p_port`` is only advertised), heartbeat every ``interval`` (default: the measured
library's own ``heartbeat_interval``; spread over the interval, as independent peers would),
answer ``CollectiveStart`` with ``CollectiveDone(ok)`` at once (an all-reduce of nothing to
move) and count what they receive in ``Tally``s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
from typing import cast

from pccl_aio._net.handshake import connect
from pccl_aio._net.stream import set_nodelay
from pccl_aio._peer.core.config import PeerConfig
from pccl_aio._types import DataType, ReduceOp
from pccl_aio._wire import auth
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import HEADER_SIZE, body_length, frame

CONNECTING = 32  # handshakes in flight at once (the master's Gate drops the oldest beyond 64)
_ERRORS = (m.Kicked, m.Rejected, m.CollectiveAbort, m.CollectiveRejected, m.VoteRejected)


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_seconds(pid: int) -> float:
    """Seconds process ``pid``'s live threads ran on a CPU (``/proc/<pid>/task/*/schedstat``,
    nanoseconds: the short phases need more than ``cpu_seconds``' 10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError), \
                open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


class MasterProc:
    """A master CLI child process: ``address``, ``status`` and ``metrics`` ("host:port")."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.found: dict[str, str] = {}
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self._drain = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, root: str, args: list[str], timeout: float = 30.0) -> MasterProc:
        """Start ``python -m pccl_aio.master`` in ``root``, first on its ``PYTHONPATH`` too."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PCCL_AIO_SECRET")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0",
            "--status-port", "0", "--metrics-port", "0", "--log-format", "json", *args,
            env=env, cwd=root,  # (``-m`` puts the working directory first on its path)
            stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        self = cls(proc)
        try:
            async with asyncio.timeout(timeout):
                while len(self.found) < 3:
                    if proc.returncode is not None or self._drain.done():
                        break
                    await asyncio.sleep(0.02)  # polling the reader's findings, not a sync
        except TimeoutError:
            pass
        if len(self.found) < 3:
            await self.stop()
            raise SystemExit("FAILED: the master did not start:\n" + "\n".join(self.tail))
        return self

    async def _read(self) -> None:
        """Drain its stderr (a full pipe would block it); pick the addresses from its log."""
        assert self.proc.stderr is not None
        patterns = (("address", r"listening on (\S+:\d+)"),
                    ("status", r"status page on http://(\S+?)/"),
                    ("metrics", r"metrics on http://(\S+?)/"))
        async for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            if len(self.found) < 3:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    msg = json.loads(line)["msg"]
                    for key, pattern in patterns:
                        if found := re.search(pattern, msg):
                            self.found[key] = found.group(1)

    @property
    def address(self) -> str:
        return self.found["address"]

    def cpu(self) -> float:
        return run_seconds(self.proc.pid)

    def cpu_ticks(self) -> float:
        return cpu_seconds(self.proc.pid)

    async def stop(self, grace: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` s (a master closing hundreds of sessions
        re-publishes the membership at each departure: that is not what is measured)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._drain.cancel()


class Tally:
    """Counts one kind of message; ``arm(want)`` resets it and returns a future resolved
    once ``want`` arrived."""

    def __init__(self) -> None:
        self.n, self.want = 0, 0
        self.fut: asyncio.Future[None] | None = None

    def arm(self, want: int) -> asyncio.Future[None]:
        self.n, self.want = 0, want
        self.fut = asyncio.get_running_loop().create_future()
        if want <= 0:
            self.fut.set_result(None)
        return self.fut

    def hit(self) -> None:
        self.n += 1
        if self.fut is not None and not self.fut.done() and self.n >= self.want:
            self.fut.set_result(None)


class SimPeer(asyncio.Protocol):
    """One simulated peer's master session (after the handshake)."""

    def __init__(self, swarm: Swarm) -> None:
        self.swarm = swarm
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.peer_id = 0
        self.member = False
        self.ticket = 0  # CollectiveComplete.next_seq of the last collective
        self.early = 0  # the seq this peer already reported done (on a ticket)
        self.welcomed: asyncio.Future[m.Welcome] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is no subclass)
        set_nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.swarm.fail(f"peer {self.peer_id}: the master closed the connection ({exc!r})")
        if not self.welcomed.done():
            self.welcomed.set_exception(ConnectionError("closed before its Welcome"))
            self.welcomed.exception()  # (retrieved: join's wait reports it, if it waits)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send(self, *msgs: m.PeerToMaster) -> None:
        """``msgs`` in one write, as a peer batches a launch."""
        self.write(b"".join(frame(m.encode(x)) for x in msgs))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        at = 0
        while len(buf) - at >= HEADER_SIZE:
            n = body_length(bytes(buf[at:at + HEADER_SIZE]))
            if len(buf) - at - HEADER_SIZE < n:
                break
            body = bytes(buf[at + HEADER_SIZE:at + HEADER_SIZE + n])
            at += HEADER_SIZE + n
            self.on(m.decode_master_to_peer(body))
        del buf[:at]

    def on(self, msg: m.MasterToPeer) -> None:
        sw = self.swarm
        if isinstance(msg, m.CollectiveStart):
            if msg.seq != self.early:
                self.send(m.CollectiveDone(msg.tag, msg.seq, True))
        elif isinstance(msg, m.CollectiveComplete):
            self.ticket = msg.next_seq
            sw.tally["complete"].hit()
        elif isinstance(msg, m.Membership):
            if not self.member and any(p.peer_id == self.peer_id for p in msg.ring):
                self.member = True
                sw.tally["joined"].hit()
        elif isinstance(msg, m.Welcome):
            self.peer_id = msg.peer_id
            self.welcomed.set_result(msg)
        elif isinstance(msg, m.TopologyUpdated):
            sw.tally["topology"].hit()
        elif isinstance(msg, m.PeersPendingAnswer):
            sw.pending_true += msg.pending
            sw.tally["pending"].hit()
        elif isinstance(msg, m.PeersWaiting):
            if msg.waiting:
                sw.tally["waiting"].hit()
        elif isinstance(msg, _ERRORS):
            sw.fail(f"peer {self.peer_id} got {msg!r}")

    def launch(self, tag: int, tickets: bool) -> None:
        """An awaited all-reduce of 8 float32 (SUM): ``CollectiveInit(awaited=True)``, as a
        peer launches what its caller awaits; on a ticket (``tickets``) its done report in the
        same write (nothing to move)."""
        seq = self.ticket if tickets else 0
        msgs: list[m.PeerToMaster] = [
            m.CollectiveInit(tag, 8, int(DataType.FLOAT32), int(ReduceOp.SUM), seq=seq,
                             awaited=True)]
        if seq:
            msgs.append(m.CollectiveDone(tag, seq, True))
        self.early = seq
        self.send(*msgs)


class Swarm:
    """The simulated peers of one master; ``members`` are the accepted ones, in join order."""

    def __init__(self, address: str, key: bytes, interval: float | None = None) -> None:
        host, port = address.rsplit(":", 1)
        if interval is None:  # a peer's default
            interval = next(f.default for f in dataclasses.fields(PeerConfig)
                            if f.name == "heartbeat_interval")
            assert isinstance(interval, float)
        self.host, self.port, self.key, self.interval = host, int(port), key, interval
        self.peers: list[SimPeer] = []
        self.members: list[SimPeer] = []
        self.tally = {k: Tally() for k in ("complete", "joined", "topology", "pending",
                                           "waiting")}
        self.pending_true = 0
        self.sim_pct = 0.0  # this process's CPU in the last timed phase, % of one core
        self.error: str | None = None
        self.closing = False
        self._beat = asyncio.ensure_future(self._heartbeats())

    def fail(self, why: str) -> None:
        if self.closing or self.error is not None:
            return
        self.error = why
        for t in self.tally.values():
            if t.fut is not None and not t.fut.done():
                t.fut.set_exception(RuntimeError(why))
                t.fut.exception()  # (retrieved: ``wait`` reports it, if it waits)

    async def wait(self, fut: asyncio.Future[None], what: str, timeout: float = 120.0) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            raise SystemExit(f"FAILED: timed out waiting for {what}") from None
        except RuntimeError as exc:
            raise SystemExit(f"FAILED while waiting for {what}: {exc}") from None

    async def join(self, n: int, group: int = 0) -> list[SimPeer]:
        """Connect ``n`` peers, say ``Hello``; returns them once each has its ``Welcome``."""
        gate = asyncio.Semaphore(CONNECTING)

        async def one(i: int) -> SimPeer:
            peer = SimPeer(self)
            async with gate:
                await asyncio.wait_for(connect(self.host, self.port, None, auth.ROLE_MASTER,
                                               self.key, 0, 0, peer), 30.0)
            peer.send(m.Hello(m.PROTOCOL_VERSION, group, 20000 + (len(self.peers) + i) % 40000))
            await asyncio.wait_for(asyncio.shield(peer.welcomed), 30.0)
            return peer

        joined = await asyncio.gather(*(one(i) for i in range(n)))
        self.peers.extend(joined)
        return list(joined)

    def send_all(self, peers: list[SimPeer], msg: m.PeerToMaster) -> None:
        data = frame(m.encode(msg))
        for p in peers:
            p.write(data)

    async def _heartbeats(self, slices: int = 10) -> None:
        """A ``Heartbeat`` from every peer each ``interval``, a tenth of them at a time."""
        beat = frame(m.encode(m.Heartbeat()))
        i = 0
        while True:
            await asyncio.sleep(self.interval / slices)  # the beacons' period, spread out
            for p in self.peers[i % slices::slices]:
                p.write(beat)
            i += 1

    def close(self) -> None:
        self.closing = True
        self._beat.cancel()
        for p in self.peers:
            if p.transport is not None:
                p.transport.abort()
