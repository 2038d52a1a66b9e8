#!/usr/bin/env python3
# Vendored from ../shared/tools/wan_mesh.py (CI machines have no /work/shared); keep in step.
"""Userspace WAN mesh emulator between N network namespaces (for kernels without sch_netem).

Creates one TUN device in each existing namespace PREFIX1..PREFIXN (via setns; host i = SUBNET.i/24,
loopback up) and forwards IPv4 packets between them from this one process. Every ordered pair i->j
has its own drop-tail queue of --queue-bytes, rate (FIFO serialisation at RATE), one-way delay
(a packet is released at arrival + queueing + serialisation + DELAY), random loss and a cut switch
(partition: drops everything i->j, including packets already in flight). epoll over the TUN fds and
one heap of timed releases; per pair release times never go backwards, so a pair never reorders.
Large MTU (default 65000) keeps the packet rate within reach of Python at ~1 Gbit/s.

Usage (as root, namespaces must exist):
  python wan_mesh.py --n 3 [--prefix pccl_mesh_] [--subnet 10.204.0] [--delay-ms 50] [--rate-mbit 1000]
      [--mtu 65000] [--queue-bytes 16000000] [--ctl /tmp/pccl-wan-mesh.ctl]
Prints "ready" once serving; runs until SIGTERM/SIGINT, then prints the per-pair table. Control: one line
per command written to the FIFO --ctl, "REPLY_FIFO set I J [both] [delay=MS] [rate=MBIT] [loss=PCT]
[cut=0|1]" or "REPLY_FIFO show"; the text answer ("ok: ..." / "error: ..." / the table, then a line ".")
goes to REPLY_FIFO, which must be a FIFO named CTL.reply.* (wan-mesh makes one per call). Without
REPLY_FIFO the answer goes to stdout (the log).
"""
import argparse, ctypes, fcntl, heapq, os, random, select, signal, stat, struct, subprocess, time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
F_SETPIPE_SZ = 1031
EARLY = 0.0005  # release up to 0.5 ms early: epoll timeouts round up to whole ms, this centres the error
libc = ctypes.CDLL("libc.so.6", use_errno=True)
USAGE_SET = "usage: set I J [both] [delay=MS] [rate=MBIT] [loss=PCT] [cut=0|1]"


def setns(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path}) failed")
    finally:
        os.close(fd)


def make_tun(ns, name, ip, mtu):
    setns(f"/run/netns/{ns}")
    try:  # no IPv6 on the mesh devices (router solicitations etc. would only be dropped)
        with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as f:
            f.write("1")
    except OSError:
        pass
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    for cmd in (["ip", "addr", "add", f"{ip}/24", "dev", name],
                ["ip", "link", "set", name, "mtu", str(mtu), "up"],
                ["ip", "link", "set", "lo", "up"]):
        subprocess.run(cmd, check=True)  # runs inside ns: child inherits our current netns
    os.set_blocking(fd, False)
    return fd


class Pair:
    __slots__ = ("src", "dst", "delay", "bps", "loss", "cut", "free", "last",
                 "fwd_bytes", "fwd_pkts", "drop_queue", "drop_loss", "drop_cut", "drop_err")

    def __init__(self, src, dst, delay, bps):
        self.src, self.dst, self.delay, self.bps, self.loss, self.cut = src, dst, delay, bps, 0.0, False
        self.free = self.last = 0.0  # link free for the next packet; release time of the last packet
        self.fwd_bytes = self.fwd_pkts = self.drop_queue = self.drop_loss = self.drop_cut = self.drop_err = 0

    def describe(self):
        return (f"{self.src}->{self.dst} delay={self.delay * 1e3:g}ms rate={self.bps * 8 / 1e6:g}Mbit "
                f"loss={self.loss:g}% cut={int(self.cut)}")


def show(a, pairs, other, started):
    now = time.monotonic()
    out = [(f"wan-mesh: {a.n} hosts {a.subnet}.1..{a.n} ({a.prefix}1..{a.n}), mtu {a.mtu}, "
            f"queue {a.queue_bytes} B per pair, up {now - started:.0f} s, non-mesh packets dropped {other}, "
            f"write errors {sum(p.drop_err for row in pairs[1:] for p in row[1:] if p)}"),
           (f"{'pair':<7}{'delay_ms':>9}{'rate_mbit':>10}{'loss_%':>7}{'cut':>4}{'fwd_bytes':>14}{'fwd_pkts':>10}"
            f"{'queued_B':>10}{'drop_queue':>11}{'drop_loss':>10}{'drop_cut':>9}")]
    for row in pairs[1:]:
        for p in row[1:]:
            if p is None:
                continue
            queued = max(0.0, p.free - now) * p.bps
            out.append(f"{f'{p.src}->{p.dst}':<7}{p.delay * 1e3:>9g}{p.bps * 8 / 1e6:>10g}{p.loss:>7g}{int(p.cut):>4}"
                       f"{p.fwd_bytes:>14}{p.fwd_pkts:>10}{queued:>10.0f}{p.drop_queue:>11}{p.drop_loss:>10}"
                       f"{p.drop_cut:>9}")
    return "\n".join(out) + "\n"


def command(line, a, pairs, other, started):
    w = line.split()
    if w == ["show"]:
        return show(a, pairs, other, started)
    if not w or w[0] != "set":
        return "error: commands are 'show' and '" + USAGE_SET[7:] + "'\n"
    try:
        i, j = int(w[1]), int(w[2])
    except (IndexError, ValueError):
        return f"error: {USAGE_SET}\n"
    if not (1 <= i <= a.n and 1 <= j <= a.n and i != j):
        return f"error: need hosts 1 <= I, J <= {a.n} and I != J\n"
    both, kv = False, {}
    for t in w[3:]:
        k, eq, v = t.partition("=")
        if t == "both":
            both = True
            continue
        try:
            x = float(v)
        except ValueError:
            x = float("nan")
        ok = {"delay": 0 <= x <= 600_000, "rate": 0 < x <= 1e6, "loss": 0 <= x <= 100, "cut": x in (0, 1)}
        if not eq or not ok.get(k, False):
            return f"error: bad setting {t!r}; {USAGE_SET}\n"
        kv[k] = x
    if not kv:
        return f"error: nothing to set; {USAGE_SET}\n"
    targets = [pairs[i][j]] + ([pairs[j][i]] if both else [])
    for p in targets:
        if "delay" in kv:
            p.delay = kv["delay"] / 1e3
        if "rate" in kv:
            p.bps = kv["rate"] * 1e6 / 8
        if "loss" in kv:
            p.loss = kv["loss"]
        if "cut" in kv:
            p.cut = bool(kv["cut"])
    return "ok: " + "; ".join(p.describe() for p in targets) + "\n"


def reply(a, line, answer):
    """Control line 'REPLY_FIFO CMD...' (or just 'CMD...'): run it, send the answer + '.' to the FIFO.
    A command whose client has given up (its FIFO is gone or has no reader) is skipped, not applied."""
    w = line.split(None, 1)
    if not w or not w[0].startswith("/"):
        print(f"ctl {line!r}: {answer(line)}", end="", flush=True)
        return
    try:
        if not w[0].startswith(a.ctl + ".reply.") or not stat.S_ISFIFO(os.stat(w[0]).st_mode):
            raise OSError("not a reply FIFO")
        fd = os.open(w[0], os.O_WRONLY | os.O_NONBLOCK)  # ENXIO if the client is gone
    except OSError as e:
        print(f"ctl {line!r}: skipped, no reply FIFO ({e})", flush=True)
        return
    try:
        data = (answer(w[1] if len(w) > 1 else "") + ".\n").encode()
        if len(data) > 65536:
            fcntl.fcntl(fd, F_SETPIPE_SZ, len(data))
        os.write(fd, data)  # whole answer fits in the pipe buffer: never blocks the forwarder
    except OSError as e:
        print(f"ctl {line!r}: reply failed ({e})", flush=True)
    finally:
        os.close(fd)


def serve(a):
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    fds = [None] + [make_tun(f"{a.prefix}{i}", "tunmesh", f"{a.subnet}.{i}", a.mtu) for i in range(1, a.n + 1)]
    if libc.setns(home, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns(home) failed")
    delay, bps = a.delay_ms / 1e3, a.rate_mbit * 1e6 / 8
    pairs = [None] + [[None] + [Pair(i, j, delay, bps) if i != j else None for j in range(1, a.n + 1)]
                      for i in range(1, a.n + 1)]
    host_of = {fd: i for i, fd in enumerate(fds) if fd is not None}
    prefix3 = bytes(int(x) for x in a.subnet.split("."))
    if os.path.lexists(a.ctl):
        os.unlink(a.ctl)
    os.mkfifo(a.ctl, 0o600)
    cfd = os.open(a.ctl, os.O_RDWR | os.O_NONBLOCK)  # O_RDWR: never sees EOF when writers come and go
    ep = select.epoll()
    for fd in host_of:
        ep.register(fd, select.EPOLLIN)
    ep.register(cfd, select.EPOLLIN)
    cbuf = b""
    heap, seq, other, qbytes, n = [], 0, 0, a.queue_bytes, a.n
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *x: stop.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *x: stop.__setitem__(0, True))
    started = time.monotonic()
    print("ready", flush=True)
    while not stop[0]:
        timeout = 0.2 if not heap else min(0.2, max(0.0, heap[0][0] - EARLY - time.monotonic()))
        events = ep.poll(timeout)
        now = time.monotonic()
        for fd, _ in events:
            i = host_of.get(fd)
            if i is not None:  # packets from host i: classify by destination, then queue on pair i->j
                row = pairs[i]
                for _ in range(64):
                    try:
                        pkt = os.read(fd, 65536)
                    except OSError:  # BlockingIOError: drained
                        break
                    if len(pkt) < 20 or pkt[0] >> 4 != 4 or pkt[16:19] != prefix3:
                        other += 1
                        continue
                    j = pkt[19]
                    p = row[j] if j <= n else None
                    if p is None:
                        other += 1
                        continue
                    if p.cut:
                        p.drop_cut += 1
                        continue
                    if p.loss and random.random() * 100.0 < p.loss:
                        p.drop_loss += 1
                        continue
                    start = p.free if p.free > now else now
                    if (start - now) * p.bps + len(pkt) > qbytes:  # bytes still waiting to be serialised
                        p.drop_queue += 1
                        continue
                    p.free = start + len(pkt) / p.bps
                    t = p.free + p.delay
                    if t < p.last:  # delay was lowered: keep FIFO order within the pair
                        t = p.last
                    p.last = t
                    seq += 1
                    heapq.heappush(heap, (t, seq, p, pkt))
            elif fd == cfd:
                try:
                    cbuf += os.read(cfd, 65536)
                except OSError:
                    pass
                while b"\n" in cbuf:
                    line, cbuf = cbuf.split(b"\n", 1)
                    try:
                        reply(a, line.decode(errors="replace"), lambda cmd, o=other: command(cmd, a, pairs, o, started))
                    except Exception as e:  # a bad control line must never stop the forwarder
                        print(f"ctl {line!r}: {e!r}", flush=True)
                cbuf = cbuf[-65536:]
        due = time.monotonic() + EARLY
        while heap and heap[0][0] <= due:
            _, _, p, pkt = heapq.heappop(heap)
            if p.cut:
                p.drop_cut += 1
                continue
            try:
                os.write(fds[p.dst], pkt)
                p.fwd_pkts += 1
                p.fwd_bytes += len(pkt)
            except OSError:
                p.drop_err += 1
    os.close(cfd)
    try:
        os.unlink(a.ctl)
    except OSError:
        pass
    print(show(a, pairs, other, started), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int)
    ap.add_argument("--prefix", default="pccl_mesh_")
    ap.add_argument("--subnet", default="10.204.0")
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--rate-mbit", type=float, default=1000.0)
    ap.add_argument("--mtu", type=int, default=65000)
    ap.add_argument("--queue-bytes", type=int, default=16_000_000)
    ap.add_argument("--ctl", default="/tmp/pccl-wan-mesh.ctl")
    a = ap.parse_args()
    if a.n is None or not 2 <= a.n <= 254:
        ap.error("--n must be 2..254")
    if a.delay_ms < 0 or a.rate_mbit <= 0 or not 68 <= a.mtu <= 65535:
        ap.error("need --delay-ms >= 0, --rate-mbit > 0, 68 <= --mtu <= 65535")
    serve(a)


if __name__ == "__main__":
    main()
