"""What a run secret and TLS cost: loopback busbw plain / secret / TLS, WAN all-reduce plain / TLS.

    python bench/security.py [--quick] [--json PATH] [--rounds 5] [--iters 8] [--mib 64]
                             [--wan-mib 256] [--wan-iters 3] [--no-wan]

Issue 17. Everything is measured in one run, each figure a ratio against plain measured in
the same run, interleaved:

1. **Loopback**, P = 2 peer processes, ``--mib`` MiB float32 SUM, out of place
   (``all_reduce(x, out)``), K = 1. Each peer process holds three communicators at once, one
   per variant, each with its own master (served by this process): ``plain`` (no secret, no
   TLS), ``secret`` (a run secret: one HMAC challenge-response per connection, at connect)
   and ``tls`` (the secret plus mutual TLS on the master and peer links; certificates made at
   run time with ``trustme``). A cycle runs one all-reduce of each variant back to back
   (a barrier before each, untimed), the order rotating from cycle to cycle; ``--iters``
   timed cycles after ``--warmup`` ones, in ``--rounds`` rounds of fresh processes. An
   all-reduce's time is the slower peer's; busbw = 2(P-1)/P x bytes / time. The ratio to
   plain is the median over all cycles of the per-cycle ratio busbw(variant) / busbw(plain)
   (variants seconds apart, so the drift of this shared VM cancels). ``cpu_ms`` is the
   user + system CPU (``getrusage``, all threads) both peers spent inside the timed call.
2. **Emulated WAN** (needs root; skipped otherwise or with ``--no-wan``): brings up
   ``../shared/tools/wan-link up 50 1000`` (100 ms RTT, 1 Gbit/s each way) unless it is up,
   as ``bench/wan.py`` does (masters and peer A in namespace A, peer B in B,
   ``tcp_slow_start_after_idle=0``; heartbeat timeout 30 s, see ``HB_WAN``), and runs a
   ``--wan-mib`` MiB all-reduce at K = 8 connections per neighbour, plain and TLS (+ secret),
   interleaved the same way.
3. **Where TLS's time goes on loopback**: one core encrypting and decrypting through a pair of
   ``ssl.SSLObject`` over ``MemoryBIO`` (the cipher the contexts negotiate; the same OpenSSL
   calls asyncio's TLS transport makes, without the sockets), next to one plain loopback TCP
   stream. Each peer of a P = 2 all-reduce encrypts and decrypts the whole buffer on its one
   event-loop thread, so ``crypto floor`` = bytes / encrypt rate + bytes / decrypt rate is the
   time TLS adds at least, and 2 x that is the CPU it adds at least.

Results are checked (exact SUM of integer-valued floats). Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # this checkout's pccl_aio, then the bench helpers
import numpy as np  # noqa: E402
from _common import finish_peers, input_pattern, print_table, tcp_loopback_gbps  # noqa: E402

WAN = ROOT.parent / "shared" / "tools" / "wan-link"
NS_A, NS_B, IP_A, IP_B = "pccl_wan_a", "pccl_wan_b", "10.203.0.1", "10.203.0.2"
LOOPBACK = ("plain", "secret", "tls")
WAN_VARIANTS = ("plain", "tls")
TARGETS = {("loopback", "secret"): 0.98, ("wan", "tls"): 0.95}
# On the emulated link the masters and peers allow 30 s of heartbeat silence (default 5 s):
# with 8 bulk streams filling the drop-tail queue, a master connection's heartbeats were
# sometimes lost long enough (TCP retransmission back-off) for the 5 s timeout to drop a
# peer ("heartbeat timeout" in the master's log, 3 of 9 runs), which ended the run.
HB_WAN = 30.0
# CONNECT_RETRY: over the 100 ms RTT link a peer's connect() once failed with
# "unexpected first message MasterHeartbeat()" (the master's heartbeat overtook its Welcome);
# the peer then retries with a fresh communicator, up to 3 times, saying so on stderr.


# ---- credentials -----------------------------------------------------------------------------
def make_credentials(d: Path) -> None:
    """A CA and one certificate for every address a peer or master may use, plus a run secret."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", IP_A, IP_B)
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    for p in cert.cert_chain_pems[1:]:
        p.write_to_path(str(d / "cert.pem"), append=True)
    (d / "secret").write_text(secrets.token_hex(32))
    os.chmod(d / "secret", 0o600)


def contexts(d: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    import pccl_aio as pccl

    return pccl.tls_contexts(str(d / "cert.pem"), str(d / "key.pem"), str(d / "ca.pem"))


def master_kwargs(variant: str, d: Path) -> dict[str, Any]:
    if variant == "plain":
        return {}
    secret = (d / "secret").read_text()
    return {"secret": secret} if variant == "secret" else {"secret": secret,
                                                           "ssl": contexts(d)[0]}


def peer_kwargs(variant: str, d: Path) -> dict[str, Any]:
    if variant == "plain":
        return {}
    secret = (d / "secret").read_text()
    if variant == "secret":
        return {"secret": secret}
    server, client = contexts(d)
    return {"secret": secret, "ssl": client, "ssl_server": server}


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PCCL_AIO_SECRET", "PCCL_AIO_SECRET_FILE")}  # plain must be plain
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE)])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# ---- one peer process: a communicator per variant, interleaved all-reduces -------------------
def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def peer(spec: dict[str, Any]) -> None:
    import pccl_aio as pccl

    d, variants = Path(spec["dir"]), spec["variants"]
    res: dict[str, dict[str, list[float]]] = {v: {"t": [], "cpu": []} for v in variants}
    async with AsyncExitStack() as stack:
        comms = {}
        for v in variants:
            for attempt in range(3):
                comm = pccl.Communicator(spec["addrs"][v], p2p_connections=spec["k"],
                                         listen_host=spec["listen"], data_timeout=60.0,
                                         heartbeat_timeout=spec.get("heartbeat_timeout", 5.0),
                                         **peer_kwargs(v, d))
                try:
                    await comm.connect(attempts=20)
                    break
                except pccl.MasterConnectionError as exc:  # see CONNECT_RETRY
                    await comm.close()
                    if attempt == 2:
                        raise
                    print(f"{v}: connect failed ({exc}), retrying", file=sys.stderr, flush=True)
            comms[v] = await stack.enter_async_context(comm)
            async with asyncio.timeout(180):  # never wait forever for a peer that died
                while comm.world_size < 2:
                    await comm.update_topology()
        x = input_pattern(spec["nbytes"] // 4)
        expected = x * 2
        out = np.empty_like(x)
        sync = np.zeros(1, np.float32)
        for cycle in range(spec["warmup"] + spec["iters"]):
            r = cycle % len(variants)
            for v in variants[r:] + variants[:r]:  # rotate which variant goes first
                out.fill(0.0)
                await comms[v].all_reduce(sync, tag=1)  # barrier: both start together
                c0, t0 = _cpu(), time.perf_counter()
                await comms[v].all_reduce(x, out, tag=0)
                t, c = time.perf_counter() - t0, _cpu() - c0
                if not np.array_equal(out, expected):
                    raise SystemExit(f"WRONG all-reduce result ({v}, cycle {cycle})")
                if cycle >= spec["warmup"]:
                    res[v]["t"].append(t)
                    res[v]["cpu"].append(c)
    print(json.dumps(res), flush=True)


def collect(procs: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    """Each peer's result: the last line of its stdout."""
    return [json.loads(out.strip().splitlines()[-1]) for out in finish_peers(procs, timeout)]


def pair(outs: list[dict[str, Any]], variants: tuple[str, ...]
         ) -> dict[str, dict[str, list[float]]]:
    """Per variant: each cycle's time (slower peer) and CPU (both peers)."""
    return {v: {"t": [max(ts) for ts in zip(*(o[v]["t"] for o in outs))],
                "cpu": [sum(cs) for cs in zip(*(o[v]["cpu"] for o in outs))]}
            for v in variants}


def spawn_peer(spec: dict[str, Any], ns: str | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--peer", json.dumps(spec)]
    if ns:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())


# ---- 1. loopback ---------------------------------------------------------------------------
async def loopback_round(d: Path, nbytes: int, iters: int, warmup: int) -> dict[str, Any]:
    import pccl_aio as pccl

    async with AsyncExitStack() as stack:
        addrs = {}
        for v in LOOPBACK:
            m = await stack.enter_async_context(
                pccl.Master("127.0.0.1", 0, **master_kwargs(v, d)))
            addrs[v] = m.address
        spec = {"dir": str(d), "variants": list(LOOPBACK), "addrs": addrs, "k": 1,
                "listen": "127.0.0.1", "nbytes": nbytes, "iters": iters, "warmup": warmup}
        procs = [spawn_peer(spec) for _ in range(2)]
        outs = await asyncio.to_thread(collect, procs, 600)
    return pair(outs, LOOPBACK)


# ---- 2. emulated WAN -----------------------------------------------------------------------
async def wan_masters(port: int, d: Path) -> None:
    import logging

    import pccl_aio as pccl

    logging.basicConfig(level=logging.INFO)  # to wan-masters.log: why a connection closed

    async with AsyncExitStack() as stack:
        for i, v in enumerate(WAN_VARIANTS):
            await stack.enter_async_context(pccl.Master(IP_A, port + i, heartbeat_timeout=HB_WAN,
                                                        **master_kwargs(v, d)))
        print("up", flush=True)
        await asyncio.Event().wait()


def wan_run(d: Path, nbytes: int, iters: int, warmup: int, port: int = 48240
            ) -> dict[str, Any]:
    log = open(d / "wan-masters.log", "w")  # noqa: SIM115 (the plain master's warning)
    m = subprocess.Popen(["ip", "netns", "exec", NS_A, sys.executable,
                          str(Path(__file__).resolve()), "--wan-masters", str(port), str(d)],
                         stdout=subprocess.PIPE, stderr=log, text=True, env=child_env())
    try:
        assert m.stdout is not None
        if m.stdout.readline().strip() != "up":
            raise SystemExit("FAILED: the WAN masters did not start:\n"
                             + (d / "wan-masters.log").read_text()[-2000:])
        addrs = {v: f"{IP_A}:{port + i}" for i, v in enumerate(WAN_VARIANTS)}
        spec = {"dir": str(d), "variants": list(WAN_VARIANTS), "addrs": addrs, "k": 8,
                "heartbeat_timeout": HB_WAN,
                "nbytes": nbytes, "iters": iters, "warmup": warmup}
        procs = [spawn_peer({**spec, "listen": IP_A}, NS_A),
                 spawn_peer({**spec, "listen": IP_B}, NS_B)]
        try:
            outs = collect(procs, 900)
        except SystemExit as exc:
            raise SystemExit(f"{exc}\nmasters' log:\n"
                             + (d / "wan-masters.log").read_text()[-3000:]) from None
    finally:
        m.terminate()
        m.wait()
        log.close()
    return pair(outs, WAN_VARIANTS)


# ---- 3. TLS on one core --------------------------------------------------------------------
def tls_core_rates(d: Path, total: int, chunk: int = 1 << 20) -> dict[str, Any]:
    """Encrypt and decrypt ``total`` bytes through an SSLObject pair on one thread; rates from
    the median time per ``chunk``."""
    server, client = contexts(d)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    cli = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(20):
        done = 0
        for side in (cli, srv):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == 2:
            break
    else:
        raise SystemExit("FAILED: TLS handshake over MemoryBIO")
    data = np.random.default_rng(0).integers(0, 255, chunk, dtype=np.uint8).tobytes()
    buf = bytearray(chunk)
    view = memoryview(buf)
    enc: list[float] = []
    dec: list[float] = []
    for i in range(total // chunk + 2):  # the first two are warm-up
        t0 = time.perf_counter()
        cli.write(data)
        wire = c_out.read()
        t1 = time.perf_counter()
        s_in.write(wire)
        got = 0
        while got < chunk:
            got += cast(int, srv.read(chunk - got, view[got:]))  # with a buffer: a count
        t2 = time.perf_counter()
        if i >= 2:
            enc.append(t1 - t0)
            dec.append(t2 - t1)
    assert buf == data
    e, d_ = statistics.median(enc), statistics.median(dec)  # robust to a preempted chunk
    cipher = cli.cipher()
    return {"cipher": cipher[0] if cipher else "?", "version": cli.version(),
            "encrypt_GBps": chunk / e / 1e9, "decrypt_GBps": chunk / d_ / 1e9,
            "enc_dec_GBps": chunk / (e + d_) / 1e9}


class _Count(asyncio.BufferedProtocol):
    """Receives into one 1 MiB buffer; acknowledges with one byte once ``total`` arrived."""

    def __init__(self, total: int) -> None:
        self.buf, self.total, self.got = bytearray(1 << 20), total, 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got >= self.total:
            self.transport.write(b"k")  # type: ignore[attr-defined]


async def stream_sink(tls: bool, d: Path, total: int) -> None:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Count(total), "127.0.0.1", 0,
                                   ssl=contexts(d)[0] if tls else None)
    print(srv.sockets[0].getsockname()[1], flush=True)
    c0 = _cpu()
    await asyncio.to_thread(sys.stdin.readline)  # the source is done
    print(json.dumps({"cpu": _cpu() - c0}), flush=True)
    srv.close()


async def stream_source(tls: bool, d: Path, port: int, total: int) -> None:
    ssl_ = contexts(d)[1] if tls else None
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ssl_, server_hostname="127.0.0.1" if tls else None)
    data = memoryview(bytearray(1 << 20))
    c0, t0 = _cpu(), time.perf_counter()
    for _ in range(total >> 20):
        writer.write(data)
        await writer.drain()
    await reader.readexactly(1)
    print(json.dumps({"s": time.perf_counter() - t0, "cpu": _cpu() - c0}), flush=True)
    writer.close()


def stream_rate(tls: bool, d: Path, total: int) -> dict[str, float]:
    """One asyncio (uvloop) stream between two processes on 127.0.0.1, plain or TLS."""
    me, env = [sys.executable, str(Path(__file__).resolve())], child_env()
    sink = subprocess.Popen([*me, "--stream-sink", str(int(tls)), str(d), str(total)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert sink.stdout is not None and sink.stdin is not None
    port = sink.stdout.readline().strip()
    src = subprocess.run([*me, "--stream-source", str(int(tls)), str(d), port, str(total)],
                         capture_output=True, text=True, env=env, timeout=300)
    sink.stdin.write("\n")
    sink.stdin.flush()
    rx = json.loads(sink.stdout.readline())
    sink.wait()
    if src.returncode != 0:
        raise SystemExit(f"FAILED: stream source:\n{src.stderr[-2000:]}")
    tx = json.loads(src.stdout.strip().splitlines()[-1])
    return {"GBps": total / tx["s"] / 1e9, "tx_cpu_per_GB": tx["cpu"] / total * 1e9,
            "rx_cpu_per_GB": rx["cpu"] / total * 1e9}


# ---- the driver ----------------------------------------------------------------------------
def summarise(part: str, runs: list[dict[str, Any]], variants: tuple[str, ...], nbytes: int,
              k: int) -> list[dict[str, Any]]:
    t = {v: [x for r in runs for x in r[v]["t"]] for v in variants}
    cpu = {v: [x for r in runs for x in r[v]["cpu"]] for v in variants}
    rows = []
    for v in variants:
        ratios = [tp / tv for tp, tv in zip(t["plain"], t[v])]  # busbw_v / busbw_plain
        med = statistics.median(t[v])
        target = TARGETS.get((part, v))
        ratio = statistics.median(ratios)
        rows.append({"part": part, "variant": v, "K": k, "MiB": nbytes / 2**20, "n": len(t[v]),
                     "median_ms": med * 1e3, "busbw_GBps": nbytes / med / 1e9,  # P = 2
                     "cpu_ms": statistics.median(cpu[v]) * 1e3,
                     "cores": statistics.median(c / x for c, x in zip(cpu[v], t[v])),
                     "vs_plain": ratio,
                     "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "target": f">={target}" if target else "-",
                     "ok": "-" if target is None else ("ok" if ratio >= target else "MISS")})
    return rows


def wan_up(wan_link: Path, delay_ms: int, rate_mbit: int) -> bool:
    """Bring the emulated link up unless it is; True if this run brought it up."""
    up = subprocess.run(["ip", "netns", "exec", NS_A, "true"], capture_output=True).returncode == 0
    if not up:
        subprocess.run(["bash", str(wan_link), "up", str(delay_ms), str(rate_mbit)], check=True)
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                        "net.ipv4.tcp_slow_start_after_idle=0"], check=True)
    return not up


def main() -> None:
    import pccl_aio as pccl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run (small, few repeats)")
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--rounds", type=int, default=5, help="loopback rounds (fresh processes)")
    ap.add_argument("--iters", type=int, default=8, help="timed cycles per loopback round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--wan-mib", type=float, default=256)
    ap.add_argument("--wan-iters", type=int, default=3)
    ap.add_argument("--wan-warmup", type=int, default=2)
    ap.add_argument("--delay-ms", type=int, default=50)
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--no-wan", action="store_true")
    ap.add_argument("--wan-link", default=str(WAN),
                    help="the wan-link script (default: %(default)s)")
    ap.add_argument("--json", metavar="PATH", help="also write the JSON line here")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--wan-masters", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--stream-sink", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--stream-source", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        return pccl.run(peer(json.loads(a.peer)))  # uvloop, as in use
    if a.wan_masters:
        return pccl.run(wan_masters(int(a.wan_masters[0]), Path(a.wan_masters[1])))
    if a.stream_sink:
        tls_, d_, n_ = a.stream_sink
        return pccl.run(stream_sink(tls_ == "1", Path(d_), int(n_)))
    if a.stream_source:
        tls_, d_, port_, n_ = a.stream_source
        return pccl.run(stream_source(tls_ == "1", Path(d_), int(port_), int(n_)))
    if a.quick:
        a.mib, a.rounds, a.iters, a.warmup = 16, 1, 3, 1
        a.wan_mib, a.wan_iters, a.wan_warmup = 32, 1, 1
    nbytes, wan_bytes = int(a.mib * 2**20) // 4 * 4, int(a.wan_mib * 2**20) // 4 * 4
    do_wan = not a.no_wan
    wan_link = Path(a.wan_link)
    if do_wan and (os.geteuid() != 0 or not wan_link.exists()):
        print(f"(no WAN part: needs root and {wan_link})", flush=True)
        do_wan = False
    t_start, load0 = time.monotonic(), os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pccl-sec-") as tmp:
        d = Path(tmp)
        os.chmod(d, 0o755)  # the namespaced children run as this user anyway
        make_credentials(d)

        # 3 first (a quiet machine): the per-core cost of TLS and of a plain stream
        tls = tls_core_rates(d, 64 << 20 if a.quick else 512 << 20)
        tcp1 = tcp_loopback_gbps(1, 1.0 if a.quick else 2.0)
        print(f"TLS on one core ({tls['version']} {tls['cipher']}): encrypt "
              f"{tls['encrypt_GBps']:.2f} GB/s, decrypt {tls['decrypt_GBps']:.2f} GB/s, both "
              f"{tls['enc_dec_GBps']:.2f} GB/s; one plain loopback TCP stream {tcp1:.2f} GB/s",
              flush=True)
        streams: dict[str, list[dict[str, float]]] = {"plain": [], "tls": []}
        for _ in range(1 if a.quick else 3):  # interleaved
            for v in streams:
                streams[v].append(stream_rate(v == "tls", d, (128 if a.quick else 512) << 20))
        stream = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                  for v, rs in streams.items()}
        print("one asyncio stream: " + "; ".join(
            f"{v} {r['GBps']:.2f} GB/s, CPU {r['tx_cpu_per_GB']:.2f} s/GB sending + "
            f"{r['rx_cpu_per_GB']:.2f} s/GB receiving" for v, r in stream.items()), flush=True)

        runs = []
        for rnd in range(a.rounds):
            runs.append(pccl.run(loopback_round(d, nbytes, a.iters, a.warmup)))
            print(f"loopback round {rnd + 1}/{a.rounds}: " + "  ".join(
                f"{v} {statistics.median(runs[-1][v]['t']) * 1e3:.1f} ms" for v in LOOPBACK),
                flush=True)
        rows += summarise("loopback", runs, LOOPBACK, nbytes, 1)

        if do_wan:
            brought_up = wan_up(wan_link, a.delay_ms, a.rate_mbit)
            try:
                wan = wan_run(d, wan_bytes, a.wan_iters, a.wan_warmup)
            finally:
                if brought_up:
                    subprocess.run(["bash", str(wan_link), "down"], check=False,
                                   stdout=subprocess.DEVNULL)
            print("wan: " + "  ".join(f"{v} " + " ".join(f"{x:.2f}" for x in wan[v]["t"]) + " s"
                                      for v in WAN_VARIANTS), flush=True)
            rows += summarise("wan", [wan], WAN_VARIANTS, wan_bytes, 8)
            link = a.rate_mbit * 1e6 / 8
            for r in rows[-len(WAN_VARIANTS):]:
                r["vs_link"] = r["busbw_GBps"] * 1e9 / link
            extra["wan"] = {"delay_ms": a.delay_ms, "rate_mbit": a.rate_mbit}

    # where TLS's time goes on loopback: what each peer must do per all-reduce (send and
    # receive the whole buffer), priced by the one-core crypto and the one-stream rates
    lo = {r["variant"]: r for r in rows if r["part"] == "loopback"}
    gb = nbytes / 1e9
    d_stream = (stream["tls"]["tx_cpu_per_GB"] - stream["plain"]["tx_cpu_per_GB"]
                + stream["tls"]["rx_cpu_per_GB"] - stream["plain"]["rx_cpu_per_GB"])
    where = {"crypto_ms_per_peer": gb * (1 / tls["encrypt_GBps"] + 1 / tls["decrypt_GBps"]) * 1e3,
             "stream_tls_extra_cpu_ms_per_peer": gb * d_stream * 1e3,
             "tls_extra_cpu_ms_per_peer": (lo["tls"]["cpu_ms"] - lo["plain"]["cpu_ms"]) / 2,
             "tls_extra_ms": lo["tls"]["median_ms"] - lo["plain"]["median_ms"],
             "stream": stream}
    elapsed = time.monotonic() - t_start

    print()
    cols = ["part", "variant", "K", "MiB", "n", "median_ms", "busbw_GBps", "cpu_ms", "cores",
            "vs_plain", "ratio_min", "ratio_max", "target", "ok"]
    if do_wan:
        cols.insert(7, "vs_link")
    print_table(rows, cols, {"MiB": ".0f", "median_ms": ".1f", "cpu_ms": ".1f",
                             "busbw_GBps": ".3f", "vs_link": ".2f"})
    print(f"TLS on one core ({tls['cipher']}): encrypt {tls['encrypt_GBps']:.2f}, decrypt "
          f"{tls['decrypt_GBps']:.2f} GB/s; one asyncio stream plain "
          f"{stream['plain']['GBps']:.2f} GB/s, TLS {stream['tls']['GBps']:.2f} GB/s; "
          f"plain TCP {tcp1:.2f} GB/s")
    print(f"loopback TLS per all-reduce: +{where['tls_extra_ms']:.1f} ms wall, "
          f"+{where['tls_extra_cpu_ms_per_peer']:.1f} ms CPU per peer; the peer's "
          f"{a.mib:g} MiB out and in cost {where['crypto_ms_per_peer']:.1f} ms of encrypt + "
          f"decrypt alone, +{where['stream_tls_extra_cpu_ms_per_peer']:.1f} ms CPU priced at "
          f"the asyncio TLS stream's extra CPU per GB")
    load = (load0, os.getloadavg()[0])
    print(f"({elapsed:.0f} s; load average {load[0]:.2f} at start, {load[1]:.2f} at end; "
          f"P = 2; busbw = 2(P-1)/P x bytes / time of the slower peer; vs_plain = median over "
          f"cycles of busbw / plain busbw in the same cycle)")
    line = json.dumps({"bench": "security", "rows": rows, "tls_core": tls,
                       "tcp1_loopback_GBps": tcp1, "where_tls_time_goes": where,
                       "elapsed_s": elapsed, "loadavg_start_end": load, "quick": a.quick,
                       **extra})
    print(line)
    if a.json:
        Path(a.json).write_text(line + "\n")


if __name__ == "__main__":
    main()
