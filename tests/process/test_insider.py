"""Issue 31 with real processes: a member holding the run secret, running modified code,
against three honest ``state_worker.py ddp`` peers and a master process. Each scenario ends
with the insider refused or kicked, every honest peer finishing, and one state hash per
revision (``ddp_run.Run.check``)."""

from __future__ import annotations

import asyncio
import signal
import stat
import time
from collections.abc import Awaitable
from typing import Any

import pytest

from pccl_aio._net.stream import read_frame
from pccl_aio._wire import messages as m
from pccl_aio._wire.framing import frame
from tests.helpers import SECRET, raw_master
from tests.process.ddp_run import STEP, Event, Run
from tests.process.procs import Proc, probe
from tests.process.procs import start_master as procs_start_master
from tests.process.test_security_cli import cli_master

MASTER_SECRET = "Xb8-Lw2Qe5Rt7Yu0Ip3As6Df9Gh1Jk4Zx7Cv0Bn3Mq"
pytestmark = pytest.mark.timeout(150)


def start_master(procs: list[Proc], port: int = 0, name: str = "master"
                 ) -> Awaitable[tuple[Proc, int]]:
    return procs_start_master(procs, port, name, {"PCCL_AIO_SECRET": SECRET,
                                                  "MASTER_SECRET": MASTER_SECRET})


async def claim(port: int, run_id: str, victim: int, term: int) -> int:
    """The insider's rejoin at a restarted master, before anyone else: it claims to be
    ``victim``, the only member of a ring at a higher term. Returns the id it was given."""
    reader, writer = await raw_master(port, SECRET)
    try:
        rejoin = m.Rejoin(victim, True, term + 5, 1000, [victim], 0, -1)
        writer.write(frame(m.encode(m.Hello(m.PROTOCOL_VERSION, 0, 1, run_id=run_id,
                                            term=term + 5, rejoin=rejoin))))
        welcome = m.decode_master_to_peer(await asyncio.wait_for(read_frame(reader), 10))
        assert isinstance(welcome, m.Welcome), welcome
        return welcome.peer_id
    finally:
        writer.close()


async def test_a_member_cannot_claim_anothers_id_at_a_restarted_master(procs):
    """Point 4: the master is SIGKILLed, the honest peers are SIGSTOPped, and the insider is
    the first to reach the restarted master, claiming a live member's id and a ring of its own
    at a higher term. With a master secret its claim has no seal: it gets a fresh id as a new
    peer, and the honest peers, resumed, rebuild the run under their own ids. (Without seals
    the restarted master rebuilt the run around the insider alone.)"""
    master, port = await start_master(procs)
    run = Run(procs, f"127.0.0.1:{port}", env={**STEP, "PCCL_AIO_SECRET": SECRET})
    for i in range(3):
        await run.add(f"p{i}")
    state: dict[str, Any] = {}

    async def events(ev: Event) -> None:
        if ev["revision"] >= 10 and not run.event_t:
            before = await probe(port, SECRET)
            run.mark()
            master.signal(signal.SIGKILL)
            for p in run.peers.values():
                p.signal(signal.SIGSTOP)
            await master.proc.wait()
            await start_master(procs, port, "master2")
            victim = run.ids["p1"]
            state["given"] = await claim(port, before.run_id, victim, before.term)
            state["victim"] = victim
            for p in run.peers.values():
                p.signal(signal.SIGCONT)
        elif run.event_t and ev["t"] > run.event_t and "after" not in state:
            state["after"] = await probe(port, SECRET)

    await run.drive(events)
    run.check()
    assert state["given"] != state["victim"]
    assert state["after"].members == 3
    for name, log in run.logs.items():  # every honest peer kept its id throughout
        assert {e["peer"] for e in log if e["event"] == "synced"} == {run.ids[name]}, name
    await run.close()


async def test_a_cli_master_with_a_run_secret_seals_memberships_by_default(procs, tmp_path):
    """Issue 45: ``python -m pccl_aio.master`` with a run secret and no master secret given
    keeps one of its own (made on the first start, mode 0600, in ``$PCCL_AIO_STATE_DIR``);
    SIGKILLed and started again the same way, it reads the same one. The insider, first at
    the restarted master, claims a live member's id: it gets another, the members keep
    theirs and train on within seconds of being resumed (without seals the insider took the
    id, and the members waited for vote_timeout, 600 s)."""
    state_dir = tmp_path / "state"
    env = {"PCCL_AIO_SECRET": SECRET, "PCCL_AIO_STATE_DIR": str(state_dir)}
    args = ("--heartbeat-timeout", "2", "--heartbeat-interval", "0.2")
    master, port = await cli_master(procs, *args, env=env)
    made = await master.wait(r"made the master secret in (\S+):")
    (kept,) = state_dir.iterdir()
    assert made.group(1) == str(kept) and stat.S_IMODE(kept.stat().st_mode) == 0o600
    secret = kept.read_text()
    run = Run(procs, f"127.0.0.1:{port}", env={**STEP, "PCCL_AIO_SECRET": SECRET})
    for i in range(3):
        await run.add(f"p{i}")
    state: dict[str, Any] = {}

    async def events(ev: Event) -> None:
        if ev["revision"] >= 10 and not run.event_t:
            before = await probe(port, SECRET)
            run.mark()
            master.proc.signal(signal.SIGKILL)
            for p in run.peers.values():
                p.signal(signal.SIGSTOP)
            await master.proc.proc.wait()
            master.close()
            state["master"], _ = await cli_master(procs, *args, env=env, port=port)
            await state["master"].wait(rf"read the master secret in {kept}:")
            victim = run.ids["p1"]
            given = await claim(port, before.run_id, victim, before.term)
            assert given != victim, "the insider took a member's id"
            for p in run.peers.values():
                p.signal(signal.SIGCONT)
            state["resumed"], state["synced"] = time.time(), 0
        elif "resumed" in state and "back" not in state and ev["t"] > state["resumed"]:
            # the first sync p0 tells of after SIGCONT may have ended before the master's
            # death (p0 stopped before telling it); the second began after SIGCONT
            state["synced"] += 1
            if state["synced"] == 2:
                assert ev["ws"] == 3, ev
                state["back"] = ev["t"] - state["resumed"]

    await run.drive(events)
    run.check()
    assert state["back"] < 15, state  # seconds, not vote_timeout
    print(f"p0 synced with all three {state['back']:.2f} s after SIGCONT")
    await state["master"].wait(rf"claimed to rejoin as peer {run.ids['p1']} of term \d+ "
                               "without a valid seal")
    for name, log in run.logs.items():  # every honest peer kept its id throughout
        assert {e["peer"] for e in log if e["event"] == "synced"} == {run.ids[name]}, name
    assert kept.read_text() == secret and len(list(state_dir.iterdir())) == 1
    await run.close()
    state["master"].close()
