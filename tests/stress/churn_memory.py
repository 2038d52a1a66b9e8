"""Kill/replace memory (issue 45, item 6): a master process, two survivor processes running
the README's loop (``memory_peer.py``) and, each cycle, a new peer that joins, syncs and
all-reduces with them and is SIGKILLed. The survivors' resident memory is read after
``--warm`` cycles and after the last (each time after a garbage collection in the survivor).

    python tests/stress/churn_memory.py                     # 100 cycles, RSS at 30 and 100
    python tests/stress/churn_memory.py --cycles 60 --warm 20
    python tests/stress/churn_memory.py --trace /tmp/snaps  # + tracemalloc's top growth

Pass (exit status 0): each survivor grew by less than ``--bound`` KiB (1024) between the two
readings. With ``--trace DIR`` the survivors trace their allocations and the script prints
the 15 lines whose memory grew most between the two readings (a traced run is slower and
its RSS includes the traces: read the RSS of a run without it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # (run as a script: the checkout's tests package)
    sys.path.insert(0, str(ROOT))

from tests.helpers import rss  # noqa: E402
from tests.process.procs import Proc, spawn  # noqa: E402

PEER = str(HERE / "memory_peer.py")
MASTER = str(HERE.parent / "process" / "masterproc.py")


async def _until(p: Proc, prefix: str, timeout: float = 30.0) -> str:
    """The word after ``prefix`` on ``p``'s next line that starts with it."""
    while True:
        line = await p.line(timeout)
        if line.startswith(prefix + " "):
            return line.split()[1]


async def _reading(survivors: list[Proc]) -> list[tuple[int, str, list[list[object]]]]:
    """Each survivor's RSS, its snapshot's path (or '-') and the garbage it reported."""
    out = []
    for p in survivors:
        p.signal(signal.SIGUSR1)
        garbage: list[list[object]] = []
        while not (line := await p.line(120)).startswith("snap "):
            if line.startswith("garbage "):
                garbage = json.loads(line.split(" ", 1)[1])
        out.append((rss(p.proc.pid), line.split()[1], garbage))
    return out


async def cycles(n: int = 100, warm: int = 30, trace: Path | None = None, life: int = 1,
                 elems: int = 4096, garbage: bool = False) -> dict[str, object]:
    """Run ``n`` kill/replace cycles next to two survivors; the survivors' RSS (bytes) after
    ``warm`` cycles and after ``n``, their growth, with ``trace`` the snapshots' paths, with
    ``garbage`` (the survivors run without the garbage collector) what reference cycles held
    over the last ``n - warm`` cycles (type, count), per survivor."""
    env = {"PCCL_TEST_TRACEMALLOC": str(trace)} if trace else {}
    if garbage:
        env["PCCL_TEST_GARBAGE"] = "1"
    env["STATE_ELEMS"] = str(elems)
    procs: list[Proc] = []
    try:
        master = await spawn("master", MASTER)
        procs.append(master)
        addr = f"127.0.0.1:{int(await master.line())}"
        survivors = [await spawn(f"survivor{i}", PEER, "survivor", addr, env=env)
                     for i in range(2)]
        procs += survivors
        zygote = await spawn("zygote", PEER, "zygote", addr, stdin=True,
                             env={"STATE_ELEMS": str(elems)})
        procs.append(zygote)
        for p in survivors:
            await _until(p, "step")
        stdin = zygote.proc.stdin
        assert stdin is not None
        readings: dict[int, list[tuple[int, str, list[list[object]]]]] = {}
        for i in range(1, n + 1):
            stdin.write(f"fork {life}\n".encode())
            pid = int(await _until(zygote, "forked"))
            got = int(await _until(zygote, "reduced"))
            assert got == pid, (got, pid)
            os.kill(pid, signal.SIGKILL)  # (the zygote's child: the zygote reaps it)
            if i in (warm, n):
                readings[i] = await _reading(survivors)
        for p in survivors:  # they still train
            await _until(p, "step")
        before, after = readings[warm], readings[n]
        return {"cycles": n, "warm": warm,
                "rss_warm": [r[0] for r in before], "rss_end": [r[0] for r in after],
                "grown": [b[0] - a[0] for a, b in zip(before, after)],
                "garbage": [r[2] for r in after],
                "snaps": [[a[1], b[1]] for a, b in zip(before, after)]}
    finally:
        for p in reversed(procs):
            p.signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.proc.wait(), 10)


def top_growth(first: str, last: str, limit: int = 15) -> list[str]:
    """The ``limit`` traced lines whose memory grew most from snapshot ``first`` to ``last``
    (the library's and the standard library's, tracemalloc's own frames left out)."""
    keep = [tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap*>")]
    a = tracemalloc.Snapshot.load(first).filter_traces(keep)
    b = tracemalloc.Snapshot.load(last).filter_traces(keep)
    out = []
    for st in b.compare_to(a, "traceback")[:limit]:
        if st.size_diff > 0:
            out.append(f"{st.size_diff:+d} B in {st.count_diff:+d} blocks, at:")
            out += st.traceback.format(limit=6, most_recent_first=True)
    total = sum(st.size_diff for st in b.compare_to(a, "filename"))
    return [*out, f"total traced growth: {total} B"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--warm", type=int, default=30, help="the cycle of the first reading")
    ap.add_argument("--life", type=int, default=1,
                    help="steps a new peer takes before it is killed")
    ap.add_argument("--elems", type=int, default=4096,
                    help="float32 elements of the shared weights and the gradient")
    ap.add_argument("--garbage", action="store_true",
                    help="the survivors run without the garbage collector and tell what "
                         "reference cycles held (their RSS then grows by that)")
    ap.add_argument("--bound", type=int, default=1024, help="KiB a survivor may grow")
    ap.add_argument("--trace", type=Path, metavar="DIR",
                    help="trace the survivors' allocations; snapshots go to DIR")
    args = ap.parse_args(argv)
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
    out = asyncio.run(cycles(args.cycles, args.warm, args.trace, args.life, args.elems,
                            args.garbage))
    print(json.dumps({k: v for k, v in out.items() if k != "snaps"}))
    if args.trace:
        for first, last in out["snaps"]:  # type: ignore[attr-defined]
            print(f"--- {last}, growth since {first}:")
            for line in top_growth(first, last):
                print(line)
    grown: list[int] = out["grown"]  # type: ignore[assignment]
    return 0 if all(g < args.bound << 10 for g in grown) else 1


if __name__ == "__main__":
    sys.exit(main())
