"""The sparse compressor (``pccl_aio.SparseCompressor``): kernel throughput against numpy, and
the time to exchange a pseudo-gradient over an emulated WAN, in one run each.

    python bench/compress.py [--mib 64] [--repeat 10] [--density 0.01] [--bits 2] [--threads N]
    python bench/compress.py --wan [--wan-mib 256] [--delay-ms 50] [--rate-mbit 100]

Kernels: compress (error buffer + x, chunked top-k, codes, packing; on the compressor's
default threads, or ``--threads``, and on one) and decompress-accumulate (one part added into
a float32 vector) of a ``--mib`` MiB float32 vector, each run paired with
a run of ``np.add(a, b, out=a)`` on the same vector (alternately before and after it); the
ratio is the median of numpy-add time / case time (targets: >= 0.5 compress, >= 1.0
decompress-accumulate).

``--wan`` (root): brings up ``../shared/tools/wan-link`` (namespaces, ``--delay-ms`` one way,
``--rate-mbit``) unless it is up; two peers exchange a ``--wan-mib`` MiB float32
pseudo-gradient: an unquantized all-reduce, an all-reduce quantized to uint4 (MIN_MAX), and
``SparseCompressor.average`` (``--density``, ``--bits``), each timed whole (compression
included) after one warm-up; the ratio is unquantized time / case time (target: sparse >= 20).
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from _common import abba, emit_json, print_table

import pccl_aio as pccl
from pccl_aio._compute import ops as _ops
from pccl_aio._compute import sparse

TARGETS = {"compress": 0.5, "decompress-accumulate": 1.0}


def kernels(mib: int, repeat: int, density: float, bits: int,
            threads: int | None) -> list[dict[str, object]]:
    n = mib * 2**20 // 4
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    comp = pccl.SparseCompressor(n, density=density, bits=bits, threads=threads)
    one = pccl.SparseCompressor(n, density=density, bits=bits, threads=1)
    part = comp.compress(b).copy()
    work: dict[str, Callable[[], object]] = {
        f"compress, {comp.threads} threads": lambda: comp.compress(b),
        "compress, 1 thread": lambda: one.compress(b),
        "decompress-accumulate": lambda: sparse.accumulate(a, part, comp.layout),
    }
    base = lambda: np.add(a, b, out=a)  # noqa: E731
    for fn in (base, *work.values()):
        fn()
    rows = []
    for name, fn in work.items():
        ratios, times = [], []
        for r in range(repeat):
            tb, tc = abba(base, fn, r)
            ratios.append(tb / tc)
            times.append(tc)
        ratio = statistics.median(ratios)
        rows.append({"case": name, "best_ms": min(times) * 1e3,
                     "median_ms": statistics.median(times) * 1e3, "x_numpy_add": ratio,
                     "target": TARGETS[name.split(",")[0]],
                     "met": ratio >= TARGETS[name.split(",")[0]]})
    print(f"# sparse kernels: {mib} MiB float32, density {density}, {bits}-bit codes, "
          f"part {comp.nbytes} B ({comp.ratio:.0f}x fewer bytes), implementation="
          f"{_ops.IMPLEMENTATION}, {repeat} paired runs")
    return rows


# ---- over the emulated WAN -----------------------------------------------------------------
async def peer(addr: str, host: str, mode: str, mib: int, density: float, bits: int) -> None:
    async with pccl.Communicator(addr, listen_host=host, data_timeout=120.0) as comm:
        await comm.connect(attempts=50)
        while comm.world_size < 2:
            await comm.update_topology()
        n = mib * 2**20 // 4
        x = np.random.default_rng(comm.rank).standard_normal(n, dtype=np.float32)
        comp = pccl.SparseCompressor(n, density=density, bits=bits) if mode == "sparse" else None
        q = pccl.Quantization(algo=pccl.QuantAlgo.MIN_MAX, dtype="uint4")
        out, times, tx = np.empty(n, np.float32), [], 0
        for _ in range(2):  # a warm-up, then the timed one
            t0 = time.perf_counter()
            if comp is not None:
                info = await comp.average(comm, x, out)
            else:
                np.copyto(out, x)
                info = await comm.all_reduce(out, quantization=q if mode == "uint4" else None)
            times.append(time.perf_counter() - t0)
            tx = info.tx_bytes
        print(json.dumps({"s": times[-1], "tx": tx}), flush=True)


def exchange(wan: Any, mode: str, a: argparse.Namespace, port: int) -> tuple[float, int]:
    """One mode's exchange between a peer in each namespace (``bench/wan.py``'s master in A):
    the slower peer's seconds, and the bytes a peer sent."""
    m = wan.ns_python(wan.NS_A, "--master", str(port))
    m.stdout.readline()
    try:
        opts = (mode, str(a.wan_mib), str(a.density), str(a.bits))
        addr = f"{wan.IP_A}:{port}"
        ps = [wan.ns_python(ns, "--peer", addr, ip, *opts, script=__file__)
              for ns, ip in ((wan.NS_A, wan.IP_A), (wan.NS_B, wan.IP_B))]
        outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in ps]
    finally:
        m.terminate()
        m.wait()
    return max(o["s"] for o in outs), int(outs[0]["tx"])


def over_wan(a: argparse.Namespace) -> list[dict[str, object]]:
    import wan

    with wan.link(a.delay_ms, a.rate_mbit):
        rows = []
        for i, mode in enumerate(("unquantized", "uint4", "sparse")):
            s, tx = exchange(wan, mode, a, 48600 + i)
            rows.append({"case": mode, "seconds": s, "tx_MB": tx / 1e6})
        for r in rows:
            r["x_unquantized"] = float(rows[0]["seconds"]) / float(r["seconds"])  # type: ignore[arg-type]
        rows[-1]["target"], rows[-1]["met"] = 20.0, rows[-1]["x_unquantized"] >= 20.0
    print(f"# {a.wan_mib} MiB float32 between 2 peers over {2 * a.delay_ms} ms RTT, "
          f"{a.rate_mbit} Mbit/s; sparse: density {a.density}, {a.bits}-bit codes")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None,
                    help="the compressor's threads (default: its own default)")
    ap.add_argument("--wan", action="store_true", help="the emulated WAN exchange (root)")
    ap.add_argument("--wan-mib", type=int, default=256)
    ap.add_argument("--delay-ms", type=int, default=50)
    ap.add_argument("--rate-mbit", type=int, default=100)
    ap.add_argument("--peer", nargs=6, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        p = a.peer
        return pccl.run(peer(p[0], p[1], p[2], int(p[3]), float(p[4]), int(p[5])))
    if a.wan:
        rows = over_wan(a)
        print_table(rows, ["case", "seconds", "tx_MB", "x_unquantized", "target", "met"])
        emit_json("compress_wan", rows, mib=a.wan_mib, delay_ms=a.delay_ms,
                  rate_mbit=a.rate_mbit, density=a.density, bits=a.bits)
        return None
    rows = kernels(a.mib, a.repeat, a.density, a.bits, a.threads)
    print_table(rows, ["case", "best_ms", "median_ms", "x_numpy_add", "target", "met"])
    emit_json("compress", rows, mib=a.mib, density=a.density, bits=a.bits, threads=a.threads)
    return None


if __name__ == "__main__":
    main()
