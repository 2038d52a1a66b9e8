"""What the master's status page and metrics cost its control plane (issue 21): the latency
of 4 KiB all-reduces at P = 2 with the page polled every 0.5 s, against the same run with
nobody polling (the baseline), in alternating windows of one run.

    python bench/status_overhead.py [--rounds 8] [--window 2.5] [--poll 0.5]

Real processes: the master CLI (``--status-port 0 --metrics-port 0``) and two peers (this
script with ``--peer``) that all-reduce 4 KiB float32 (SUM, checked) back to back and record
each call's latency. The bench process alternates windows of ``--window`` seconds, in ABBA
order (off, on, on, off, ...) so that a drift of the machine cancels: "on" windows GET ``/``
(the page, with its embedded status), ``/status.json`` and ``/metrics`` every ``--poll``
seconds, as an open page and a Prometheus scraper would (more often than either). Figures:
the median latency over each kind of window, over both peers; ratio = on / off; and the
median over rounds of each round's on / off ratio (the headline: a drift between rounds
cancels; target within 5 %: <= 1.05). The first 0.2 s of each window is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from _common import emit_json, print_table  # noqa: E402
from master_recovery import start  # noqa: E402

COUNT = 1024  # float32: 4 KiB


# ---- a peer process ----------------------------------------------------------------------------
async def peer_main(addr: str, deadline: float, out: str) -> None:
    import numpy as np

    import pccl_aio as pccl

    comm = pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=5.0)
    await comm.connect(attempts=20)
    while comm.peer_group_world_size < 2:
        await comm.update_topology()
    x = np.empty(COUNT, np.float32)
    ends, lats = [], []
    print(json.dumps({"event": "ready", "peer": comm.peer_id}), flush=True)
    try:
        while time.time() < deadline:
            x[:] = 1.0
            t0 = time.perf_counter()
            try:
                await comm.all_reduce(x)
            except pccl.PcclError:
                if time.time() >= deadline:
                    break  # the other peer stopped first
                raise
            lats.append(time.perf_counter() - t0)
            ends.append(time.time())
            if x[0] != 2.0:
                raise SystemExit(f"wrong result {x[0]}")
    finally:
        await comm.close()
    np.save(out, np.array([ends, lats]))


# ---- the bench ---------------------------------------------------------------------------------
async def get(host: str, port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    body = await reader.read()
    writer.close()
    if not body.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"FAILED: GET {path}: {body[:200]!r}")
    return len(body)


async def poll(urls: list[tuple[str, int, str]], until: float, every: float) -> int:
    """GET every url each ``every`` seconds until ``until`` (wall clock); bytes read."""
    got = 0
    while time.time() < until:
        t = time.time()
        for host, port, path in urls:
            got += await get(host, port, path)
        await asyncio.sleep(max(0.0, every - (time.time() - t)))  # the polling period
    return got


async def bench(args: argparse.Namespace) -> None:
    import numpy as np

    master = await start("master", "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0",
                         "--status-port", "0", "--metrics-port", "0", "--log-format", "json")
    found: dict[str, str] = {}
    give_up = time.monotonic() + 20
    while len(found) < 3:  # the addresses, from its log (read by the Child's reader task)
        for raw in list(master.err):
            msg = json.loads(raw)["msg"]
            for key, pattern in (("addr", r"listening on (\S+:\d+)"),
                                 ("status", r"status page on http://(\S+?)/"),
                                 ("metrics", r"metrics on http://(\S+?)/")):
                if m := re.search(pattern, msg):
                    found[key] = m.group(1)
        if time.monotonic() > give_up:
            raise SystemExit(f"FAILED: the master did not start: {list(master.err)}")
        await asyncio.sleep(0.05)  # polling the reader's list, not a synchronisation
    windows = []
    t = time.time() + 6.0  # joining and warm-up
    for r in range(args.rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            windows.append((t, t + args.window, on))
            t += args.window
    deadline = t + 0.5
    tmp = tempfile.mkdtemp()
    peers = [await start(f"peer{i}", __file__, "--peer", found["addr"], str(deadline),
                         os.path.join(tmp, f"p{i}.npy")) for i in range(2)]
    for p in peers:
        await p.line(30)
    shost, sport = found["status"].rsplit(":", 1)
    mhost, mport = found["metrics"].rsplit(":", 1)
    urls = [(shost, int(sport), "/"), (shost, int(sport), "/status.json"),
            (mhost, int(mport), "/metrics")]
    polled = 0
    for begin, end, on in windows:
        await asyncio.sleep(max(0.0, begin - time.time()))  # the window's schedule
        if on:
            polled += await poll(urls, end, args.poll)
    for p in peers:
        await p.proc.wait()
    await master.kill()
    samples = [np.load(os.path.join(tmp, f"p{i}.npy")) for i in range(2)]
    lat: dict[bool, list[float]] = {False: [], True: []}
    per_round: list[dict[str, float]] = []
    for begin, end, on in windows:
        xs = [float(v) for s in samples for e, v in zip(s[0], s[1]) if begin + 0.2 <= e < end]
        lat[on].extend(xs)
        per_round.append({"on": on, "median_us": statistics.median(xs) * 1e6, "n": len(xs)})
    off_us, on_us = statistics.median(lat[False]) * 1e6, statistics.median(lat[True]) * 1e6
    pairs = []  # each round's on / off: the drift between rounds cancels
    for i in range(0, len(per_round), 2):
        a, b = per_round[i], per_round[i + 1]
        on_w, off_w = (a, b) if a["on"] else (b, a)
        pairs.append(on_w["median_us"] / off_w["median_us"])
    rows = [{"windows": "off (baseline)", "median_us": off_us, "calls": len(lat[False]),
             "ratio": 1.0},
            {"windows": f"on (poll {args.poll:g} s)", "median_us": on_us,
             "calls": len(lat[True]), "ratio": on_us / off_us}]
    print_table(rows, ["windows", "median_us", "calls", "ratio"],
                {"median_us": ".1f", "ratio": ".3f"})
    paired = statistics.median(pairs)
    print(f"median of the {len(pairs)} rounds' on/off ratios: {paired:.3f} (target <= 1.05); "
          f"polled {polled} bytes over {args.rounds} rounds of {args.window:g} s windows")
    emit_json("status_overhead", rows, poll_s=args.poll, window_s=args.window,
              rounds=args.rounds, target_ratio=1.05, paired_ratio=paired, pairs=pairs,
              windows=per_round)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--window", type=float, default=2.5)
    p.add_argument("--poll", type=float, default=0.5)
    p.add_argument("--peer", nargs=3, metavar=("ADDR", "DEADLINE", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    import pccl_aio as pccl

    if args.peer:
        pccl.run(peer_main(args.peer[0], float(args.peer[1]), args.peer[2]))
    else:
        pccl.run(bench(args))


if __name__ == "__main__":
    main()
