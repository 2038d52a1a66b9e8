"""Throughput of the reduce / quantize kernels against numpy, measured in the same run.

    python bench/kernels.py [--mib 64] [--repeat 20] [--json PATH] [--portable]

GB/s = bytes of the MiB-sized float buffer each kernel works on (the destination of add,
copy, reduce and dequantize-accumulate; the float32 source of quantize) per second, 1 GB =
1e9 bytes. Each case runs ``--repeat`` times, round-robin with the others, each run paired
with a run of the baseline ``np.add(a, b, out=a)`` on float32, alternately before and after
it. The table shows best and
median times, GB/s of the best run, the ratio of best times and the median of the paired
ratios (baseline run / case run, the least sensitive to drifting load on a shared machine);
targets are checked on the median paired ratio.
Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import abba

from pccl_aio._compute import ops as _ops
from pccl_aio._types import DataType, QuantAlgo, ReduceOp

SUM, MIN_MAX = int(ReduceOp.SUM), int(QuantAlgo.MIN_MAX)
F32, BF16, U8 = int(DataType.FLOAT32), int(DataType.BFLOAT16), int(DataType.UINT8)
U4 = int(DataType.UINT4)

# name -> target ratio (median GB/s over numpy add), None for the baselines
TARGETS: dict[str, float | None] = {
    "numpy add f32": None,
    "numpy copyto f32": None,
    "reduce f32 SUM": 1.0,
    "reduce bf16 SUM": 0.5,
    "quantize f32->u8 MIN_MAX": 0.5,
    "dequant-accumulate u8->f32 SUM": 0.7,
    "quantize f32->u4 MIN_MAX": 0.5,
    "dequant-accumulate u4->f32 SUM": 0.7,
}


def cases(mib: int) -> dict[str, Callable[[], object]]:
    n = mib * 2**20 // 4
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    c = a.copy()
    a16 = (a.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    a16 = np.concatenate([a16, a16])  # mib MiB of bfloat16
    b16 = a16[::-1].copy()
    q = np.empty(n, np.uint8)
    meta = _ops.quantize(q, b, F32, U8, MIN_MAX)
    q4 = np.empty((n + 1) // 2, np.uint8)
    meta4 = _ops.quantize(q4, b, F32, U4, MIN_MAX)
    return {
        "numpy add f32": lambda: np.add(a, b, out=a),
        "numpy copyto f32": lambda: np.copyto(c, a),
        "reduce f32 SUM": lambda: _ops.reduce_into(a, b, SUM, F32),
        "reduce bf16 SUM": lambda: _ops.reduce_into(a16, b16, SUM, BF16),
        "quantize f32->u8 MIN_MAX": lambda: _ops.quantize(q, c, F32, U8, MIN_MAX),
        "dequant-accumulate u8->f32 SUM": lambda: _ops.dequantize_accumulate(
            a, q, meta[0], meta[1], SUM, F32, U8, MIN_MAX),
        "quantize f32->u4 MIN_MAX": lambda: _ops.quantize(q4, c, F32, U4, MIN_MAX),
        "dequant-accumulate u4->f32 SUM": lambda: _ops.dequantize_accumulate(
            a, q4, meta4[0], meta4[1], SUM, F32, U4, MIN_MAX),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="buffer size in MiB (default 64)")
    ap.add_argument("--repeat", type=int, default=20, help="runs per case (default 20)")
    ap.add_argument("--json", type=Path, help="also write the JSON result to this file")
    ap.add_argument("--portable", action="store_true",
                    help="switch the Cython kernels' AVX2 loops off (portable loops only)")
    args = ap.parse_args()
    if args.portable and _ops.IMPLEMENTATION == "cython":
        from pccl_aio import _kernels

        _kernels._set_simd(0)

    work = cases(args.mib)
    times: dict[str, list[float]] = {name: [] for name in work}
    for fn in work.values():  # warm-up: page faults, first-touch
        fn()
    base = work["numpy add f32"]
    pair: dict[str, list[float]] = {name: [] for name in work}
    for r in range(args.repeat):
        for name, fn in work.items():
            tb, tc = abba(base, fn, r)  # each case paired with its own numpy-add run
            times[name].append(tc)
            pair[name].append(tb / tc)

    nbytes = args.mib * 2**20
    base_best = min(times["numpy add f32"])
    print(f"# kernels: {args.mib} MiB buffers, {args.repeat} runs each, implementation="
          f"{_ops.IMPLEMENTATION}{' (portable loops)' if args.portable else ''}, "
          f"numpy {np.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs")
    print("# GB/s = bytes of the float buffer (dst; src for quantize) / best time, 1 GB = 1e9 B;"
          " x add = numpy-add time / case time (best/best, median of paired runs)")
    print(f"{'case':32} {'best ms':>8} {'median ms':>9} {'GB/s':>6} {'x add':>6} "
          f"{'(median)':>8}  target")
    results = {}
    ok = True
    for name, ts in times.items():
        best, med = min(ts), statistics.median(ts)
        ratio, ratio_med = base_best / best, statistics.median(pair[name])
        target = TARGETS[name]
        met = target is None or ratio_med >= target
        ok &= met
        tgt = "-" if target is None else f">={target:.1f} " + ("ok" if met else "MISS")
        print(f"{name:32} {best * 1e3:8.3f} {med * 1e3:9.3f} {nbytes / best / 1e9:6.2f} "
              f"{ratio:6.2f} {ratio_med:8.2f}  {tgt}")
        results[name] = {"best_s": best, "median_s": med, "gbps": round(nbytes / best / 1e9, 3),
                         "ratio_vs_numpy_add": round(ratio, 3),
                         "median_ratio_vs_numpy_add": round(ratio_med, 3), "target": target}
    line = json.dumps({"bench": "kernels", "mib": args.mib, "repeat": args.repeat,
                       "implementation": _ops.IMPLEMENTATION, "portable": args.portable,
                       "targets_met": ok,
                       "results": results})
    print(line)
    if args.json:
        args.json.write_text(line + "\n")


if __name__ == "__main__":
    main()
