"""Master failover (issue 20): seconds from the master's death to the first all-reduce
completed on every peer after its restart (P = 3); the restart delay is the baseline.

    python bench/master_recovery.py [--delay 1.0[,0.5,2]] [--repeat 5] [--peers 3]

Real processes: a master (``tests/process/masterproc.py``: heartbeat every 0.2 s, timeout
``--master-heartbeat-timeout``, recovery grace its default, the heartbeat timeout) and
``--peers`` peer processes (this script with ``--peer``: heartbeat every 0.1 s, timeout 1 s)
that loop small all-reduces (4 KiB float32 SUM, checked), retry on ``PeerLostError``
(``MasterLostError`` included) and print ``time.time()`` per completed all-reduce. For each of
``--repeat`` kills per delay: the bench SIGKILLs the master, waits the delay, starts a new
master on the same port, and takes the first all-reduce each peer completes after that start;
recovery = the latest of those (the slowest peer) minus the kill. Excess = recovery - delay,
target <= 1 s. ``start_s`` is the new master process's own start (spawn to listening: the
interpreter and imports), part of the excess. Figures: medians over the kills.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from _common import emit_json, print_table  # noqa: E402

MASTER = str(ROOT / "tests" / "process" / "masterproc.py")
PACE = 0.005  # s between a peer's all-reduces: pacing (the resolution of the figure), not a sync


# ---- a peer process ----------------------------------------------------------------------------
async def peer_main(addr: str, world: int) -> None:
    import numpy as np

    import pccl_aio as pccl

    comm = pccl.Communicator(addr, heartbeat_interval=0.1, heartbeat_timeout=1.0,
                             master_timeout=60.0)
    await comm.connect(attempts=20)
    while comm.peer_group_world_size < world:
        await comm.update_topology()
    want = np.full(1024, float(sum(range(1, world + 1))), np.float32)
    x = np.empty(1024, np.float32)
    print(json.dumps({"event": "ready", "peer": comm.peer_id}), flush=True)
    try:
        while True:
            x[:] = float(RANK + 1)  # peer i contributes i + 1: the SUM is 1 + ... + P
            try:
                await comm.all_reduce(x, op=pccl.ReduceOp.SUM)
            except pccl.PeerLostError:
                continue  # the master (or a peer) was lost: retry (x was restored)
            if not np.array_equal(x, want):
                print(json.dumps({"event": "wrong", "got": float(x[0])}), flush=True)
                return
            print(json.dumps({"t": time.time()}), flush=True)
            await asyncio.sleep(PACE)  # pacing, see PACE
    finally:
        await comm.close()


RANK = int(os.environ.get("BENCH_RANK", "0"))


# ---- the bench ---------------------------------------------------------------------------------
class Child:
    """A child process: its stdout lines as they come (``lines``), its stderr's tail."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc, self.name = proc, name
        self.times: list[float] = []
        self.first: asyncio.Queue[str] = asyncio.Queue()
        self.err: collections.deque[bytes] = collections.deque(maxlen=100)
        self._tasks = [asyncio.ensure_future(self._out()), asyncio.ensure_future(self._err())]

    async def _out(self) -> None:
        assert self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            line = raw.decode().strip()
            if line.startswith('{"t"'):
                self.times.append(json.loads(line)["t"])
            else:
                await self.first.put(line)

    async def _err(self) -> None:
        assert self.proc.stderr is not None
        while raw := await self.proc.stderr.readline():
            self.err.append(raw)

    async def line(self, timeout: float) -> str:
        try:
            return await asyncio.wait_for(self.first.get(), timeout)
        except TimeoutError:
            raise SystemExit(f"FAILED: {self.name} said nothing for {timeout:g} s:\n"
                             f"{b''.join(self.err).decode()[-3000:]}") from None

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        for t in self._tasks:
            t.cancel()


async def start(name: str, *args: str, env: dict[str, str] | None = None) -> Child:
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env or {})})
    return Child(proc, name)


async def completed_after(peers: list[Child], since: float, timeout: float) -> list[float]:
    """Each peer's first all-reduce completed at or after ``since`` (wall clock)."""
    end = time.monotonic() + timeout
    while True:
        firsts = [next((t for t in p.times if t >= since), None) for p in peers]
        if all(f is not None for f in firsts):
            return [f for f in firsts if f is not None]
        for p in peers:
            if p.proc.returncode is not None:
                raise SystemExit(f"FAILED: {p.name} exited:\n{b''.join(p.err).decode()[-3000:]}")
        if time.monotonic() > end:
            raise SystemExit(f"FAILED: no all-reduce on every peer {timeout:g} s after "
                             f"the restart: {firsts}\n"
                             + "\n".join(f"{p.name}: {b''.join(p.err).decode()[-1500:]}"
                                         for p in peers))
        await asyncio.sleep(0.01)  # polling the readers' lists, not a synchronisation


async def bench(a: argparse.Namespace) -> None:
    margs = [str(a.master_heartbeat_timeout), "0"]
    master = await start("master", MASTER, *margs)
    port = int(await master.line(30))
    margs[1] = str(port)
    addr = f"127.0.0.1:{port}"
    peers = [await start(f"peer{i}", __file__, "--peer", addr, "--peers", str(a.peers),
                         env={"BENCH_RANK": str(i)}) for i in range(a.peers)]
    rows: list[dict[str, object]] = []
    try:
        for p in peers:
            ready = json.loads(await p.line(60))
            assert ready["event"] == "ready", ready
        await completed_after(peers, time.time(), 30)
        for delay in a.delays:
            for k in range(a.repeat):
                await asyncio.sleep(a.settle)  # steady state between kills (pacing)
                t_kill = time.time()
                await master.kill()
                await asyncio.sleep(delay)  # the restart delay: the quantity under test
                t_spawn = time.time()
                master = await start("master", MASTER, *margs)
                await master.line(30)  # its port: listening
                t_up = time.time()
                firsts = await completed_after(peers, t_spawn, 60)
                rec = max(firsts) - t_kill
                rows.append({"delay_s": delay, "kill": k + 1, "recovery_s": rec,
                             "excess_s": rec - delay, "start_s": t_up - t_spawn,
                             "after_listen_s": max(firsts) - t_up,
                             "peers_s": [round(f - t_kill, 3) for f in firsts]})
                print(f"# delay {delay:g} s, kill {k + 1}: recovery {rec:.3f} s "
                      f"(master start {t_up - t_spawn:.3f} s)", flush=True)
    finally:
        for c in [*peers, master]:
            await c.kill()
    summary = []
    for delay in a.delays:
        rs = [r for r in rows if r["delay_s"] == delay]
        med = statistics.median(float(r["recovery_s"]) for r in rs)  # type: ignore[arg-type]
        summary.append({
            "delay_s": delay, "kills": len(rs), "recovery_s": med,
            "min_s": min(float(r["recovery_s"]) for r in rs),  # type: ignore[arg-type]
            "max_s": max(float(r["recovery_s"]) for r in rs),  # type: ignore[arg-type]
            "start_s": statistics.median(float(r["start_s"]) for r in rs),  # type: ignore[arg-type]
            "excess_s": med - delay, "target": "<= 1.0",
            "ok": "yes" if med - delay <= 1.0 else "NO"})
    print(f"# master failover: P = {a.peers}, master heartbeat 0.2 s / timeout "
          f"{a.master_heartbeat_timeout:g} s, recovery grace = that timeout, peers heartbeat "
          f"0.1 s / timeout 1 s, all-reduce 4 KiB f32 SUM every {PACE * 1e3:g} ms; "
          f"figures = medians over kills")
    print_table(summary, ["delay_s", "kills", "recovery_s", "min_s", "max_s", "start_s",
                          "excess_s", "target", "ok"])
    emit_json("master_recovery", summary, peers=a.peers, kills=rows,
              master_heartbeat_timeout=a.master_heartbeat_timeout, peer_heartbeat=[0.1, 1.0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", default="1.0",
                    help="restart delays, s, comma-separated (default 1.0)")
    ap.add_argument("--repeat", type=int, default=5, help="kills per delay (default 5)")
    ap.add_argument("--peers", type=int, default=3)
    ap.add_argument("--master-heartbeat-timeout", type=float, default=1.0)
    ap.add_argument("--settle", type=float, default=1.0,
                    help="seconds of steady all-reduces before each kill (default 1)")
    ap.add_argument("--peer", metavar="ADDR", help=argparse.SUPPRESS)  # a peer process
    a = ap.parse_args()
    if a.peer:
        import pccl_aio as pccl

        pccl.run(peer_main(a.peer, a.peers))
        return
    a.delays = [float(d) for d in a.delay.split(",")]
    asyncio.run(bench(a))


if __name__ == "__main__":
    main()
