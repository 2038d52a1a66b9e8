"""Churn orchestrator (PCCL scenario 37, issue 20): peers are spawned and SIGKILLed at random
while the others run a DDP loop (shared-state sync + all-reduce with retry), and the master is
SIGKILLed and restarted on its port (after 0.2-1.5 s) or SIGSTOPped for 1-4 s; every peer
reports its state hash after each sync.

    python tests/stress/churn.py --seconds 600 [--seed 1]      # the long mode (master every ~60 s)
    python tests/stress/churn.py --seconds 120 --master-every 15
    python tests/stress/churn.py --seconds 3600 --master-every 0  # peers only
    PCCL_TEST_LOG=INFO python tests/stress/churn.py --logdir /tmp/churn  # keep every log

Pass: at every revision all reported hashes are identical, and the run keeps making
progress (a sync at least every ``--stall`` seconds, and one after the last master event).
The test suite runs it bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import socket
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKER = str(HERE.parent / "process" / "state_worker.py")
INSIDER = str(HERE / "insider.py")
#: With insiders: what each does in turn (``insider.py``'s ways, and an honest peer frozen past
#: the heartbeat timeout), and the run's secrets and vote timeout (every process gets them).
INSIDER_WAYS = ("term", "overflow", "claim", "freeze", "mute", "count", "silent", "guess")
INSIDER_ENV = {"PCCL_AIO_SECRET": "Qm4-Tz8Wk2Xc6Vb0Np3Lr7Hs1Dg5Fj9Ay2Ue6Io0Pw4",
               "MASTER_SECRET": "Zr5Hy1Uc9Ke3Wn7Qb2Lt6Xs0Gv4Mj8Dp1Fa5Co9Ei3",
               "VOTE_TIMEOUT": "3"}
FREEZE_S = 3.0  # an honest peer's freeze: past the heartbeat timeout (2 s)
MASTER = str(HERE.parent / "process" / "masterproc.py")
MASTER_HEARTBEAT_TIMEOUT = 2.0  # the master's, s (masterproc's default; peers also use 2 s)


class Proc:
    """A child process that prints one JSON event per line (no pytest here: the long mode and
    ``--help`` run with only the package installed). Its stderr is drained as it comes (a
    long-lived process that logs would otherwise block on a full pipe); the tail is kept."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str,
                 log: Path | None = None) -> None:
        self.proc, self.name, self.log = proc, name, log
        self._err: collections.deque[bytes] = collections.deque(maxlen=200)
        self._drain = asyncio.ensure_future(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        with open(self.log, "ab") if self.log else contextlib.nullcontext() as f:
            while raw := await self.proc.stderr.readline():
                self._err.append(raw)
                if f is not None:
                    f.write(raw)

    async def stderr_tail(self, limit: int = 3000) -> str:
        """The last lines of stderr (all of it once the process has exited)."""
        if self.proc.returncode is not None or self.proc.stdout is None or \
                self.proc.stdout.at_eof():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._drain), 5)
        return b"".join(self._err).decode(errors="replace")[-limit:]

    async def line(self, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise AssertionError(f"{self.name} exited: {await self.stderr_tail()}")
        return raw.decode().strip()

    def signal(self, sig: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        await self.proc.wait()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drain), 5)


LOGDIR: Path | None = None  # set by --logdir: each process's stderr goes to NAME.log there
ENV: dict[str, str] = {}  # added to every process's environment (``INSIDER_ENV`` with insiders)


async def spawn(name: str, *args: str) -> Proc:
    """Start ``python *args`` with the checkout first on ``PYTHONPATH``."""
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **ENV}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env)
    return Proc(proc, name, LOGDIR / f"{name}.log" if LOGDIR else None)


def master_port(rng: random.Random) -> int:
    """A free port below the kernel's ephemeral range: while the master is down its port
    must not be handed to a peer's listener (bound to port 0) or to an outgoing connection."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return 0  # the OS's choice (then a restart may, rarely, find its port taken)


async def churn(seconds: float, seed: int, stall: float, max_peers: int = 6,
                master_every: float | None = None, stop_share: float = 0.4,
                grace: float | None = None, insider_every: float | None = None
                ) -> dict[str, object]:
    """Run the orchestrator for ``seconds``; returns a summary (raises AssertionError on failure).

    ``master_every``: mean seconds between master events (None: none); a master event is a
    SIGSTOP for 1-4 s with probability ``stop_share``, else a SIGKILL and a restart on the
    same port 0.2-1.5 s later. ``grace``: the restarted master's recovery grace (None: its
    default, the heartbeat timeout). ``insider_every``: mean seconds between insiders (None:
    none): each in turn does one of ``INSIDER_WAYS`` (the run then has a run secret, a master
    secret and a 3 s vote timeout); their outcomes are in the summary."""
    ENV.clear()
    ENV.update(INSIDER_ENV if insider_every else {})
    irng = random.Random(seed * 104729 + 3)  # insider events: their own sequence
    insiders: list[str] = []  # "way: outcome" of each, as they end
    ways = 0  # insiders started so far (the next does INSIDER_WAYS[ways % ...])
    spy: Proc | None = None  # the insider now (one at a time: the next one kills it)
    frozen: dict[str, float] = {}  # honest peer -> when its SIGCONT is due
    rng = random.Random(seed)
    mrng = random.Random(seed * 7919 + 1)  # master events: their own sequence
    margs = [str(MASTER_HEARTBEAT_TIMEOUT), str(master_port(random.Random()))]
    if grace is not None:
        margs.append(str(grace))
    master = await spawn("master", MASTER, *margs)
    port = int(await master.line())
    margs[1] = str(port)
    addr = f"127.0.0.1:{port}"
    queue: asyncio.Queue[tuple[str, dict[str, object]]] = asyncio.Queue()
    peers: dict[str, Proc] = {}
    gone: list[Proc] = []  # killed peers, reaped at the end
    pumps: list[asyncio.Task[None]] = []
    hashes: dict[int, set[str]] = defaultdict(set)
    who: dict[tuple[int, str], list[str]] = defaultdict(list)  # (revision, hash) -> peers
    seen: dict[str, tuple[float, int]] = {}  # live peer -> (last sync or spawn time, revision)
    timeline: list[str] = []  # master events (time, revisions so far), for failure reports
    counter = 0
    kills = spawns = 0
    m_kills = m_restarts = m_stops = master_retries = 0
    outage_max = gap_max = 0.0

    async def pump(p: Proc) -> None:
        while True:
            try:
                ev = json.loads(await p.line(timeout=3600))
            except AssertionError:
                ev = {"event": "exited"}
            if p.log is not None:  # with --logdir: NAME.events beside NAME.log
                with open(p.log.with_suffix(".events"), "a") as f:
                    f.write(json.dumps(ev) + "\n")
            await queue.put((p.name, ev))
            if ev["event"] in ("exited", "error", "finished", "insider"):
                return

    async def start() -> None:
        nonlocal counter, spawns
        counter += 1
        p = await spawn(f"peer{counter}", WORKER, addr, "ddp", str(10**9))
        peers[p.name] = p
        seen[p.name] = (time.monotonic(), -1)
        pumps.append(asyncio.ensure_future(pump(p)))
        spawns += 1

    def master_gap() -> float:
        assert master_every is not None
        return mrng.uniform(0.5, 1.5) * master_every

    async def fail(msg: str, name: str = "") -> AssertionError:
        proc = peers.get(name) or next((g for g in gone if g.name == name), None)
        tail = await proc.stderr_tail() if proc is not None else ""
        mtail = await master.stderr_tail(1500)
        return AssertionError(f"{msg}\n--- master events (s, revisions so far): {timeline}"
                              f"\n--- {name} stderr:\n{tail}\n--- master stderr:\n{mtail}")

    try:
        for _ in range(2):
            await start()
        now = t0 = time.monotonic()
        deadline = now + seconds
        next_event = now + rng.uniform(0.5, 1.5)
        # master: "up" until next_master; "dead"/"stopped" until next_master (restart/SIGCONT)
        m_state, next_master = "up", now + (master_gap() if master_every else float("inf"))
        m_down_at = 0.0
        next_insider = now + (irng.uniform(0.5, 1.5) * insider_every if insider_every
                              else float("inf"))
        last_master = 0.0  # when the master last came back (restart or SIGCONT)
        last_progress = now
        while True:
            now = time.monotonic()
            settled = last_progress > last_master and m_state == "up"
            if now >= deadline and settled:
                break  # the run synced after the last master event (it was ridden out)
            if now < deadline:
                wake = min(next_event, next_master, next_insider, deadline,
                           *frozen.values())
            else:  # settling: bring the master back if it is down, then wait for a sync
                wake = min(next_master if m_state != "up" else now + stall, last_progress + stall)
            try:
                name, ev = await asyncio.wait_for(queue.get(), max(0.01, wake - now))
            except TimeoutError:
                name, ev = "", {"event": "tick"}
            now = time.monotonic()
            if ev["event"] == "synced":
                rev, digest = int(ev["revision"]), str(ev["hash"])  # type: ignore[call-overload]
                hashes[rev].add(digest)
                if len(hashes[rev]) > 1:  # fail at once: what follows would only blur it
                    split = {h: who[rev, h] for h in hashes[rev]}
                    raise await fail(f"state hashes differ at revision {rev}: {split} "
                                     f"(+ {name}: {digest})", name)
                who[rev, digest].append(f"{name}(id {ev.get('peer')}, ws {ev.get('ws')})")
                if name in seen and rev < seen[name][1]:
                    raise await fail(
                        f"{name} went back from revision {seen[name][1]} to {rev}", name)
                if name in seen:
                    seen[name] = (now, rev)
                gap_max = max(gap_max, now - last_progress)
                last_progress = now
            elif ev["event"] == "insider":
                insiders.append(f"{ev['way']}: {ev['outcome']}")
            elif ev["event"] == "retry" and ev.get("kind") == "MasterLostError":
                master_retries += 1
            elif ev["event"] == "error":
                raise await fail(f"{name} failed: {ev}", name)
            elif ev["event"] == "exited" and name in peers and name not in frozen:
                raise await fail(f"{name} exited on its own", name)
            if now - last_progress > stall:
                raise await fail(f"no sync for {stall:.0f} s (revisions so far: {len(hashes)}, "
                                 f"master {m_state})")
            for n in [n for n, t in frozen.items() if now >= t]:
                frozen.pop(n)
                if n in peers:
                    peers[n].signal(signal.SIGCONT)
            if now < deadline and now >= next_insider and insider_every:
                next_insider = now + irng.uniform(0.5, 1.5) * insider_every
                way = INSIDER_WAYS[ways % len(INSIDER_WAYS)]
                ways += 1
                if way == "freeze":
                    honest = sorted(n for n in peers if n not in frozen and seen[n][1] >= 0)
                    if len(honest) >= 2:  # never the last holder of the state
                        pick = irng.choice(honest)
                        peers[pick].signal(signal.SIGSTOP)
                        frozen[pick] = now + FREEZE_S
                        seen[pick] = (now + FREEZE_S, seen[pick][1])  # (not late meanwhile)
                    insiders.append(f"freeze: {pick if len(honest) >= 2 else 'skipped'}")
                else:
                    if spy is not None and spy.proc.returncode is None:
                        await spy.kill()  # still at it: one insider at a time
                    counter += 1
                    spy = await spawn(f"insider{counter}", INSIDER, way, addr)
                    gone.append(spy)
                    pumps.append(asyncio.ensure_future(pump(spy)))
            late = [n for n, (t, _) in seen.items() if n in peers and now - t > stall]
            if late:
                raise await fail(f"{late[0]} has not synced for {stall:.0f} s while others did "
                                 f"(revision {seen[late[0]][1]})", late[0])
            if now >= next_master and (now < deadline or m_state != "up"):
                if m_state == "up":
                    m_down_at = now
                    if mrng.random() < stop_share:
                        master.signal(signal.SIGSTOP)
                        m_state, next_master = "stopped", now + mrng.uniform(1.0, 4.0)
                        m_stops += 1
                        timeline.append(f"{now - t0:.1f} stop (rev {len(hashes)})")
                    else:
                        await master.kill()
                        m_state, next_master = "dead", now + mrng.uniform(0.2, 1.5)
                        m_kills += 1
                        timeline.append(f"{now - t0:.1f} kill (rev {len(hashes)})")
                else:
                    if m_state == "stopped":
                        master.signal(signal.SIGCONT)
                    else:
                        master = await spawn("master", MASTER, *margs)
                        await master.line()  # its port: listening again
                        m_restarts += 1
                    last_master = time.monotonic()
                    timeline.append(f"{last_master - t0:.1f} back (rev {len(hashes)})")
                    outage_max = max(outage_max, last_master - m_down_at)
                    m_state, next_master = "up", last_master + master_gap()
            if now < deadline and now >= next_event:
                next_event = now + rng.uniform(0.5, 1.5)
                if len(peers) <= 2 or (len(peers) < max_peers and rng.random() < 0.6):
                    await start()
                else:
                    # Never the last peer that holds the state (synced at least once): with
                    # all of them gone the state is lost, and a new group rightly restarts
                    # at revision 0 (its hashes would then differ from the old run's).
                    # During a master outage joiners wait unadmitted, so this happens.
                    holders = [n for n in peers if seen[n][1] >= 0]
                    pick = rng.choice(sorted(peers))
                    if holders == [pick]:
                        pick = rng.choice(sorted(set(peers) - {pick}))
                    victim = peers.pop(pick)
                    seen.pop(victim.name, None)
                    victim.signal(signal.SIGKILL)
                    gone.append(victim)
                    kills += 1
        assert all(len(h) == 1 for h in hashes.values())  # checked at every sync
        return {"revisions": len(hashes), "top": max(hashes, default=-1), "kills": kills,
                "spawns": spawns, "master_kills": m_kills, "master_restarts": m_restarts,
                "master_stops": m_stops, "master_retries": master_retries,
                "max_outage_s": round(outage_max, 2), "max_sync_gap_s": round(gap_max, 2),
                "insiders": insiders}
    finally:
        for p in [*peers.values(), *gone, master]:
            await p.kill()
        for t in pumps:
            t.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stall", type=float, default=30.0)
    ap.add_argument("--master-every", type=float, default=60.0,
                    help="mean seconds between master events (kill + restart, or stop + "
                         "continue); 0: none (default 60)")
    ap.add_argument("--stop-share", type=float, default=0.4,
                    help="share of master events that are SIGSTOP/SIGCONT (default 0.4)")
    ap.add_argument("--grace", type=float, default=None,
                    help="the restarted master's recovery grace, s (default: its own)")
    ap.add_argument("--insider-every", type=float, default=0.0,
                    help="mean seconds between insiders (members running modified code, "
                         "tests/stress/insider.py) and frozen honest peers; 0: none")
    ap.add_argument("--logdir", type=Path, default=None,
                    help="keep every process's stderr in DIR/NAME.log (with PCCL_TEST_LOG=INFO "
                         "in the environment: the library's log), a peer's events in "
                         "DIR/NAME.events")
    args = ap.parse_args()
    global LOGDIR
    if args.logdir:
        args.logdir.mkdir(parents=True, exist_ok=True)
        LOGDIR = args.logdir
    summary = asyncio.run(churn(args.seconds, args.seed, args.stall,
                                master_every=args.master_every or None,
                                stop_share=args.stop_share, grace=args.grace,
                                insider_every=args.insider_every or None))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
