"""All-reduce over an emulated WAN link (100 ms RTT, 1 Gbit/s), against raw TCP over the same link.

    python bench/wan.py [--mib 256] [--iters 3] [--warmup 2] [--delay-ms 50] [--rate-mbit 1000]

Needs root. Brings up ``../shared/tools/wan-link`` (two network namespaces joined by a
userspace forwarder; the kernel here has no netem) unless it is already up, and takes it down
again at the end if it brought it up. Master and peer A run in namespace A (10.203.0.1), peer
B in namespace B (10.203.0.2). Measured in one run:

- raw TCP A->B with 1 and 8 streams (the baselines: one stream is capped by the send buffer
  near 4 MiB / RTT; several fill the link);
- a ``--mib`` MiB float32 SUM all-reduce with K = 1 and K = 8 connections per neighbour,
  unquantized, and with uint8 MIN_MAX quantization at K = 8.

Each direction carries the whole buffer for P = 2 (half in reduce-scatter, half in all-gather),
so the link-rate figure is bytes / time against the nominal rate and the 8-stream TCP rate.
The TCP baselines count only after their first second (steady state); the all-reduces are
timed whole, so by default the bench sets ``net.ipv4.tcp_slow_start_after_idle=0`` in both
namespaces (the usual tuning for long-fat links): otherwise every all-reduce after an idle
gap restarts TCP slow start (``--slow-start-after-idle`` measures that case).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
from _common import emit_json, median, print_table

ROOT = Path(__file__).resolve().parent.parent
WAN = ROOT.parent / "shared" / "tools" / "wan-link"
NS_A, NS_B, IP_A, IP_B = "pccl_wan_a", "pccl_wan_b", "10.203.0.1", "10.203.0.2"
CHUNK = 1 << 20


# ---- raw TCP baseline (runs inside the namespaces) --------------------------------------------
def tcp_sink(port: int, streams: int, seconds: float) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((IP_B, port))
    srv.listen(streams)
    print("listening", flush=True)
    conns = [srv.accept()[0] for _ in range(streams)]
    import selectors

    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c, selectors.EVENT_READ)
    buf = bytearray(CHUNK)
    got, t0, t_end = 0, None, None
    open_ = streams
    while open_:
        for key, _ in sel.select():
            n = key.fileobj.recv_into(buf)  # type: ignore[union-attr]
            if not n:
                sel.unregister(key.fileobj)
                open_ -= 1
                continue
            now = time.perf_counter()
            t0 = t0 or now
            # count only the steady part: skip the first second (slow start)
            if now - t0 >= 1.0:
                got += n
                t_end = now
    span = (t_end or 0) - (t0 or 0) - 1.0
    print(json.dumps({"bytes_per_s": got / span if span > 0 else 0.0}), flush=True)


def tcp_source(port: int, seconds: float) -> None:
    s = socket.create_connection((IP_B, port))
    data = memoryview(bytearray(CHUNK))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s.sendall(data)
    s.close()


def ns_python(ns: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__, *args],
                            stdout=subprocess.PIPE, text=True, env=env)


def tcp_rate(streams: int, seconds: float, port: int = 47000) -> float:
    sink = ns_python(NS_B, "--tcp-sink", str(port), str(streams), str(seconds))
    assert sink.stdout is not None
    sink.stdout.readline()
    srcs = [ns_python(NS_A, "--tcp-source", str(port), str(seconds)) for _ in range(streams)]
    for p in srcs:
        p.wait()
    out = json.loads(sink.stdout.readline())
    sink.wait()
    return float(out["bytes_per_s"])


# ---- all-reduce peers ----------------------------------------------------------------------
async def peer(addr: str, host: str, k: int, quant: str, mib: int, iters: int,
               warmup: int) -> None:
    import pccl_aio as pccl

    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint8") if quant == "uint8" else None
    async with pccl.Communicator(addr, p2p_connections=k, listen_host=host,
                                 data_timeout=60.0) as comm:
        await comm.connect(attempts=50)
        while comm.world_size < 2:
            await comm.update_topology()
        x = np.empty(mib * 2**20 // 4, np.float32)
        times = []
        for _ in range(iters + warmup):  # the first ones grow the TCP windows
            x.fill(1.0)
            t0 = time.perf_counter()
            info = await comm.all_reduce(x, quantization=q)
            times.append(time.perf_counter() - t0)
            assert abs(float(x[0]) - 2.0) < 0.02 and abs(float(x[-1]) - 2.0) < 0.02, x[:4]
        print(json.dumps({"times": times[warmup:], "tx": info.tx_bytes}), flush=True)


async def master(port: int) -> None:
    import pccl_aio as pccl

    async with pccl.Master(IP_A, port):
        print("up", flush=True)
        await asyncio.Event().wait()


def allreduce(k: int, quant: str, mib: int, iters: int, warmup: int,
              port: int) -> tuple[float, int]:
    m = ns_python(NS_A, "--master", str(port))
    assert m.stdout is not None
    m.stdout.readline()
    addr = f"{IP_A}:{port}"
    try:
        args = (str(k), quant, str(mib), str(iters), str(warmup))
        peers = [ns_python(NS_A, "--peer", addr, IP_A, *args),
                 ns_python(NS_B, "--peer", addr, IP_B, *args)]
        outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in peers]
    finally:
        m.terminate()
        m.wait()
    per_iter = [max(a, b) for a, b in zip(outs[0]["times"], outs[1]["times"])]
    return median(per_iter), int(outs[0]["tx"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--delay-ms", type=int, default=50)
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--slow-start-after-idle", action="store_true",
                    help="keep Linux's default of restarting TCP slow start after each idle "
                    "gap (by default the bench sets net.ipv4.tcp_slow_start_after_idle=0 in "
                    "both namespaces, the usual tuning for long-fat links)")
    ap.add_argument("--tcp-sink", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--tcp-source", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--peer", nargs=7, help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.tcp_sink:
        return tcp_sink(int(a.tcp_sink[0]), int(a.tcp_sink[1]), float(a.tcp_sink[2]))
    if a.tcp_source:
        return tcp_source(int(a.tcp_source[0]), float(a.tcp_source[1]))
    if a.peer:
        import pccl_aio

        return pccl_aio.run(peer(a.peer[0], a.peer[1], int(a.peer[2]), a.peer[3],
                                 int(a.peer[4]), int(a.peer[5]), int(a.peer[6])))
    if a.master:
        import pccl_aio

        return pccl_aio.run(master(int(a.master)))
    brought_up = subprocess.run(["ip", "netns", "exec", NS_A, "true"],
                                capture_output=True).returncode != 0
    if brought_up:
        subprocess.run(["bash", str(WAN), "up", str(a.delay_ms), str(a.rate_mbit)], check=True)
    idle = "1" if a.slow_start_after_idle else "0"
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                        f"net.ipv4.tcp_slow_start_after_idle={idle}"], check=True)
    try:
        link = a.rate_mbit * 1e6 / 8
        tcp1 = tcp_rate(1, 6.0)
        tcp8 = tcp_rate(8, 6.0)
        print(f"link {link / 1e6:.0f} MB/s nominal; TCP 1 stream {tcp1 / 1e6:.1f} MB/s, "
              f"8 streams {tcp8 / 1e6:.1f} MB/s; tcp_slow_start_after_idle={idle}", flush=True)
        rows = []
        nbytes = a.mib * 2**20
        for k, quant in ((1, "none"), (8, "none"), (8, "uint8")):
            t, tx = allreduce(k, quant, a.mib, a.iters, a.warmup, 48200 + k + (quant == "uint8"))
            rate = nbytes / t  # bytes each way per second, for P = 2 (= busbw)
            rows.append({"K": k, "quant": quant, "median_s": t, "tx_MB": tx / 1e6,
                         "MBps_each_way": rate / 1e6, "vs_link": rate / link,
                         "vs_tcp8": rate / tcp8})
            print(rows[-1], flush=True)
        speedup = rows[1]["median_s"] / rows[2]["median_s"]
        print()
        print_table(rows, list(rows[0]))
        print(f"uint8 MIN_MAX vs unquantized at K=8: {speedup:.2f}x faster (target >= 2.5); "
              f"K=8 unquantized reaches {rows[1]['vs_link']:.2f} of the link (target >= 0.8)")
        emit_json("wan", rows, link_MBps=link / 1e6, tcp1_MBps=tcp1 / 1e6, tcp8_MBps=tcp8 / 1e6,
                  quant_speedup=speedup, slow_start_after_idle=int(idle), delay_ms=a.delay_ms, rate_mbit=a.rate_mbit, mib=a.mib)
    finally:
        if brought_up:
            subprocess.run(["bash", str(WAN), "down"], check=False)


if __name__ == "__main__":
    main()
