"""Seeded fuzz of a running master over real sockets: many connections, each hostile in its
own way, before and after the handshake of a run with a secret.

    python tests/stress/socket_fuzz.py --frames 100000 --seed 7 --port 48148 --secret S

Per connection (its own ``random.Random`` of the seed and the connection's index, so the
plan of connection i is the same in every run of a seed) one of:

- before or instead of the handshake: random bytes, a truncated ``OPEN``, an ``OPEN`` with a
  wrong magic, version or role, a wrong proof, a replay of another connection's ``OPEN`` and
  ``PROOF``, a short proof, the handshake of a wrong secret;
- the handshake with the right secret, then batches of frames that keep the connection open
  (``Heartbeat``, ``WithdrawVote``), with or without a ``Hello`` first, ended by one hostile
  unit: a random body, a hostile or corrupted message of ``fuzz_master.py``'s generators, a
  vote or collective a joiner may not send, a second ``Hello``, a length prefix over the
  limit, a large frame left incomplete, a truncated frame, a ``Leave``, or nothing;
- rarely (at most ``LINGERERS`` at once, beside the ``concurrency`` slots): a connection that
  stalls (half an ``OPEN``, no ``Hello``, a silent joiner, half a frame) until the master
  drops it.

A *frame* is one length-prefixed unit, or one handshake message or chunk of garbage. Every
connection reads what the master sends (so the master's writes never block on us) and
decodes it after the handshake. Anything the master does that it must not (accepts a bad
handshake, welcomes a fuzz client as a member, sends it a ``Membership``, keeps a connection
open after a protocol violation, does not answer) is counted in ``Stats.anomalies``.

Needs only the package (no pytest). Exit status 1 if any anomaly was seen.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import hmac
import json
import random
import struct
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from pccl_aio._errors import RemoteProtocolError  # noqa: E402
from pccl_aio._net.handshake import HandshakeError, greet  # noqa: E402
from pccl_aio._wire import auth  # noqa: E402
from pccl_aio._wire import messages as m  # noqa: E402
from pccl_aio._wire.framing import MAX_FRAME_SIZE, frame  # noqa: E402
from tests.stress.fuzz_master import Fuzzer  # noqa: E402

PV = m.PROTOCOL_VERSION
BEFORE_HELLO = 64 << 10  # the master's largest frame before a Hello
REPLY_TIMEOUT = 10.0  # the master must answer (or close) within this
LINGER_TIMEOUT = 15.0  # ... and drop a stalled connection within this
LINGERERS = 12

# Connection plans and their weights.
PRE = {"garbage": 8, "truncated_open": 5, "bad_magic": 3, "bad_version": 3, "bad_role": 4,
       "wrong_proof": 5, "replay": 5, "short_proof": 3, "wrong_secret": 4}
POST = {"unnamed": 12, "joiner": 38}
LINGER = ("stall_open", "stall_unnamed", "silent_joiner", "stall_frame")
# How a post-handshake connection ends; "closes" ones must make the master close it.
ENDINGS = {"none": 4, "eof_only": 3, "random_body": 8, "hostile": 10, "corrupt": 6,
           "joiner_vote": 8, "second_hello": 2, "oversized": 4, "large_partial": 3,
           "truncated": 5, "leave": 2, "bad_msgpack": 2}
CLOSES = {"joiner_vote", "second_hello", "oversized", "bad_msgpack", "leave"}
_WRITE_ERRORS = (ConnectionError, OSError)
_CLOSED = (*_WRITE_ERRORS, RuntimeError)  # (uvloop: RuntimeError on a closed transport)


@dataclasses.dataclass
class Stats:
    """What the fuzz did and saw (``as_dict`` for JSON)."""

    frames: int = 0
    connections: int = 0
    pre_handshake_frames: int = 0  # sent on connections that never completed a handshake
    refused: int = 0  # handshakes the master refused (a refusal status, or it closed)
    accepted: int = 0  # handshakes completed with the right secret
    after_handshake_frames: int = 0
    hellos: int = 0
    admitted: int = 0  # Welcome(accepted) or Membership received by a fuzz client
    closed_by_master: int = 0  # closed before our EOF (kicked, refused, timed out): a lower
    # bound, since a master that closes after a last frame may see our EOF first
    lingered: int = 0  # stalled connections the master dropped on its own
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    plans: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    endings: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    refusals: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    replies: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    anomalies: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
        return out

    def anomaly(self, what: str) -> None:
        if len(self.anomalies) < 100:
            self.anomalies.append(what)


class _Recorder:
    """A writer for ``greet`` that keeps what it writes (the ``OPEN`` and the ``PROOF``)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._w = writer
        self.sent: list[bytes] = []

    @property
    def transport(self) -> asyncio.BaseTransport:
        return self._w.transport

    def write(self, data: bytes) -> None:
        self.sent.append(bytes(data))
        self._w.write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._w.get_extra_info(name, default)


class _Conn:
    """One fuzz connection: writes counted as frames, and a task reading the master."""

    def __init__(self, fuzz: SocketFuzz, name: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.fuzz, self.name = fuzz, name
        self.reader, self.writer = reader, writer
        self.frames = 0
        self.gone = False  # the master closed (or reset) the connection
        self.finished = False  # we sent everything (and maybe our EOF)
        self.reading: asyncio.Task[None] | None = None

    async def send(self, *units: bytes) -> bool:
        """Write ``units`` (each counted as a frame) at once; False if the master is gone."""
        if self.gone:
            return False
        data = b"".join(units)
        try:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), REPLY_TIMEOUT)
        except TimeoutError:
            self.fuzz.stats.anomaly(f"{self.name}: the master read nothing for "
                                    f"{REPLY_TIMEOUT:g} s")
            self.gone = True
            return False
        except _CLOSED:
            self.gone = True
            return False
        self.frames += len(units)
        self.fuzz.stats.frames += len(units)
        self.fuzz.stats.bytes_sent += len(data)
        return True

    async def read(self, n: int) -> bytes | None:
        """``n`` bytes from the master, or None at EOF or reset."""
        try:
            data = await asyncio.wait_for(self.reader.readexactly(n), REPLY_TIMEOUT)
        except TimeoutError:
            self.fuzz.stats.anomaly(f"{self.name}: no answer within {REPLY_TIMEOUT:g} s")
            return None
        except (asyncio.IncompleteReadError, *_WRITE_ERRORS):
            self.gone = True
            return None
        self.fuzz.stats.bytes_received += n
        return data

    def start_reading(self, frames: bool) -> None:
        self.reading = asyncio.ensure_future(self._read_all(frames))

    async def _read_all(self, frames: bool) -> None:
        """Read (and after the handshake decode) what the master sends, until it closes."""
        stats = self.fuzz.stats
        try:
            while True:
                if not frames:
                    data = await self.reader.read(1 << 16)
                    if not data:
                        break
                    stats.bytes_received += len(data)
                    continue
                (n,) = struct.unpack(">I", await self.reader.readexactly(4))
                body = await self.reader.readexactly(n)
                stats.bytes_received += 4 + n
                try:
                    msg = m.decode_master_to_peer(body)
                except RemoteProtocolError as exc:
                    stats.anomaly(f"{self.name}: undecodable frame from the master: {exc}")
                    continue
                kind = type(msg).__name__
                stats.replies[kind] += 1
                if (isinstance(msg, m.Welcome) and msg.accepted) or isinstance(
                        msg, (m.Membership, m.CollectiveStart, m.SyncPlan)):
                    stats.admitted += 1  # (a run without members: the first Hello is one)
        except (asyncio.IncompleteReadError, *_WRITE_ERRORS):
            pass
        if not self.finished:
            stats.closed_by_master += 1
        self.gone = True

    async def closed(self, timeout: float = REPLY_TIMEOUT) -> bool:
        """Wait until the master closes the connection; False if it does not in time."""
        assert self.reading is not None
        try:
            await asyncio.wait_for(asyncio.shield(self.reading), timeout)
        except TimeoutError:
            return False
        return True

    async def finish(self) -> None:
        """We are done: send our EOF and wait for the master to close its side."""
        self.finished = True
        if not self.gone:
            with contextlib.suppress(*_CLOSED):
                self.writer.write_eof()
        if self.reading is not None and not await self.closed():
            self.fuzz.stats.anomaly(f"{self.name}: still open {REPLY_TIMEOUT:g} s after our EOF")

    def abort(self) -> None:
        if self.reading is not None and not self.reading.done():
            self.reading.cancel()
        self.writer.transport.abort()


class SocketFuzz:
    """Connections to ``host:port`` (a master with run secret ``secret``) until ``frames``
    frames were sent, ``concurrency`` at a time; ``run()`` returns the ``Stats``."""

    def __init__(self, port: int, secret: str | bytes, frames: int, seed: int, *,
                 host: str = "127.0.0.1", concurrency: int = 8) -> None:
        self.host, self.port = host, port
        self.key = auth.secret_key(secret)
        self.target, self.seed, self.concurrency = frames, seed, concurrency
        self.stats = Stats()
        self.replays: collections.deque[tuple[bytes, bytes]] = collections.deque(maxlen=64)
        self._gen = Fuzzer(seed)  # fuzz_master's message generators (its rng set per use)
        self._plans = (list(PRE) + list(POST), list(PRE.values()) + list(POST.values()))
        self._endings = (list(ENDINGS), list(ENDINGS.values()))

    async def run(self) -> Stats:
        """Fuzz until ``frames`` frames were sent, then wait for every connection to end."""
        start = time.perf_counter()
        slots = asyncio.Semaphore(self.concurrency)
        lingering: set[asyncio.Task[None]] = set()
        running: set[asyncio.Task[None]] = set()
        await self._seed_replays()
        i = 0
        while self.stats.frames < self.target:
            await slots.acquire()
            i += 1
            rng = random.Random(f"{self.seed}/{i}")
            if (rng.random() < 0.01 and len(lingering) < LINGERERS
                    and self.stats.frames < 0.8 * self.target):
                slots.release()  # a lingerer does not take one of the slots
                task = asyncio.ensure_future(self._linger(i, rng))
                lingering.add(task)
                task.add_done_callback(lingering.discard)
                continue
            task = asyncio.ensure_future(self._one(i, rng))
            running.add(task)
            task.add_done_callback(running.discard)
            task.add_done_callback(lambda _: slots.release())
        await asyncio.gather(*running, *lingering)
        self.stats.seconds = time.perf_counter() - start
        return self.stats

    async def _seed_replays(self) -> None:
        """One honest handshake, so that replays have something to replay from the start."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        rec = _Recorder(writer)
        try:
            await asyncio.wait_for(greet(reader, rec, auth.ROLE_MASTER, self.key, 0, 0),
                                   REPLY_TIMEOUT)
            self.replays.append((rec.sent[0], rec.sent[1]))
        finally:
            writer.transport.abort()

    async def _connect(self, name: str) -> _Conn | None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            self.stats.anomaly(f"{name}: cannot connect: {exc}")
            return None
        self.stats.connections += 1
        return _Conn(self, name, reader, writer)

    async def _one(self, i: int, rng: random.Random) -> None:
        plan = rng.choices(*self._plans)[0]
        self.stats.plans[plan] += 1
        conn = await self._connect(f"connection {i} ({plan})")
        if conn is None:
            return
        try:
            if plan in PRE:
                await self._refused(conn, plan, rng)
            else:
                await self._accepted(conn, plan, rng)
        except Exception as exc:  # a bug of the fuzzer: report it, never hide it
            self.stats.anomaly(f"{conn.name}: the fuzzer raised {exc!r}")
        finally:
            conn.abort()

    # ---- before or instead of the handshake ---------------------------------------------------
    async def _refused(self, conn: _Conn, plan: str, rng: random.Random) -> None:
        stats = self.stats
        status = await self._bad_handshake(conn, plan, rng)
        stats.pre_handshake_frames += conn.frames
        if status == auth.OK:
            stats.anomaly(f"{conn.name}: the master accepted a bad handshake")
            return
        stats.refused += 1
        stats.refusals[plan if status is None else auth.STATUS.get(status, str(status))] += 1
        conn.start_reading(frames=False)
        await conn.finish()

    async def _bad_handshake(self, conn: _Conn, plan: str, rng: random.Random) -> int | None:
        """Send ``plan``'s bad handshake; the master's status (None: it closed, or we did)."""
        opening = auth.open_message(auth.ROLE_MASTER, rng.randrange(2**64), 0)
        if plan == "garbage":
            for _ in range(rng.randint(1, 4)):
                if not await conn.send(rng.randbytes(rng.randint(1, 120))):
                    break
            return None
        if plan == "truncated_open":
            await conn.send(opening[:rng.randint(1, auth.OPEN.size - 1)])
            return None
        if plan in ("bad_magic", "bad_version", "bad_role"):
            magic, version, role, nonce, client, server = auth.OPEN.unpack(opening)
            if plan == "bad_magic":
                magic = rng.choice((0, auth.MAGIC ^ (1 << rng.randrange(32)), 0x16030100))
            elif plan == "bad_version":
                version = rng.choice((0, auth.VERSION + 1, 0xFFFF))
            else:
                role = rng.choice((0, auth.ROLE_DATA, auth.ROLE_STATE, 4, 255))
            await conn.send(auth.OPEN.pack(magic, version, role, nonce, client, server))
            raw = await conn.read(auth.CHALLENGE.size)
            if raw is None:
                return None
            status = auth.CHALLENGE.unpack(raw)[1]
            want = {"bad_version": auth.BAD_VERSION, "bad_role": auth.UNKNOWN_PEER}.get(plan)
            if status != want:
                self.stats.anomaly(f"{conn.name}: refused with status {status}, not {want}")
            return int(status)
        if plan == "replay":
            opening, proof = rng.choice(self.replays)
        if not await conn.send(opening):
            return None
        raw = await conn.read(auth.CHALLENGE.size)
        if raw is None:
            self.stats.anomaly(f"{conn.name}: no CHALLENGE for a valid OPEN")
            return None
        magic, status, nonce = auth.CHALLENGE.unpack(raw)
        if magic != auth.MAGIC or status != auth.OK:
            self.stats.anomaly(f"{conn.name}: CHALLENGE {raw.hex()} for a valid OPEN")
            return int(status)
        if plan == "wrong_secret":  # the client of another run proves its own key
            proof = auth.proof(rng.randbytes(auth.KEY_SIZE), opening, nonce)
        if plan == "short_proof":
            await conn.send(rng.randbytes(rng.randint(1, auth.PROOF.size - 1)))
            return None
        if plan == "wrong_proof":
            wrong = rng.choice((rng.randbytes(32), b"", self.key[::-1]))
            proof = rng.choice((
                rng.randbytes(auth.PROOF.size),
                hmac.new(wrong, b"client" + opening + nonce, hashlib.sha256).digest()))
        if not await conn.send(proof):
            return None
        raw = await conn.read(auth.VERDICT.size)
        if raw is None:
            return None
        magic, status, _reason, mac = auth.VERDICT.unpack(raw)
        if status != auth.OK and mac != bytes(32):  # no oracle: no proof to a failed client
            self.stats.anomaly(f"{conn.name}: the master proved its key to a refused client")
        return int(status) if magic == auth.MAGIC else -1

    # ---- after the handshake -----------------------------------------------------------------
    async def _handshake(self, conn: _Conn) -> bool:
        rec = _Recorder(conn.writer)
        try:
            await asyncio.wait_for(greet(conn.reader, rec, auth.ROLE_MASTER, self.key, 0, 0),
                                   REPLY_TIMEOUT)
        except (HandshakeError, TimeoutError, *_WRITE_ERRORS) as exc:
            self.stats.anomaly(f"{conn.name}: the right secret was refused: {exc!r}")
            return False
        self.stats.accepted += 1
        self.stats.frames += 2  # OPEN and PROOF
        conn.frames += 2
        self.replays.append((rec.sent[0], rec.sent[1]))
        conn.start_reading(frames=True)
        return True

    def _benign(self, rng: random.Random, n: int) -> list[bytes]:
        """``n`` frames a connection may send at any time: heartbeats and withdrawals."""
        out = []
        for _ in range(n):
            if rng.random() < 0.85:
                out.append(_HEARTBEAT)
            else:
                out.append(_WITHDRAW[rng.randrange(3)])
        return out

    def _hello(self, rng: random.Random) -> bytes:
        return frame(m.encode(m.Hello(PV, rng.choice((0, 0, 0, 1, 7)), rng.randint(1, 65535),
                                      rng.choice(("", "", "127.0.0.1")),
                                      rng.choice((0, rng.randint(1, 65535))))))

    def _ending(self, rng: random.Random, ending: str, hello: bool) -> list[bytes]:
        """The hostile unit(s) that end a connection (a length prefix, a body)."""
        gen = self._gen
        gen.rng = rng  # fuzz_master's generators draw from this connection's rng
        if ending == "random_body":
            return [frame(rng.randbytes(rng.randint(0, 300)))]
        if ending == "bad_msgpack":
            return [frame(rng.choice((b"\xc1", b"\x91", b"\x92\x01", b"\xdd\xff\xff\xff\xff",
                                      b"\x91" * 5000)))]
        if ending in ("hostile", "corrupt", "joiner_vote"):
            if ending == "hostile":
                msg: Any = gen.hostile_msg()
            elif ending == "corrupt":
                msg = gen.corrupt(self._vote(rng, fields=True))
            else:
                msg = self._vote(rng)
            try:
                return [frame(m.encode(msg))]
            except (OverflowError, UnicodeEncodeError, msgspec.EncodeError):  # beyond msgpack
                return [frame(b"\x91" + rng.randbytes(20))]
        if ending == "second_hello":
            return [self._hello(rng)]
        if ending == "leave":
            return [frame(m.encode(m.Leave()))]
        limit = MAX_FRAME_SIZE if hello else BEFORE_HELLO
        if ending == "oversized":
            return [struct.pack(">I", rng.randint(limit + 1, 2**32 - 1))]
        if ending == "large_partial":  # within the limit, never completed (a large reservation)
            n = rng.randint(BEFORE_HELLO // 2, limit)
            return [struct.pack(">I", n) + rng.randbytes(min(n - 1, rng.randint(0, 256 << 10)))]
        if ending == "truncated":
            n = rng.randint(1, 4096)
            return [rng.choice((struct.pack(">I", n)[:rng.randint(1, 3)],
                                struct.pack(">I", n) + bytes(rng.randint(0, n - 1))))]
        return []  # "none", "eof_only"

    def _vote(self, rng: random.Random, fields: bool = False) -> Any:
        """A message only an accepted member may send (a joiner or unnamed client: a kick);
        ``fields``: one with fields to corrupt."""
        return rng.choice((
            *(() if fields else (m.VoteUpdateTopology(), m.VotePeersPending())),
            m.CollectiveInit(0, 65536, 10, 0),
            m.CollectiveInit(rng.randrange(2**32), rng.randint(1, 2**20), 10, 0),
            m.CollectiveWait(0), m.CollectiveDone(0, rng.randint(0, 9), rng.random() < 0.5, "x"),
            m.VoteSync(rng.randint(0, 5), 0, [m.SyncEntry("w", 10, 64, bytes(16))]),
            m.SyncDone(rng.random() < 0.5, "")))

    async def _accepted(self, conn: _Conn, plan: str, rng: random.Random) -> None:
        stats = self.stats
        if not await self._handshake(conn):
            return
        before = conn.frames
        hello = plan == "joiner"
        quota = rng.choice((rng.randint(1, 20), rng.randint(1, 100), rng.randint(50, 400)))
        ending = rng.choices(*self._endings)[0]
        if not hello and ending in ("joiner_vote", "second_hello"):
            ending = "joiner_vote"  # before a Hello, a Hello is legal: vote instead
        stats.endings[ending] += 1
        units: list[bytes] = []
        if hello:
            units.append(self._hello(rng))
            stats.hellos += 1
        units += self._benign(rng, max(0, quota - len(units)))
        tail = self._ending(rng, ending, hello)
        # The hostile unit goes somewhere in the last units: what follows it is sent after a
        # kick (the master must ignore it).
        cut = max(len(units) - rng.randint(0, 3), 0)
        units[cut:cut] = tail
        tail_end, sent = cut + len(tail), 0
        while sent < len(units) and not conn.gone:
            n = rng.randint(1, 64)
            if await conn.send(*units[sent:sent + n]):
                sent += n
        stats.after_handshake_frames += conn.frames - before
        must_close = tail and sent >= tail_end and ending in CLOSES
        if must_close and not conn.gone and not await conn.closed():
            stats.anomaly(f"{conn.name}: still open {REPLY_TIMEOUT:g} s after {ending}")
        await conn.finish()

    # ---- stalled connections -----------------------------------------------------------------
    async def _linger(self, i: int, rng: random.Random) -> None:
        """A connection that stalls: the master must drop it on its own (deadlines)."""
        stats = self.stats
        plan = rng.choice(LINGER)
        stats.plans[plan] += 1
        conn = await self._connect(f"connection {i} ({plan})")
        if conn is None:
            return
        try:
            if plan == "stall_open":
                opening = auth.open_message(auth.ROLE_MASTER, 0, 0)
                await conn.send(opening[:rng.randint(1, auth.OPEN.size - 1)])
                stats.pre_handshake_frames += conn.frames
                conn.start_reading(frames=False)
            else:
                if not await self._handshake(conn):
                    return
                units = []
                if plan in ("silent_joiner", "stall_frame"):
                    units.append(self._hello(rng))
                    stats.hellos += 1
                if plan == "stall_frame":
                    units.append(struct.pack(">I", 1000) + bytes(rng.randint(0, 999)))
                if units:
                    await conn.send(*units)
                    stats.after_handshake_frames += len(units)
            t0 = time.perf_counter()
            if await conn.closed(LINGER_TIMEOUT):
                stats.lingered += 1
            else:
                stats.anomaly(f"{conn.name}: a stalled connection still open after "
                              f"{time.perf_counter() - t0:.1f} s")
            conn.finished = True
        except Exception as exc:  # a bug of the fuzzer: report it, never hide it
            stats.anomaly(f"{conn.name}: the fuzzer raised {exc!r}")
        finally:
            conn.abort()


_HEARTBEAT = frame(m.encode(m.Heartbeat()))
_WITHDRAW = [frame(m.encode(m.WithdrawVote(k))) for k in ("topology", "pending", "sync")]


async def fuzz(port: int, secret: str | bytes, frames: int, seed: int, *,
               host: str = "127.0.0.1", concurrency: int = 8) -> Stats:
    """Fuzz the master at ``host:port`` (run secret ``secret``) with at least ``frames``
    frames of seed ``seed``; returns the ``Stats`` (``anomalies`` lists what went wrong)."""
    return await SocketFuzz(port, secret, frames, seed, host=host,
                            concurrency=concurrency).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Seeded fuzz of a running pccl_aio master over real sockets.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--frames", type=int, default=100_000, help="frames to send (at least)")
    p.add_argument("--seed", type=int, default=0, help="random seed (plans are reproducible)")
    p.add_argument("--host", default="127.0.0.1", help="the master's address")
    p.add_argument("--port", type=int, required=True, help="the master's port")
    p.add_argument("--secret", required=True, help="the run secret")
    p.add_argument("--concurrency", type=int, default=8, help="connections at once")
    p.add_argument("--json", action="store_true",
                   help='print {"event": "start"} when fuzzing starts, then the stats as one '
                        'JSON line')
    args = p.parse_args(argv)
    from pccl_aio import run

    async def go() -> Stats:
        if args.json:
            print(json.dumps({"event": "start"}), flush=True)
        return await fuzz(args.port, args.secret, args.frames, args.seed, host=args.host,
                          concurrency=args.concurrency)

    stats = run(go())
    if args.json:
        print(json.dumps(stats.as_dict()), flush=True)
    else:
        for k, v in stats.as_dict().items():
            print(f"{k}: {v}")
    return 1 if stats.anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
