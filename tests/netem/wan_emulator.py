#!/usr/bin/env python3
# ruff: noqa
# Vendored unchanged (but these two lines) from the project's shared tools/wan_emulator.py, for
# tests/netem: CI machines do not have the shared tools.
"""Userspace WAN emulator between two network namespaces (for kernels without sch_netem).

Creates a TUN device in each of two existing namespaces (via setns) and forwards IP packets between
them with a one-way delay and a rate limit (FIFO serialisation at RATE, then DELAY of propagation),
plus a drop-tail bottleneck buffer of --queue-bytes. Large MTU (default 65000) keeps the packet rate
low enough for Python at 1 Gbit/s; window/BDP effects on TCP are unchanged by the MTU choice.

Usage (as root, namespaces must exist):
  python wan_emulator.py --ns-a pccl_wan_a --ns-b pccl_wan_b --delay-ms 50 --rate-mbit 1000 \
      --ip-a 10.203.0.1 --ip-b 10.203.0.2 [--mtu 65000] [--queue-bytes 16000000]
Runs until SIGTERM/SIGINT; prints forwarded/dropped counters on exit.
"""
import argparse, collections, ctypes, fcntl, os, select, signal, struct, subprocess, sys, time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
libc = ctypes.CDLL("libc.so.6", use_errno=True)


def setns(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path}) failed")
    finally:
        os.close(fd)


def make_tun(ns, name, ip, peer, mtu):
    setns(f"/run/netns/{ns}")
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    for cmd in (["ip", "addr", "add", ip, "peer", peer, "dev", name],
                ["ip", "link", "set", name, "mtu", str(mtu), "up"],
                ["ip", "link", "set", "lo", "up"]):
        subprocess.run(cmd, check=True)  # runs inside ns: child inherits our current netns
    os.set_blocking(fd, False)
    return fd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns-a", required=True)
    ap.add_argument("--ns-b", required=True)
    ap.add_argument("--ip-a", default="10.203.0.1")
    ap.add_argument("--ip-b", default="10.203.0.2")
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--rate-mbit", type=float, default=1000.0)
    ap.add_argument("--mtu", type=int, default=65000)
    ap.add_argument("--queue-bytes", type=int, default=16_000_000)
    a = ap.parse_args()
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    fa = make_tun(a.ns_a, "tunwana", a.ip_a, a.ip_b, a.mtu)
    fb = make_tun(a.ns_b, "tunwanb", a.ip_b, a.ip_a, a.mtu)
    libc.setns(home, CLONE_NEWNET)
    delay = a.delay_ms / 1e3
    bps = a.rate_mbit * 1e6 / 8
    # per direction: queue of (release_time, pkt), time the link becomes free, bytes waiting for serialisation
    dirs = {fa: {"out": fb, "q": collections.deque(), "free": 0.0, "fwd": 0, "drop": 0},
            fb: {"out": fa, "q": collections.deque(), "free": 0.0, "fwd": 0, "drop": 0}}
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *x: stop.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *x: stop.__setitem__(0, True))
    print("ready", flush=True)
    while not stop[0]:
        now = time.monotonic()
        nxt = None
        for d in dirs.values():
            q = d["q"]
            while q and q[0][0] <= now:
                try:
                    os.write(d["out"], q.popleft()[1])
                    d["fwd"] += 1
                except BlockingIOError:
                    d["drop"] += 1
            if q:
                nxt = q[0][0] if nxt is None else min(nxt, q[0][0])
        timeout = 0.05 if nxt is None else max(0.0, nxt - time.monotonic())
        try:
            r, _, _ = select.select([fa, fb], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in r:
            d = dirs[fd]
            for _ in range(64):
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                start = max(now, d["free"])
                backlog_bytes = (start - now) * bps  # bytes still waiting to be serialised
                if backlog_bytes + len(pkt) > a.queue_bytes:
                    d["drop"] += 1
                    continue
                d["free"] = start + len(pkt) / bps
                d["q"].append((d["free"] + delay, pkt))
    print({"a->b_fwd": dirs[fa]["fwd"], "a->b_drop": dirs[fa]["drop"],
           "b->a_fwd": dirs[fb]["fwd"], "b->a_drop": dirs[fb]["drop"]}, flush=True)


if __name__ == "__main__":
    main()
