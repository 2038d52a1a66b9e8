"""Issue 46, by name: ``dist.init_process_group("pccl_aio")`` in real processes. Under
torchrun (``env://``) a plain DDP script (``examples/torchrun_ddp.py``) trains with rank 0
hosting the master (the run secret from ``$PCCL_AIO_SECRET``) and ends with one parameter
digest on every rank; with ``file://`` init, explicit ranks and a master named by
``$PCCL_AIO_MASTER``, ranks admitted in reverse order (torch rank 0 last in the ring) give
gloo's bytes for every collective with a root or a block order, and for send/recv,
batch_isend_irecv, a receive from any rank, all_to_all(_single) with equal and unequal splits
and reduce to each root (eight dtypes, four ops), and in subgroups (``new_group``,
``new_subgroups``) for collectives and send/recv; a ``torch.distributed.checkpoint`` save and
load and a ``torch.compile``d functional all-reduce on the group load and compute the same."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from typing import Any

import pytest

from tests.helpers import SECRET
from tests.process.procs import HERE, MASTER, Proc, spawn

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(90)

PEER = str(HERE / "torch_byname_peer.py")
EXAMPLE = str(HERE.parent.parent / "examples" / "torchrun_ddp.py")
WORLD = 3
ENV = {"OMP_NUM_THREADS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_torchrun_trains_a_plain_ddp_script_by_name(procs):
    p = await spawn("torchrun", "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
                    "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                    EXAMPLE, "--steps", "20", env={**ENV, "PCCL_AIO_SECRET": SECRET})
    procs.append(p)
    out, err = await asyncio.wait_for(p.proc.communicate(), 60)
    assert p.proc.returncode == 0 or _exit_abort(err.decode()), err.decode()[-3000:]
    # (the ranks share torchrun's stdout: a line's text and its newline are two writes)
    found = re.findall(r"rank (\d) of (\d): step 20 loss [\d.]+ parameters ([0-9a-f]{16})",
                       out.decode())
    assert sorted(int(r) for r, _, _ in found) == list(range(WORLD)), out
    assert {(w, d) for _, w, d in found} == {(str(WORLD), found[0][2])}, out


def _exit_abort(err: str) -> bool:
    """torch 2.13's own teardown under torchrun: a rank that printed its line and ended its
    group aborts at interpreter exit ("terminate called without an active exception", no
    Python frame; the same script on gloo, without pccl_aio imported, did so in 1 of 10 runs
    here); torchrun then reports SIGABRT for such ranks, SIGTERM for the ones it stopped
    after that, and no rank raised (a raise is printed ``[rankN]: Traceback``)."""
    codes = re.findall(r"exitcode  : (-?\d+)", err)
    return ("terminate called without an active exception" in err and "-6" in codes
            and set(codes) <= {"-6", "-15"} and "[rank" not in err)


async def _logged(p: Proc, text: str, kept: list[str]) -> asyncio.Task[None]:
    """Read ``p``'s stderr until a line holding ``text``; returns the task that reads the
    rest into ``kept`` (so that the pipe never fills), ending when ``p`` exits."""
    assert p.proc.stderr is not None
    while True:
        raw = await asyncio.wait_for(p.proc.stderr.readline(), 60)
        assert raw, f"{p.name} exited: {''.join(kept)[-3000:]}"
        kept.append(raw.decode())
        if text in kept[-1]:
            break

    async def drain() -> None:
        assert p.proc.stderr is not None
        while raw := await p.proc.stderr.readline():
            kept.append(raw.decode())

    return asyncio.get_running_loop().create_task(drain())


async def _start(procs: list, backend: str, path: str, env: dict[str, str],
                 order: list[int] | None = None) -> Run:
    """Start the ranks; with ``order``, each waits, imported, until the one before it in
    ``order`` logged its connection to the master."""
    run = Run(backend)
    for r in range(WORLD):
        p = await spawn(f"{backend}{r}", PEER, backend, path, str(WORLD), str(r),
                        *(["--go"] if order else []), env=env, stdin=bool(order))
        procs.append(p)
        run.ps[r] = p
    for r in order or []:
        p = run.ps[r]
        assert await p.line(timeout=60) == "ready"
        assert p.proc.stdin is not None
        p.proc.stdin.write(b"go\n")
        run.logs[r] = []
        run.drains.append(await _logged(p, "connected to the master", run.logs[r]))
    return run


class Run:
    """The processes of one run, by rank, and what their stderr said."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.ps: dict[int, Proc] = {}
        self.logs: dict[int, list[str]] = {}  # rank -> its stderr (read with ``order``)
        self.drains: list[asyncio.Task[None]] = []

    async def results(self) -> list[dict[str, Any]]:
        """Each rank's JSON line, in rank order; on pccl_aio every rank exits 0 (gloo's exit
        codes are its teardown's, as in ``test_torch_backend.py``)."""
        out = []
        for r in range(WORLD):
            try:
                out.append(json.loads(await self.ps[r].line(timeout=60)))
            except AssertionError as exc:  # (with what its stderr said)
                raise AssertionError(f"{exc}{''.join(self.logs.get(r, []))[-3000:]}") from exc
        codes = await asyncio.wait_for(
            asyncio.gather(*(p.proc.wait() for p in self.ps.values())), 30)
        await asyncio.wait_for(asyncio.gather(*self.drains), 10)
        if self.backend == "pccl_aio":
            assert list(codes) == [0] * WORLD, self.logs
        return out


async def test_file_init_ranks_admitted_in_reverse_give_gloos_bytes(procs, tmp_path):
    master = await spawn("master", MASTER, "10.0")  # (2 s: a rank was lost under load once)
    procs.append(master)
    port = int(await master.line())
    gloo = await _start(procs, "gloo", str(tmp_path / "gloo"), ENV)
    env = {**ENV, "PCCL_AIO_MASTER": f"127.0.0.1:{port}", "PCCL_AIO_LOG_LEVEL": "INFO"}
    ours = await (await _start(procs, "pccl_aio", str(tmp_path / "ours"), env,
                               order=[2, 1, 0])).results()
    theirs = await gloo.results()
    assert [r["rank"] for r in ours] == list(range(WORLD))
    assert [r["ring"] for r in ours] == [2, 1, 0]  # torch's ranks are not the ring's
    for mine, ref in zip(ours, theirs):
        for key in mine:
            if key not in ("backend", "ring", "ddp"):
                assert mine[key] == ref[key], (key, mine, ref)
    assert len({r["ddp"] for r in ours}) == 1  # every replica's parameters, bit-identical
