"""Shared benchmark helpers: loopback TCP baselines and result printing."""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
import statistics
import time
from typing import Any

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


def print_table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(w) for c, w in zip(cols, widths)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "" if v is None else str(v)


def emit_json(name: str, rows: list[dict[str, Any]], **extra: Any) -> None:
    print(json.dumps({"bench": name, **extra, "rows": rows}))


def median(xs: list[float]) -> float:
    return statistics.median(xs)
