"""Shared-state transfer to a joiner and hashing speed, as ratios to baselines of the same run.

    python bench/shared_state.py [--mib 256] [--repeat 3]
    python bench/shared_state.py --wan [--mib 256] [--repeat 2] [--delay-ms 50] [--rate-mbit 1000]
    python bench/shared_state.py --mesh [--mib 128] [--repeat 2] [--mesh-mbit 200]

(1) A master and two peer processes: the veteran holds a ``--mib`` MiB float32 state at
revision 1; the joiner starts from zeros at revision 0 and syncs, receiving everything. The
time of that sync (median over ``--repeat`` fresh runs) gives the transfer throughput, shown
against single-stream loopback TCP measured first. (2) xxh3-128 hashing GB/s against
``np.copyto`` bandwidth on the same buffer.

``--wan`` (root): the same sync over the emulated link of ``bench/wan.py`` (``wan.link``:
master and source in one namespace, the joiner in the other; 2 x ``--delay-ms`` RTT,
``--rate-mbit``), timed from the plan to the last byte (the fetch's own time, from the
library's INFO log), as a fraction of the link rate: the fetcher as it is (connections from
the RTT, requests pipelined, pieces sized to the total), and the old one in the same run as
the baseline (2 connections, one request at a time, 8 MiB pieces).

``--mesh`` (root): ``tests/netem/mesh.Mesh`` with 4 hosts, every link ``--mesh-mbit`` and
``--delay-ms``: a joiner (with the master) on host 1 fetches from 3 sources on hosts 2-4,
each over its own link, and in the same run from one source: the speed-up (target >= 2.5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
from _common import emit_json, join_world, median, print_table, tcp_loopback_gbps

import pccl_aio as pccl
from pccl_aio._peer.state.core.shared_state import hash_bytes


async def _peer(addr: str, role: str, mib: int) -> None:
    n = mib * 2**20 // 4
    arr = np.empty(n, np.float32)
    arr.fill(1.5 if role == "veteran" else 0.0)  # touched, as a model's tensors would be
    state = pccl.SharedState({"w": arr}, revision=1 if role == "veteran" else 0)
    async with pccl.Communicator(addr) as comm:
        await join_world(comm, 2)
        t0 = time.perf_counter()
        info = await comm.sync_shared_state(state)
        dt = time.perf_counter() - t0
        ok = bool(arr[0] == 1.5 and arr[-1] == 1.5)
        print(json.dumps({"role": role, "seconds": dt, "rx": info.rx_bytes, "tx": info.tx_bytes,
                          "ok": ok}), flush=True)


async def _one_transfer(mib: int) -> float:
    async with pccl.Master("127.0.0.1", 0) as master:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
        procs = []
        for role in ("veteran", "joiner"):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--peer", master.address, role, str(mib),
                stdout=asyncio.subprocess.PIPE, env=env))
        outs = [json.loads((await p.communicate())[0].decode().splitlines()[-1]) for p in procs]
        joiner = outs[1]
        if not joiner["ok"] or joiner["rx"] != mib * 2**20:
            raise SystemExit(f"bad transfer: {joiner}")
        return float(joiner["seconds"])


def _hash_vs_copy(mib: int, repeat: int) -> tuple[float, float]:
    a = np.ones(mib * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    view = memoryview(a).cast("B")
    th, tc = [], []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        hash_bytes(view)
        th.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        np.copyto(b, a)
        tc.append(time.perf_counter() - t0)
    nbytes = a.nbytes
    return nbytes / min(th[1:]) / 1e9, nbytes / min(tc[1:]) / 1e9


def _old_fetcher() -> None:
    """The fetcher before issue 35: 2 connections per source, one request in flight each,
    8 MiB pieces (for the baseline)."""
    from pccl_aio._peer.state import transfer

    transfer.DEPTH = 1
    transfer.streams_for = lambda rtt, window: 2  # type: ignore[assignment]
    transfer.piece_size = lambda total, streams: transfer.PIECE  # type: ignore[assignment]


async def _wan_peer(addr: str, host: str, role: str, mib: int, fetcher: str,
                    world: int = 2) -> None:
    import logging

    took: list[float] = []

    class Took(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("synced shared state: revision"):
                took.append(float(record.args[-1]))  # type: ignore[index]

    logging.getLogger("pccl_aio.state").addHandler(Took())
    logging.getLogger("pccl_aio.state").setLevel(logging.INFO)
    if fetcher == "old":
        _old_fetcher()
    n = mib * 2**20 // 4
    arr = np.empty(n, np.float32)
    arr.fill(1.5 if role == "veteran" else 0.0)
    state = pccl.SharedState({"w": arr}, revision=1 if role == "veteran" else 0)
    async with pccl.Communicator(addr, listen_host=host, data_timeout=60.0) as comm:
        await comm.connect(attempts=50)
        while comm.world_size < world:
            await comm.update_topology()
        t0 = time.perf_counter()
        info = await comm.sync_shared_state(state)
        dt = time.perf_counter() - t0
        ok = bool(arr[0] == 1.5 and arr[-1] == 1.5)
        print(json.dumps({"role": role, "seconds": dt, "fetch_s": took[-1] if took else dt,
                          "rx": info.rx_bytes, "ok": ok}), flush=True)


def _wan_transfer(mib: int, fetcher: str, port: int) -> dict[str, float]:
    import wan

    m = wan.ns_python(wan.NS_A, "--master", str(port), script=wan.__file__)
    assert m.stdout is not None
    m.stdout.readline()
    addr = f"{wan.IP_A}:{port}"
    try:
        procs = [wan.ns_python(ns, "--wan-peer", addr, ip, role, str(mib), fetcher,
                               script=__file__)
                 for ns, ip, role in ((wan.NS_A, wan.IP_A, "veteran"),
                                      (wan.NS_B, wan.IP_B, "joiner"))]
        outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    finally:
        m.terminate()
        m.wait()
    joiner = outs[1]
    if not joiner["ok"] or joiner["rx"] != mib * 2**20:
        raise SystemExit(f"bad transfer: {joiner}")
    return joiner


def _wan(args: argparse.Namespace) -> None:
    import wan

    nominal = args.rate_mbit * 1e6 / 8
    nbytes = args.mib * 2**20
    rows = []
    with wan.link(args.delay_ms, args.rate_mbit):
        for fetcher in ("new", "old") * args.repeat:  # interleaved: the same link, both
            out = _wan_transfer(args.mib, fetcher, 48300 + len(rows))
            rows.append({"fetcher": fetcher, "fetch_s": out["fetch_s"],
                         "sync_s": out["seconds"], "MBps": nbytes / out["fetch_s"] / 1e6,
                         "vs_link": nbytes / out["fetch_s"] / nominal})
            print(rows[-1], flush=True)
    best = {f: median([r["vs_link"] for r in rows if r["fetcher"] == f]) for f in ("new", "old")}
    print_table(rows, list(rows[0]))
    print(f"fetch of {args.mib} MiB over {2 * args.delay_ms} ms RTT / {args.rate_mbit} Mbit/s: "
          f"{best['new']:.3f} of the link (target >= 0.9), old fetcher {best['old']:.3f} "
          f"({best['new'] / best['old']:.2f}x)")
    emit_json("shared_state_wan", rows, vs_link=best["new"], baseline_vs_link=best["old"],
              link_MBps=nominal / 1e6, delay_ms=args.delay_ms, rate_mbit=args.rate_mbit,
              mib=args.mib)


async def _mesh_fetch(mib: int, sources: int) -> float:
    """One joiner on mesh host 1 (with the master) fetching from ``sources`` peers, one on
    each of hosts 2.. (each its own link to host 1); the joiner's fetch seconds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.netem.mesh import Mesh, run_master

    master, addr = await run_master(1)
    world, procs = sources + 1, []
    try:
        for i in range(1, world + 1):
            procs.append(await asyncio.create_subprocess_exec(
                "ip", "netns", "exec", Mesh.ns(i), sys.executable, __file__, "--mesh-peer", addr,
                Mesh.ip(i), "joiner" if i == 1 else "veteran", str(mib), "new", str(world),
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}))
        outs = [json.loads((await asyncio.wait_for(p.communicate(), 600))[0].decode()
                           .strip().splitlines()[-1]) for p in procs]
    finally:
        master.send("leave")
        await master.stop()
    joiner = outs[0]
    if not joiner["ok"] or joiner["rx"] != mib * 2**20:
        raise SystemExit(f"bad transfer: {joiner}")
    return float(joiner["fetch_s"])


def _mesh(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.netem.mesh import Mesh

    mesh = Mesh(4, args.delay_ms, args.mesh_mbit)
    mesh.up()
    rows = []
    try:
        for _ in range(args.repeat):  # interleaved: the same links for both
            for sources in (3, 1):
                dt = asyncio.run(_mesh_fetch(args.mib, sources))
                rows.append({"sources": sources, "fetch_s": dt,
                             "MBps": args.mib * 2**20 / dt / 1e6})
                print(rows[-1], flush=True)
    finally:
        mesh.down()
    t = {n: median([r["fetch_s"] for r in rows if r["sources"] == n]) for n in (3, 1)}
    print_table(rows, list(rows[0]))
    print(f"fetch of {args.mib} MiB, each source on its own {args.mesh_mbit} Mbit/s link "
          f"({2 * args.delay_ms} ms RTT): 3 sources {t[1] / t[3]:.2f}x one source (target >= 2.5)")
    emit_json("shared_state_mesh", rows, speedup=t[1] / t[3], mib=args.mib,
              rate_mbit=args.mesh_mbit, delay_ms=args.delay_ms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wan", action="store_true", help="over the emulated WAN link (root)")
    ap.add_argument("--delay-ms", type=int, default=50, help="one-way delay (--wan)")
    ap.add_argument("--rate-mbit", type=int, default=1000, help="link rate (--wan)")
    ap.add_argument("--mesh", action="store_true",
                    help="a joiner and 3 sources on wan-mesh, against one source (root)")
    ap.add_argument("--mesh-mbit", type=int, default=200, help="each link's rate (--mesh)")
    ap.add_argument("--peer", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--mesh-peer", nargs=6, help=argparse.SUPPRESS)
    ap.add_argument("--wan-peer", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        pccl.run(_peer(args.peer[0], args.peer[1], int(args.peer[2])))
        return
    if args.wan_peer:
        a = args.wan_peer
        pccl.run(_wan_peer(a[0], a[1], a[2], int(a[3]), a[4]))
        return
    if args.mesh_peer:
        a = args.mesh_peer
        pccl.run(_wan_peer(a[0], a[1], a[2], int(a[3]), a[4], int(a[5])))
        return
    if args.wan:
        _wan(args)
        return
    if args.mesh:
        _mesh(args)
        return
    tcp1 = tcp_loopback_gbps(1)
    times = [pccl.run(_one_transfer(args.mib)) for _ in range(args.repeat)]
    gbps = args.mib * 2**20 / median(times) / 1e9
    hash_gbps, copy_gbps = _hash_vs_copy(args.mib, args.repeat)
    rows = [
        {"what": f"sync {args.mib} MiB to a joiner", "GBps": gbps, "baseline": "tcp 1 stream",
         "baseline_GBps": tcp1, "ratio": gbps / tcp1, "target": ">= 0.5"},
        {"what": f"xxh3-128 of {args.mib} MiB", "GBps": hash_gbps, "baseline": "np.copyto",
         "baseline_GBps": copy_gbps, "ratio": hash_gbps / copy_gbps, "target": "-"},
    ]
    print_table(rows, list(rows[0]))
    emit_json("shared_state", rows, transfer_seconds=times)


if __name__ == "__main__":
    main()
