"""All-reduce over an emulated WAN link (100 ms RTT, 1 Gbit/s), against raw TCP over the same link.

    python bench/wan.py [--mib 256] [--iters 3] [--warmup 2] [--delay-ms 50] [--rate-mbit 1000]
                        [--conns 1,8,auto] [--quant uint8] [--quant-conns auto] [--no-tcp]

Needs root. Brings up ``../shared/tools/wan-link`` (two network namespaces joined by a
userspace forwarder; the kernel here has no netem) unless it is already up, and takes it down
again at the end if it brought it up. Master and peer A run in namespace A (10.203.0.1), peer
B in namespace B (10.203.0.2). Measured in one run:

- raw TCP A->B with 1 and 8 streams (the baselines: one stream is capped by the send buffer
  near 4 MiB / RTT; several fill the link), and ``iperf3 -P 8`` if it is installed;
- a ``--mib`` MiB float32 SUM all-reduce for each ``--conns`` entry (K connections per
  neighbour, or ``auto``: the library's choice from the bandwidth-delay product, reported in
  the ``K_used`` column), unquantized, and with MIN_MAX quantization to ``--quant`` (any
  ``Quantization`` dtype: uint8, uint16, ...; or ``none``) at ``--quant-conns``.

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
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
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


def ns_python(ns: str, *args: str, script: str = __file__) -> subprocess.Popen[str]:
    """``python script args`` in namespace ``ns`` (this file by default), stdout piped."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, script, *args],
                            stdout=subprocess.PIPE, text=True, env=env)


@contextlib.contextmanager
def link(delay_ms: int, rate_mbit: int, slow_start_after_idle: bool = False) -> Iterator[bool]:
    """The emulated link up (unless it already is: yields False then, and leaves it up),
    ``net.ipv4.tcp_slow_start_after_idle`` set in both namespaces (off by default, the usual
    tuning for long-fat links)."""
    brought_up = subprocess.run(["ip", "netns", "exec", NS_A, "true"],
                                capture_output=True).returncode != 0
    if brought_up:
        subprocess.run(["bash", str(WAN), "up", str(delay_ms), str(rate_mbit)], check=True)
    try:
        for ns in (NS_A, NS_B):
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                            f"net.ipv4.tcp_slow_start_after_idle={int(slow_start_after_idle)}"],
                           check=True)
        yield brought_up
    finally:
        if brought_up:
            subprocess.run(["bash", str(WAN), "down"], check=False)


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
async def peer(addr: str, host: str, k: str, quant: str, mib: int, iters: int,
               warmup: int) -> None:
    import pccl_aio as pccl

    q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype=quant) if quant != "none" else None
    async with pccl.Communicator(addr, p2p_connections=None if k == "auto" else int(k),
                                 listen_host=host, data_timeout=60.0) as comm:
        await comm.connect(attempts=50)
        while comm.world_size < 2:
            await comm.update_topology()
        x = np.empty(mib * 2**20 // 4, np.float32)
        times, used = [], 0
        for _ in range(iters + warmup):  # the first ones grow the TCP windows
            x.fill(1.0)
            t0 = time.perf_counter()
            info = await comm.all_reduce(x, quantization=q)
            times.append(time.perf_counter() - t0)
            assert abs(float(x[0]) - 2.0) < 0.02 and abs(float(x[-1]) - 2.0) < 0.02, x[:4]
            # read while the other peer still has all-reduces to do (it has not left)
            used = used or sum(comm._data.link_connections().values())
        print(json.dumps({"times": times[warmup:], "tx": info.tx_bytes, "k": used}), flush=True)


async def master(port: int) -> None:
    import pccl_aio as pccl

    async with pccl.Master(IP_A, port):
        print("up", flush=True)
        await asyncio.Event().wait()


def allreduce(k: str, quant: str, mib: int, iters: int, warmup: int,
              port: int) -> tuple[float, int, int]:
    m = ns_python(NS_A, "--master", str(port))
    assert m.stdout is not None
    m.stdout.readline()
    addr = f"{IP_A}:{port}"
    try:
        args = (k, quant, str(mib), str(iters), str(warmup))
        peers = [ns_python(NS_A, "--peer", addr, IP_A, *args),
                 ns_python(NS_B, "--peer", addr, IP_B, *args)]
        outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in peers]
    finally:
        m.terminate()
        m.wait()
    per_iter = [max(a, b) for a, b in zip(outs[0]["times"], outs[1]["times"])]
    return median(per_iter), int(outs[0]["tx"]), int(outs[0]["k"])


def iperf3_rate(streams: int, seconds: int) -> float | None:
    """``iperf3 -P streams`` A->B, receiver side, the first second omitted; None without it."""
    if shutil.which("iperf3") is None:
        return None
    srv = subprocess.Popen(["ip", "netns", "exec", NS_B, "iperf3", "-s", "-1", "--forceflush",
                            "-B", IP_B], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout is not None
        line = "-"
        while line and "listening" not in line:
            line = srv.stdout.readline()
        if not line:
            return None
        out = subprocess.run(["ip", "netns", "exec", NS_A, "iperf3", "-J", "-c", IP_B,
                              "-P", str(streams), "-t", str(seconds), "-O", "1"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"iperf3 failed: {out.stderr.strip()}", file=sys.stderr)
            return None
        return float(json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"]) / 8
    finally:
        srv.kill()
        srv.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--delay-ms", type=int, default=50)
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--conns", default="1,8,auto",
                    help="unquantized rows: connections per neighbour, an int or 'auto'")
    ap.add_argument("--quant", default="uint8",
                    help="the quantized row's MIN_MAX dtype (any Quantization dtype), or none")
    ap.add_argument("--quant-conns", default="auto", help="connections of the quantized row")
    ap.add_argument("--no-tcp", action="store_true",
                    help="skip the raw TCP and iperf3 baselines (ratios to the link only)")
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

        return pccl_aio.run(peer(a.peer[0], a.peer[1], a.peer[2], a.peer[3],
                                 int(a.peer[4]), int(a.peer[5]), int(a.peer[6])))
    if a.master:
        import pccl_aio

        return pccl_aio.run(master(int(a.master)))
    if a.quant != "none":  # a dtype this version does not know fails here, not in a peer
        import pccl_aio

        pccl_aio.Quantization(algo=pccl_aio.QuantAlgo.MIN_MAX, dtype=a.quant)
    idle = "1" if a.slow_start_after_idle else "0"
    with link(a.delay_ms, a.rate_mbit, a.slow_start_after_idle):
        nominal = a.rate_mbit * 1e6 / 8
        tcp1 = tcp8 = nan = float("nan")
        iperf: float | None = None
        if not a.no_tcp:
            tcp1, tcp8 = tcp_rate(1, 6.0), tcp_rate(8, 6.0)
            iperf = iperf3_rate(8, 6)
        print(f"link {nominal / 1e6:.0f} MB/s nominal; TCP 1 stream {tcp1 / 1e6:.1f} MB/s, "
              f"8 streams {tcp8 / 1e6:.1f} MB/s; iperf3 -P 8 "
              f"{'-' if iperf is None else f'{iperf / 1e6:.1f} MB/s'}; "
              f"tcp_slow_start_after_idle={idle}", flush=True)
        rows = []
        nbytes = a.mib * 2**20
        cases = [(k, "none") for k in a.conns.split(",") if k]
        if a.quant != "none":
            cases.append((a.quant_conns, a.quant))
        for i, (k, quant) in enumerate(cases):
            t, tx, used = allreduce(k, quant, a.mib, a.iters, a.warmup, 48200 + i)
            rate = nbytes / t  # bytes each way per second, for P = 2 (= busbw)
            rows.append({"K": k, "K_used": used, "quant": quant, "median_s": t,
                         "tx_MB": tx / 1e6, "MBps_each_way": rate / 1e6, "vs_link": rate / nominal,
                         "vs_tcp8": rate / tcp8,
                         "vs_iperf3": rate / iperf if iperf else nan})
            print(rows[-1], flush=True)
        print()
        print_table(rows, list(rows[0]))
        extra: dict[str, float] = {}
        plain = {r["K"]: r for r in rows if r["quant"] == "none"}
        quant_rows = [r for r in rows if r["quant"] != "none"]
        if quant_rows and quant_rows[0]["K"] in plain:
            q = quant_rows[0]
            extra["quant_speedup"] = plain[q["K"]]["median_s"] / q["median_s"]
            print(f"{q['quant']} MIN_MAX vs unquantized at K={q['K']}: "
                  f"{extra['quant_speedup']:.2f}x faster")
        if "auto" in plain:
            print(f"K=auto unquantized reaches {plain['auto']['vs_link']:.3f} of the link "
                  f"(target >= 0.9)")
        emit_json("wan", rows, link_MBps=nominal / 1e6, tcp1_MBps=tcp1 / 1e6, tcp8_MBps=tcp8 / 1e6,
                  iperf3_8_MBps=iperf / 1e6 if iperf else nan, slow_start_after_idle=int(idle),
                  delay_ms=a.delay_ms, rate_mbit=a.rate_mbit, mib=a.mib, **extra)


if __name__ == "__main__":
    main()
