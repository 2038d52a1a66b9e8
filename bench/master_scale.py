"""The master's cost per peer: admission, lock-step tiny collectives, idle heartbeats and its
HTTP pages, at P = 4 ... 256 (or more) simulated peers.

    PYTHONPATH=. python bench/master_scale.py --peers 4 16 64 256 [--json FILE]
    python bench/master_scale.py --root /tmp/before   # the master (and codec) of another tree

A real master process (``python -m pccl_aio.master``, the same interpreter, ``--root`` first
on its PYTHONPATH; default: the tree this process imports ``pccl_aio`` from) and P simulated
peers in this process (``_sim.py``: real sockets on 127.0.0.1, the library's handshake,
framing and codec, heartbeats at a peer's default interval, no data plane). Master CPU: the
run time of its threads, ``/proc/<pid>/task/*/schedstat`` (ns), read around each phase
(``coll_us_stat`` in the JSON: the same from utime + stime of ``/proc/<pid>/stat``, 10 ms
ticks, to check).
For each P, a fresh master:

- admit: P - N members up (N = min(P/2, 256) joiners; built in batches), the N joiners
  connect, say ``Hello`` and heartbeat; once every member got ``PeersWaiting(True)`` the
  members vote ``VotePeersPending`` then ``VoteUpdateTopology``: ``admit_s`` = first vote to
  the last joiner's ``Membership`` naming it (target: 256 joiners <= 1 s); ``hello_s``: the
  N connections, handshakes and ``Welcome``s before it;
- idle: ``--idle`` s of heartbeats only: master CPU in % of one core, and per peer;
- coll: lock-step all-reduces of 8 float32 (SUM, tag 0): every peer sends an awaited
  ``CollectiveInit`` (its wait in the same message, as a peer's launch), answers
  ``CollectiveStart`` with ``CollectiveDone``, and the next round starts when every peer has
  its ``CollectiveComplete`` (``--tickets``: on the ``next_seq`` ticket, as a real peer
  does); K rounds for ``--seconds``, in ``--windows`` windows: master CPU / (K x P) =
  ``coll_us`` per peer-collective (``net_us``: less the idle rate), and wall ms per
  collective, each the median over the windows (a 2-core machine's neighbours come and go;
  ``coll_us_all`` in the JSON: over all of them);
- http: median of ``--gets`` GETs of ``/``, ``/status.json`` and ``/metrics``;
- floor (``--floor``): the same lock step against a bare ``epoll`` loop in its own process
  that answers each 12-byte frame with one (no asyncio, no codec, no state): two frames in
  and two out per peer-collective, as the master's init, start, done and complete.
  ``floor_us``: its CPU per peer-collective, what the syscalls of those four frames cost a
  Python process here; ``coll_floor_x`` = ``coll_us`` / ``floor_us``.

Ratios (``_x``) are against the first P of the run (the baseline): flat = O(1) per peer. A
table, then one JSON line (also written to ``--json FILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import print_table  # noqa: E402

if TYPE_CHECKING:
    from _sim import Swarm

MAX_BATCH = 256  # the master's default max_pending_peers: joiners waiting at once


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peers", type=int, nargs="+", default=[4, 16, 64, 256])
    p.add_argument("--seconds", type=float, default=3.0, help="timed collectives per P")
    p.add_argument("--windows", type=int, default=3,
                   help="the collectives' time in windows: figures are their median")
    p.add_argument("--idle", type=float, default=5.0, help="idle seconds measured per P")
    p.add_argument("--gets", type=int, default=5, help="GETs of each HTTP page per P")
    p.add_argument("--tickets", action="store_true",
                   help="collectives on their tickets (CollectiveComplete.next_seq)")
    p.add_argument("--secret", action="store_true", help="run the master with a run secret")
    p.add_argument("--log-level", default="info", help="the master's --log-level")
    p.add_argument("--root", help="directory holding the pccl_aio to measure (default: the "
                                  "one on this process's path)")
    p.add_argument("--floor", action="store_true",
                   help="also measure a bare epoll loop's CPU for the same frames")
    p.add_argument("--json", metavar="FILE", help="also write the JSON object here")
    args = p.parse_args()
    if args.root:
        sys.path.insert(0, os.path.abspath(args.root))
    else:  # PYTHONPATH first, else this checkout
        sys.path.append(str(HERE.parent))
    if min(args.peers) < 2:
        p.error("--peers: at least 2 (one member and one joiner)")
    return args


class Meter:
    """Wall and master-CPU seconds since ``reset`` (and the CPU in 10 ms ticks, ``ticks``)."""

    def __init__(self, cpu: Callable[[], float], ticks: Callable[[], float]) -> None:
        self._cpu, self._ticks = cpu, ticks
        self.reset()

    def reset(self) -> None:
        self.t0, self.c0, self.k0 = time.perf_counter(), self._cpu(), self._ticks()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.t0, self._cpu() - self.c0

    def ticks(self) -> float:
        return self._ticks() - self.k0


async def grow(swarm: Swarm, target: int) -> None:
    """Admit peers until ``target`` are members: the first alone, then batches voted in by
    ``VoteUpdateTopology`` of every member."""
    while len(swarm.members) < target:
        have = len(swarm.members)
        n = min(MAX_BATCH, target - have) if have else 1
        joined = swarm.tally["joined"].arm(n)
        topo = swarm.tally["topology"].arm(have)
        peers = await swarm.join(n)
        if have:
            from pccl_aio._wire import messages as m

            swarm.send_all(swarm.members, m.VoteUpdateTopology())
        await swarm.wait(joined, f"{n} peers to join {have}")
        await swarm.wait(topo, "TopologyUpdated")
        swarm.members.extend(peers)


async def admit(swarm: Swarm, meter: Meter, n: int) -> dict[str, float]:
    """The timed admission of ``n`` joiners (see the module docstring)."""
    from pccl_aio._wire import messages as m

    members = list(swarm.members)
    waiting = swarm.tally["waiting"].arm(len(members))
    meter.reset()
    joiners = await swarm.join(n)
    swarm.send_all(joiners, m.Heartbeat())  # heard after its Hello: a live joiner
    hello_s, hello_cpu = meter.read()
    await swarm.wait(waiting, "PeersWaiting(True) at every member")
    pending = swarm.tally["pending"].arm(len(members))
    joined = swarm.tally["joined"].arm(n)
    topo = swarm.tally["topology"].arm(len(members))
    swarm.pending_true = 0
    meter.reset()
    swarm.send_all(members, m.VotePeersPending())
    await swarm.wait(pending, "PeersPendingAnswer")
    if swarm.pending_true != len(members):
        raise SystemExit(f"FAILED: {swarm.pending_true} of {len(members)} pending answers True")
    swarm.send_all(members, m.VoteUpdateTopology())
    await swarm.wait(joined, f"{n} joiners' Membership")
    admit_s, admit_cpu = meter.read()
    await swarm.wait(topo, "TopologyUpdated")
    swarm.members.extend(joiners)
    return {"N": n, "hello_s": hello_s, "hello_cpu_ms": hello_cpu * 1e3, "admit_s": admit_s,
            "admit_cpu_ms": admit_cpu * 1e3}


async def collectives(swarm: Swarm, meter: Meter, seconds: float, windows: int,
                      tickets: bool) -> list[tuple[int, float, float, float]]:
    """Lock-step rounds for ``seconds`` in ``windows`` windows (a round at least in each),
    after 1-3 untimed; per window (K, wall s, master CPU s, the same in 10 ms ticks)."""
    peers = swarm.members

    async def one_round() -> None:
        done = swarm.tally["complete"].arm(len(peers))
        for p in peers:
            p.launch(0, tickets)
        await swarm.wait(done, f"CollectiveComplete at {len(peers)} peers", 60.0)

    warm = time.perf_counter()
    for _ in range(3):  # (fewer where a round takes seconds)
        await one_round()
        if time.perf_counter() - warm > 1.0:
            break
    out = []
    sim0, t0 = time.process_time(), time.perf_counter()
    for _ in range(windows):
        meter.reset()
        k = 0
        while k < 1 or time.perf_counter() - meter.t0 < seconds / windows:
            await one_round()
            k += 1
        out.append((k, *meter.read(), meter.ticks()))
    swarm.sim_pct = 100 * (time.process_time() - sim0) / (time.perf_counter() - t0)
    return out


FLOOR = r"""
import select, socket, sys, time
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(4096)
print(srv.getsockname()[1], flush=True)
conns, ep = {}, select.epoll()
for _ in range(int(sys.argv[1])):
    c = srv.accept()[0]
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conns[c.fileno()] = c
    ep.register(c, select.EPOLLIN)
sys.stdin.readline()
t0, n = time.process_time(), 0
while True:
    for fd, _ in ep.poll():
        data = conns[fd].recv(4096)
        if not data:
            print(time.process_time() - t0, n, flush=True)
            sys.exit()
        conns[fd].sendall(data)
        n += len(data) // 12
"""


def floor_us(peers: int, seconds: float) -> float:
    """CPU us per peer-collective of a bare epoll loop answering 2 frames of each of
    ``peers`` connections per lock-step round (blocks ``seconds`` and more)."""
    import socket

    proc = subprocess.Popen([sys.executable, "-c", FLOOR, str(peers)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    port = int(proc.stdout.readline())
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(peers)]
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    frame, k, t0 = b"\0" * 12, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(2):  # (init, start), then (done, complete)
            for s in socks:
                s.sendall(frame)
            for s in socks:
                if len(s.recv(12, socket.MSG_WAITALL)) != 12:
                    raise SystemExit("FAILED: the floor loop closed a connection")
        k += 1
    for s in socks:
        s.close()
    cpu, frames = proc.stdout.readline().split()
    proc.wait(30)
    if int(frames) != 2 * k * peers:
        raise SystemExit(f"FAILED: the floor loop answered {frames} frames, not {2 * k * peers}")
    return float(cpu) / (k * peers) * 1e6


async def http_ms(address: str, path: str, gets: int) -> float:
    """Median ms of ``gets`` GETs of ``path`` (connect, request, whole answer)."""
    host, port = address.rsplit(":", 1)
    times = []
    for _ in range(gets):
        t0 = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
                     .encode())
        body = await reader.read()
        times.append(time.perf_counter() - t0)
        writer.close()
        if not body.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"FAILED: GET {path}: {body[:200]!r}")
    return statistics.median(times) * 1e3


async def measure(args: argparse.Namespace, root: str, peers: int, key: bytes,
                  master_args: list[str]) -> dict[str, Any]:
    from _sim import MasterProc, Swarm

    master = await MasterProc.start(root, master_args)
    swarm = Swarm(master.address, key)
    row: dict[str, Any] = {"P": peers}
    try:
        meter = Meter(master.cpu, master.cpu_ticks)
        n = min(peers // 2, MAX_BATCH)
        await grow(swarm, peers - n)
        row.update(await admit(swarm, meter, n))
        row["admit_us_per_joiner"] = row["admit_cpu_ms"] * 1e3 / n
        await asyncio.sleep(1.0)  # the membership's echoes settle
        meter.reset()
        sim0 = time.process_time()
        await asyncio.sleep(args.idle)  # the idle window itself
        wall, cpu = meter.read()
        idle_rate = cpu / wall
        row.update(idle_pct=100 * idle_rate, idle_us_per_peer_s=idle_rate * 1e6 / peers,
                   sim_idle_pct=100 * (time.process_time() - sim0) / wall)
        wins = await collectives(swarm, meter, args.seconds, args.windows, args.tickets)
        k, wall, cpu, ticks = (sum(w[i] for w in wins) for i in range(4))
        med = statistics.median
        row.update(K=int(k), coll_ms=med(w[1] / w[0] for w in wins) * 1e3,
                   coll_us=med(w[2] / (w[0] * peers) for w in wins) * 1e6,
                   net_us=med((w[2] - idle_rate * w[1]) / (w[0] * peers) for w in wins) * 1e6,
                   coll_us_stat=ticks / (k * peers) * 1e6, coll_us_all=cpu / (k * peers) * 1e6,
                   coll_cpu_pct=100 * cpu / wall, sim_coll_pct=swarm.sim_pct)
        for name, where, path in (("get_page_ms", "status", "/"),
                                  ("get_json_ms", "status", "/status.json"),
                                  ("get_metrics_ms", "metrics", "/metrics")):
            row[name] = await http_ms(master.found[where], path, args.gets)
        if args.floor:
            row["floor_us"] = await asyncio.to_thread(floor_us, peers, args.seconds)
            row["coll_floor_x"] = row["coll_us"] / row["floor_us"]
        if swarm.error:  # (one no phase waited on: e.g. a peer kicked while idle)
            raise SystemExit(f"FAILED: {swarm.error}")
    finally:
        await master.stop()
        swarm.close()
    return row


def _commit(root: str) -> str:
    """The commit of ``root``'s tree, ``+dirty`` if its pccl_aio has changes."""
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", root, *a], capture_output=True, text=True).stdout
    rev = git("rev-parse", "--short", "HEAD").strip() or "?"
    return rev + ("+dirty" if git("status", "--porcelain", "--", "pccl_aio").strip() else "")


async def main(args: argparse.Namespace) -> None:
    import pccl_aio
    from pccl_aio._wire import auth

    root = str(Path(pccl_aio.__file__).resolve().parent.parent)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # P sockets here and there
    want = min(hard, max(soft, 2 * max(args.peers) + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    master_args = ["--log-level", args.log_level]
    key = b""
    if args.secret:
        secret = secrets.token_hex(32)
        path = os.path.join(tempfile.mkdtemp(), "run.secret")
        Path(path).write_text(secret)
        master_args += ["--secret-file", path]
        key = auth.secret_key(secret)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    print(f"# master of {root} ({_commit(root)}), {started}, {os.cpu_count()} CPUs"
          f"{', tickets' if args.tickets else ''}{', run secret' if args.secret else ''}",
          flush=True)
    rows = []
    for p in args.peers:
        rows.append(await measure(args, root, p, key, master_args))
        print(f"# P={p} done: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    base = rows[0]
    for r in rows:
        for col, of in (("coll_x", "coll_us"), ("net_x", "net_us"),
                        ("idle_x", "idle_us_per_peer_s"), ("admit_x", "admit_us_per_joiner"),
                        ("page_x", "get_page_ms"), ("metrics_x", "get_metrics_ms")):
            r[col] = r[of] / base[of] if base[of] else None
    print_table(rows, ["P", "N", "hello_s", "admit_s", "admit_cpu_ms", "admit_x", "idle_pct",
                       "idle_x", "K", "coll_ms", "coll_us", "coll_x", "net_us", "net_x"],
                {"hello_s": ".3f", "admit_s": ".3f", "admit_cpu_ms": ".0f", "idle_pct": ".2f",
                 "coll_ms": ".2f", "coll_us": ".1f", "net_us": ".1f", "admit_x": ".2f",
                 "idle_x": ".2f", "coll_x": ".2f", "net_x": ".2f"})
    if args.floor:
        print()
        print_table(rows, ["P", "coll_us", "floor_us", "coll_floor_x"],
                    {"coll_us": ".1f", "floor_us": ".1f", "coll_floor_x": ".2f"})
    print()
    print_table(rows, ["P", "get_page_ms", "page_x", "get_json_ms", "get_metrics_ms",
                       "metrics_x"], {"page_x": ".2f", "metrics_x": ".2f"})
    last = rows[-1]
    print(f"\nadmission of {last['N']} joiners next to {last['P'] - last['N']} members: "
          f"{last['admit_s']:.3f} s (target: 256 joiners <= 1 s); master CPU per "
          f"peer-collective at P={last['P']}: {last['coll_us']:.1f} us = "
          f"{last['coll_x']:.2f} x P={base['P']}'s")
    out = json.dumps({"bench": "master_scale", "root": root, "commit": _commit(root),
                      "started": started, "tickets": args.tickets, "secret": args.secret,
                      "seconds": args.seconds, "idle_s": args.idle, "rows": rows})
    print(out)
    if args.json:
        Path(args.json).write_text(out + "\n")


if __name__ == "__main__":
    arguments = _parse()
    import pccl_aio as pccl

    pccl.run(main(arguments))
