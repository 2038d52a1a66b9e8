"""A member of a churn run (it holds the run secret) running modified code: one process, one
misbehaviour, then it exits (refused or kicked) or is killed by the orchestrator.

    python tests/stress/insider.py WAY MASTER_ADDR   # the secret from $PCCL_AIO_SECRET

WAY is one of ``WAYS``:

- ``term``: a ``Hello`` naming term 2**63 - 1, then heartbeats (the master must not step down);
- ``overflow``: a rejoin naming ring id 2**64 - 1 (refused at decode: no id past 63 bits);
- ``claim``: a rejoin claiming ids 1-8 as a member of a one-peer ring at a higher term (a joiner
  with a fresh id; at a restarted master with a master secret, a new peer);
- ``mute``: joins, heartbeats, never votes (kicked after the master's vote timeout);
- ``count``: joins, syncs, then all-reduces 2 elements where the others reduce 1 (kicked as
  the lone dissenter);
- ``silent``: joins, syncs, votes the all-reduce and sends no data (named by its successor,
  kicked);
- ``guess``: an outsider: 200 handshakes with guessed keys (all refused, nothing learnt).

Prints one JSON line: ``{"event": "insider", "way": ..., "outcome": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys

import numpy as np

import pccl_aio as pccl
from pccl_aio._net.handshake import HandshakeError, greet
from pccl_aio._net.stream import read_frame
from pccl_aio._peer import testing
from pccl_aio._wire import auth
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import frame

WAYS = ("term", "overflow", "claim", "mute", "count", "silent", "guess")
ELEMS = int(os.environ.get("STATE_ELEMS", 1 << 16))  # the honest workers' state size


async def _raw(host: str, port: int, key: bytes
               ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    await asyncio.wait_for(greet(reader, writer, auth.ROLE_MASTER, key, 0, 0), 5)
    return reader, writer


async def _session(host: str, port: int, key: bytes, hello: m.Hello, seconds: float) -> str:
    """Say ``hello``, heartbeat for ``seconds``; the master's last word (or "silence")."""
    reader, writer = await _raw(host, port, key)
    writer.write(frame(m.encode(hello)))
    last = "silence"
    try:
        async with asyncio.timeout(seconds):
            while True:
                writer.write(frame(m.encode(m.Heartbeat())))
                try:
                    async with asyncio.timeout(0.2):  # the heartbeat interval
                        msg = m.decode_master_to_peer(await read_frame(reader))
                except TimeoutError:
                    continue
                if isinstance(msg, (m.Kicked, m.Rejected, m.Welcome)):
                    last = type(msg).__name__ + (f"({msg.peer_id})" if isinstance(
                        msg, m.Welcome) else "")
                if isinstance(msg, (m.Kicked, m.Rejected)):
                    break  # the master's last word
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
    return last


async def _member(addr: str, way: str) -> str:
    """Join as a real communicator, sync, then misbehave in the all-reduce the honest
    workers make next (``state_worker.py``: a MIN vote of one int64 at tag 1)."""
    async with pccl.Communicator(addr, heartbeat_interval=0.2, heartbeat_timeout=2.0,
                                 data_timeout=3.0) as comm:
        await comm.connect()
        state = pccl.SharedState({"w": np.zeros(ELEMS, np.float32),
                                  "m": np.zeros(ELEMS, np.float32),
                                  "step": np.zeros(1, np.int64)})
        await comm.sync_shared_state(state)
        if way == "silent":  # votes, but never opens a link to its successor: sends nothing
            async def never(peer_id: int) -> None:
                await asyncio.Event().wait()
            testing.data_plane(comm).link = never
        x = np.zeros(2 if way == "count" else 1, np.int64)
        try:
            await comm.all_reduce(x, op=pccl.ReduceOp.MIN, tag=1, timeout=20)
        except pccl.PcclError as exc:
            return type(exc).__name__
        return "completed"


async def main(way: str, addr: str) -> str:
    host, port = addr.rsplit(":", 1)
    key = auth.secret_key(pccl.load_secret())
    if way == "term":
        return await _session(host, int(port), key, m.Hello(m.PROTOCOL_VERSION, 0, 1,
                                                            term=2**63 - 1), 3.0)
    if way == "overflow":
        rejoin = m.Rejoin(2**63 - 1, True, 1, 1, [2**64 - 1], 0, -1)
        return await _session(host, int(port), key, m.Hello(m.PROTOCOL_VERSION, 0, 1,
                                                            rejoin=rejoin), 3.0)
    if way == "claim":
        outcomes = []
        for victim in range(1, 9):
            rejoin = m.Rejoin(victim, True, 10**6, 10**6, [victim], 0, -1)
            outcomes.append(await _session(host, int(port), key, m.Hello(
                m.PROTOCOL_VERSION, 0, 1, term=10**6, rejoin=rejoin), 0.3))
        return ",".join(outcomes)
    if way == "mute":
        return await _session(host, int(port), key, m.Hello(m.PROTOCOL_VERSION, 0, 1), 20.0)
    if way == "guess":
        refused = 0
        for _ in range(200):
            try:
                _, w = await _raw(host, int(port), secrets.token_bytes(auth.KEY_SIZE))
                w.close()
            except (HandshakeError, ConnectionError):
                refused += 1
        return f"refused {refused}/200"
    return await _member(addr, way)


if __name__ == "__main__":
    way = sys.argv[1]
    try:
        outcome = pccl.run(main(way, sys.argv[2]))
    except Exception as exc:  # (reported, not hidden)
        outcome = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps({"event": "insider", "way": way, "outcome": outcome}), flush=True)
