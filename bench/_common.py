"""Shared benchmark helpers: loopback TCP baselines and result printing."""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import socket
import statistics
import subprocess
import time
from typing import Any

import numpy as np

CHUNK = 4 << 20


def _sink(port_q: Any, streams: int) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(streams)
    port_q.put(srv.getsockname()[1])
    conns = [srv.accept()[0] for _ in range(streams)]
    import selectors

    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c, selectors.EVENT_READ)
    buf = bytearray(CHUNK)
    open_ = len(conns)
    while open_:
        for key, _ in sel.select():
            n = key.fileobj.recv_into(buf)  # type: ignore[union-attr]
            if not n:
                sel.unregister(key.fileobj)
                open_ -= 1


def _source(port: int, seconds: float, out_q: Any) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = memoryview(bytearray(CHUNK))
    sent = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s.sendall(data)
        sent += CHUNK
    dt = time.perf_counter() - t0
    s.close()
    out_q.put(sent / dt)


def tcp_loopback_gbps(streams: int = 1, seconds: float = 1.0) -> float:
    """Aggregate GB/s of ``streams`` TCP streams from one process to another on 127.0.0.1."""
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    sink = ctx.Process(target=_sink, args=(q, streams))
    sink.start()
    port = q.get()
    srcs = [ctx.Process(target=_source, args=(port, seconds, out)) for _ in range(streams)]
    for p in srcs:
        p.start()
    total = sum(out.get() for _ in srcs)
    for p in srcs:
        p.join()
    sink.join()
    return total / 1e9


def finish_peers(procs: list[subprocess.Popen[str]], timeout: float) -> list[str]:
    """Wait for every peer process and return their stdouts; SystemExit with the stderr of
    the first that failed. Processes still running after a failure are killed."""
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise SystemExit(f"FAILED: a peer exited with {p.returncode}:\n{err[-3000:]}")
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def print_table(rows: list[dict[str, Any]], cols: list[str],
                fmts: dict[str, str] | None = None) -> None:
    """Right-aligned table; floats as ``.3f`` unless ``fmts`` gives a column its own format."""
    fmts = fmts or {}
    cells = [[_fmt(r.get(c), fmts.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _fmt(v: Any, spec: str | None = None) -> str:
    if isinstance(v, float):
        return format(v, spec or ".3f")
    return "" if v is None else str(v)


def emit_json(name: str, rows: list[dict[str, Any]], **extra: Any) -> None:
    print(json.dumps({"bench": name, **extra, "rows": rows}))


def emit_json_lines(name: str, rows: list[dict[str, Any]], path: str | None = None,
                    **summary: Any) -> None:
    """One JSON object per row, then a summary line; to stdout and, given ``path``, to a file."""
    lines = [json.dumps({"bench": name, **r}) for r in rows]
    lines.append(json.dumps({"bench": name, "summary": True, **summary}))
    print("\n".join(lines), flush=True)
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


def abba(base: Any, fn: Any, r: int) -> tuple[float, float]:
    """One paired run of ``fn`` and its baseline ``base``, alternating which goes first
    (ABBA: even ``r`` the baseline first), so neither gains from the memory state the other
    leaves; (baseline seconds, ``fn`` seconds)."""
    first, second = (base, fn) if r % 2 == 0 else (fn, base)
    t0 = time.perf_counter()
    first()
    t1 = time.perf_counter()
    second()
    t2 = time.perf_counter()
    return (t1 - t0, t2 - t1) if r % 2 == 0 else (t2 - t1, t1 - t0)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """``4096``, ``4KiB``, ``1MiB``, ``1.5M`` (binary units) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"bad size {text!r} (bytes, or a number with K/KiB, M/MiB, G/GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def input_pattern(n: int) -> np.ndarray:
    """float32 input every rank contributes: 1 + (i mod 251), so the SUM over P ranks is exactly
    P x this (small integers), and a chunk landing at the wrong offset shows up."""
    return (np.arange(n, dtype=np.int64) % 251 + 1).astype(np.float32)


def check_result(x: np.ndarray, expected: np.ndarray, what: str) -> str | None:
    """``None`` when ``x`` equals ``expected`` exactly, else a message naming the first bad
    element."""
    if np.array_equal(x, expected):
        return None
    bad = np.flatnonzero(x != expected)
    i = int(bad[0]) if bad.size else -1
    return (f"{what}: WRONG all-reduce result: {bad.size} of {x.size} elements differ, first at "
            f"[{i}] = {x[i]!r}, expected {expected[i]!r}")


async def join_world(comm: Any, world: int) -> None:
    """Connect a pccl_aio ``Communicator`` and wait until its group has ``world`` peers."""
    await comm.connect(attempts=20)
    while comm.world_size < world:
        await comm.update_topology()


def init_gloo_rank(rank: int, world: int, port: int) -> Any:
    """Join a gloo process group through ``tcp://127.0.0.1:port`` with one compute thread
    (the reference machine has 2 cores for up to 4 ranks); returns ``torch``."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads its OpenMP runtime
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    return torch



# ---- bench/collectives.py: one rank's buffers, refill and exact check per collective ---------
COLLECTIVE_KINDS = ("broadcast", "all_gather", "reduce_scatter", "barrier")
CollectivePlan = list[tuple[str, int, int]]  # (kind, bytes per rank, timed iterations)


def collective_plan_arg(plan: CollectivePlan) -> str:
    return ",".join(f"{k}:{n}:{i}" for k, n, i in plan)


def parse_collective_plan(text: str) -> CollectivePlan:
    return [(k, int(n), int(i)) for k, n, i in (item.split(":") for item in text.split(","))]


class CollectiveCase:
    """One rank's float32 buffers for one (kind, size) of ``bench/collectives.py``, the same for
    every implementation. Rank r contributes ``input_pattern + 256 r`` (small integers, exact in
    float32, a block from the wrong rank or at the wrong offset shows up):

    - broadcast: ``src`` (``count`` elements, in place); the root, rank ``i mod P`` in iteration
      i, holds its pattern, every other rank -1 (so an untouched tensor fails the check);
    - all_gather: ``src`` ``count`` elements, ``dst`` P x ``count``: block b = rank b's input;
    - reduce_scatter: ``src`` P x ``count``, ``dst`` ``count``: chunk r of the SUM.

    ``refill(i)`` (untimed) rewrites the input and sets ``dst`` to -1; it returns the root."""

    def __init__(self, kind: str, rank: int, world: int, count: int) -> None:
        self.kind, self.rank, self.world, self.count = kind, rank, world, count
        self.base = input_pattern(count * world if kind == "reduce_scatter" else count)
        self.src = np.empty_like(self.base)
        dst_count = {"all_gather": count * world, "reduce_scatter": count}.get(kind)
        self.dst = self.src if dst_count is None else np.empty(dst_count, np.float32)

    def refill(self, i: int) -> int:
        root = i % self.world
        if self.kind != "broadcast":
            np.add(self.base, 256 * self.rank, out=self.src)
            self.dst.fill(-1.0)
        elif self.rank == root:
            np.add(self.base, 256 * root, out=self.src)
        else:
            self.src.fill(-1.0)
        return root

    def expected(self, i: int) -> list[tuple[slice, np.ndarray]]:
        n, p = self.count, self.world
        if self.kind == "broadcast":
            return [(slice(0, n), self.base + 256 * (i % p))]
        if self.kind == "all_gather":
            return [(slice(b * n, (b + 1) * n), self.base + 256 * b) for b in range(p)]
        chunk = self.base[self.rank * n:(self.rank + 1) * n]
        return [(slice(0, n), chunk * p + 256 * p * (p - 1) // 2)]

    def check(self, i: int, what: str) -> str | None:
        """``None`` when ``dst`` is exactly right after iteration ``i``, else a message naming
        the first bad element."""
        for part, want in self.expected(i):
            got = self.dst[part]
            if not np.array_equal(got, want):
                bad = np.flatnonzero(got != want)
                j = int(bad[0]) if bad.size else -1
                return (f"{what}: WRONG {self.kind} result: {bad.size} of the {got.size} "
                        f"elements [{part.start}:{part.stop}] differ, first at "
                        f"[{part.start + j}] = {got[j]!r}, expected {want[j]!r}")
        return None
