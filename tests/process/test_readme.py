"""The README's code runs: every Python block as a real process against a master started here.

The "Use" example, a peer program, runs with 2 and 3 peers started at the same moment and one
after another (each next peer starts once the previous one is in the run), 6 times each: no
run may hang (every process has a deadline), every peer must take part in all-reduces, and all
peers must stop at the same step with the same weights. The PyTorch block runs through a
SIGKILL and a joiner (every finisher prints the same digest), and alone it must sleep: little
CPU, nothing but heartbeats to the master. Markers above the blocks are described in
``tests/process/readme_blocks.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trustme

import pccl_aio as pccl
from pccl_aio._master.core import state as ms
from tests.helpers import SECRET
from tests.process.procs import Proc, spawn
from tests.process.readme_blocks import Block, blocks, python_blocks

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = python_blocks()
RUNNABLE = [b for b in BLOCKS if not b.not_run]
USE = next(b for b in BLOCKS if b.section == "Use")
TORCH = next(b for b in BLOCKS if b.section == "Train a PyTorch model")
DEADLINE = 60.0  # seconds any one process may take
# A peer alone gives up after PATIENCE s (never reached when the runs go well); the PyTorch
# block computes at full speed (PACE: its stand-in for a model's compute time).
ENV = {"PATIENCE": "20", "PACE": "0", "OMP_NUM_THREADS": "1"}
DONE = re.compile(r"peer (\d+): done at step (\d+), digest ([0-9a-f]{16})")
FINAL = re.compile(r"^peer (\d+): (\d+) all-reduces, stopped at step (\d+), checksum (\S+)$",
                   re.M)


class Peers:
    """The processes of one run, each running one README block; all killed at the end."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path, self.env = path, env
        self.procs: list[asyncio.subprocess.Process] = []
        self.deadline = time.monotonic() + DEADLINE

    async def start(self) -> asyncio.subprocess.Process:
        path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(self.path), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **self.env})
        self.procs.append(proc)
        return proc

    def left(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    async def first_line(self, proc: asyncio.subprocess.Process) -> str:
        assert proc.stdout is not None
        return (await asyncio.wait_for(proc.stdout.readline(), self.left())).decode()

    async def finish(self) -> list[tuple[int, str, str]]:
        """(exit status, stdout, stderr) of every process, in start order."""
        results = await asyncio.wait_for(
            asyncio.gather(*(p.communicate() for p in self.procs)), self.left())
        return [(p.returncode or 0, out.decode(), err.decode())
                for p, (out, err) in zip(self.procs, results)]

    def kill(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()


def _secured(tmp: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """For a block whose marker asks for "a run secret and TLS": the master's options and
    the peers' environment (a secret file, and TLS_DIR with a certificate of a fresh CA)."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp / "peer.pem"))
    cert.private_key_pem.write_to_path(str(tmp / "peer.key"))
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    (tmp / "run.secret").write_text(SECRET + "\n")
    server = pccl.tls_contexts(str(tmp / "peer.pem"), str(tmp / "peer.key"), str(tmp / "ca.pem"))[0]
    env = {"PCCL_AIO_SECRET_FILE": str(tmp / "run.secret"), "TLS_DIR": str(tmp)}
    return {"secret": SECRET, "ssl": server}, env


async def _run(block: Block, tmp: Path, peers: int, staggered: bool, steps: int = 30,
               head: list[str] | None = None) -> list[tuple[int, str, str]]:
    """Run ``block`` as ``peers`` processes against a fresh master (``STEPS=steps``)."""
    path = tmp / f"readme_line_{block.line}.py"
    path.write_text(block.code)
    options, env = _secured(tmp) if "run secret and TLS" in block.note else ({}, {})
    async with pccl.Master("127.0.0.1", 0, **options) as master:
        run = Peers(path, {**ENV, **env, "STEPS": str(steps), "MASTER": master.address})
        try:
            for _ in range(peers):
                proc = await run.start()
                if staggered:  # the next one starts once this one is in the run
                    line = await run.first_line(proc)
                    if head is not None:
                        head.append(line)
            results = await run.finish()
        finally:
            run.kill()
            await asyncio.gather(*(p.wait() for p in run.procs))
    return results


def _check_use_run(results: list[tuple[int, str, str]], steps: int, joiner: bool) -> None:
    """Every peer exited 0 after all-reduces, all at the same step with the same weights;
    ``joiner``: the last peer joined a group that was already reducing."""
    report = "\n".join(f"--- peer process {i}: status {code}\n{out}{err[-2000:]}"
                       for i, (code, out, err) in enumerate(results))
    finals = [FINAL.findall(out) for _, out, _ in results]
    assert all(code == 0 for code, _, _ in results), report
    assert all(len(f) == 1 for f in finals), report
    counts = [int(f[0][1]) for f in finals]
    assert {int(f[0][2]) for f in finals} == {steps}, report  # all stopped at the same step
    assert len({f[0][3] for f in finals}) == 1, report  # with the same weights
    assert min(counts) >= 1, report  # everyone took part
    assert sorted(counts)[-2:] == [steps, steps], report  # the first two did every step
    if joiner:
        assert counts[-1] < steps, report


def test_the_readme_blocks_are_found_and_marked():
    assert RUNNABLE and USE in RUNNABLE, BLOCKS
    assert USE.peers >= 2
    # sketches that need a launcher's environment (torchrun twice, a Ray cluster); no others
    assert len(BLOCKS) - len(RUNNABLE) <= 4, [(b.path, b.line) for b in BLOCKS if b.not_run]
    for b in BLOCKS:  # even a sketch that is not run must at least compile
        compile(b.code, f"{b.path}:{b.line}", "exec")


def test_the_block_parser_reads_fences_sections_and_markers():
    text = ("# T\n\n## Use\n\n<!-- run: 3 peers with a master -->\n```python\nx = 1\n```\n"
            "text\n<!-- not run: a sketch -->\n```python\n...\n```\n\n"
            "- item\n\n  ```bash\n  echo hi\n  ```\n")
    got = blocks(text)
    assert [(b.lang, b.line, b.section, b.peers, b.not_run) for b in got] == [
        ("python", 6, "Use", 3, ""), ("python", 11, "Use", 1, "a sketch"),
        ("bash", 17, "Use", 1, "")]
    assert got[0].code == "x = 1\n" and got[2].code == "echo hi\n"
    with pytest.raises(ValueError, match="never closed"):
        blocks("```python\nx = 1\n")
    with pytest.raises(ValueError, match="unknown marker"):
        blocks("<!-- not-run -->\n```python\nx = 1\n```\n")[0].check_note()


@pytest.mark.parametrize("block", RUNNABLE,
                         ids=[f"{b.path.removesuffix('.md')}:{b.line}" for b in RUNNABLE])
async def test_each_python_block_runs(block: Block, tmp_path: Path):
    results = await _run(block, tmp_path, block.peers, staggered=False)
    for code, out, err in results:
        assert code == 0 and "Traceback" not in err, f"status {code}\n{out}\n{err[-3000:]}"
    if block is USE:
        _check_use_run(results, 30, joiner=False)
    if "status.json" in block.code:  # Logs, metrics and status: the master saw the run
        (_, out, _), = results
        assert re.search(r"^2 peers, ring \[\d+, \d+\], 1 all-reduce completed$", out, re.M), out
    if block.section == "Collectives":  # every rank saw the others' rows in rank order
        said = sorted(re.findall(r"^rank (\d) of 3: weights (.*), rows (.*), shard (.*)$",
                                 "".join(out for _, out, _ in results), re.M))
        assert [r for r, *_ in said] == ["0", "1", "2"], results
        rows = "[[0, 0], [1, 10], [2, 20]]"
        for rank, weights, got, shard in said:
            assert (weights, got) == ("[0.0, 0.0, 0.0, 0.0]", rows), said
            assert shard == str([3.0 * 2 * int(rank), 3.0 * (2 * int(rank) + 1)]), said
    if block.section.startswith("Compressed averaging"):  # the same mean on both peers
        said = [re.findall(r"^step (\d): sent (\d+) B \(216x fewer\), mean checksum (\d+)$",
                           out, re.M) for _, out, _ in results]
        assert len(said[0]) == 3 and [[(s, c) for s, _, c in x] for x in said] == [
            [(s, c) for s, _, c in said[0]]] * 2, results
    if block.section == "Use with torch.distributed":  # both replicas, the same weights
        said = re.findall(r"^rank (\d) of 2: (step \d+, weights \S+)$",
                          "".join(out for _, out, _ in results), re.M)
        assert sorted(r for r, _ in said) == ["0", "1"], results
        assert said[0][1] == said[1][1], said
    if "run secret and TLS" in block.note:  # the Security example: both peers reduced
        sums = [re.findall(r": sum (\S+) over 2 peers, all TLS", out) for _, out, _ in results]
        assert len(sums) == 2 and sums[0] == sums[1] and len(sums[0]) == 1, results


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("staggered", [False, True], ids=["together", "staggered"])
@pytest.mark.parametrize("peers", [2, 3])
async def test_the_use_example_always_reduces(peers: int, staggered: bool, tmp_path: Path):
    """Staggered, the first peer waits alone, the second joins it; a third joins the two while
    they reduce, so that run is longer: it must still be going when the third can be
    admitted, which is at least the master's ``admission_interval`` (1 s) after the second's
    batch, and after the third's first heartbeat (0.5 s after its ``Welcome``). At 200 steps
    (~6 ms each here) the two sometimes finished first: the third was admitted at step
    187-198, or after the end."""
    joiner = staggered and peers == 3
    steps = 600 if joiner else 30
    for _ in range(4):  # (a race would show in some runs; 4 x 4 cases keep CI within bounds)
        head: list[str] = []
        results = await _run(USE, tmp_path, peers, staggered, steps, head)
        _check_use_run(results, steps, joiner)
        assert all(line.endswith(" joined\n") for line in head), head


async def _torch_done(p: Proc) -> tuple[int, str, list[str]]:
    """(step, digest, lines) of a PyTorch-block peer that finished; fails otherwise."""
    lines: list[str] = []
    while True:
        lines.append(await p.line(timeout=90))
        if m := DONE.fullmatch(lines[-1]):
            assert await p.proc.wait() == 0, lines
            return int(m.group(2)), m.group(3), lines


async def _torch_line(p: Proc, pattern: str, timeout: float = 60) -> str:
    """The first line of ``p`` matching ``pattern``."""
    while not re.search(pattern, line := await p.line(timeout)):
        pass
    return line


@pytest.mark.timeout(150)
async def test_the_torch_block_through_a_sigkill_and_a_joiner(tmp_path: Path, procs: list[Proc]):
    """Two peers train; once they reduce together, a third joins and the second is SIGKILLed
    mid-run: the finishers end at the run's last step with one digest (a peer that had run
    on its own would hold other bytes: its samples differ), and each said what happened."""
    path = tmp_path / "torch_block.py"
    path.write_text(TORCH.code)
    async with pccl.Master("127.0.0.1", 0) as master:
        env = {**ENV, "MASTER": master.address, "STEPS": "1500"}

        async def start(name: str) -> Proc:
            procs.append(p := await spawn(name, str(path), env=env))
            return p

        a = await start("a")
        assert re.fullmatch(r"peer \d+: joined the run; its first sync brings the run's step",
                            await a.line())
        await _torch_line(a, r": alone, waiting up to 20 s for another peer$")
        b = await start("b")
        await _torch_line(a, r": a group of 2 at step 0$")
        await _torch_line(b, r": step 50, loss ")
        c = await start("c")
        await _torch_line(a, r": a group of 3 at step \d+$")
        b.signal(signal.SIGKILL)
        await _torch_line(a, r": a group of 2 at step \d+$")
        (sa, da, _), (sc, dc, lc) = await asyncio.gather(_torch_done(a), _torch_done(c))
        assert await b.proc.wait() == -signal.SIGKILL
    assert sa == sc == 1500 and da == dc, (sa, sc, da, dc)
    assert re.fullmatch(r"peer \d+: joined the run; its first sync brings the run's step",
                        lc[0]), lc
    resumed = re.fullmatch(r"peer \d+: a group of 3 at step (\d+)", lc[1])  # after its sync
    assert resumed and int(resumed[1]) >= 50, lc  # the run's step (b had reached 50)
    assert any(re.search(r": step 1500, loss ", line) for line in lc), lc


@pytest.mark.timeout(60)
async def test_a_lone_torch_peer_sleeps(tmp_path: Path, procs: list[Proc]):
    """Alone, the PyTorch block waits in ``wait_for_peers``: over 10 s it uses under 5 % of a
    core and the master receives under 10 messages a second from it (its heartbeats)."""
    path = tmp_path / "torch_block.py"
    path.write_text(TORCH.code)
    async with pccl.Master("127.0.0.1", 0) as master:
        received: dict[int, int] = {}
        handle = master.state.handle

        def counting(event: ms.Event) -> list[ms.Action]:
            if isinstance(event, ms.Received):
                received[event.conn] = received.get(event.conn, 0) + 1
            return handle(event)

        master.state.handle = counting  # type: ignore[method-assign]
        p = await spawn("alone", str(path), env={**ENV, "MASTER": master.address,
                                                  "PATIENCE": "300"})
        procs.append(p)
        await _torch_line(p, r": alone, waiting up to 300 s for another peer$")
        ticks = os.sysconf("SC_CLK_TCK")

        def cpu() -> float:
            fields = Path(f"/proc/{p.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime

        before, t0, heard = cpu(), time.monotonic(), dict(received)
        await asyncio.wait([asyncio.ensure_future(p.proc.wait())], timeout=10)
        assert p.proc.returncode is None, "the lone peer exited"
        seconds = time.monotonic() - t0
        used = (cpu() - before) / seconds
        (conn,) = received
        rate = (received[conn] - heard.get(conn, 0)) / seconds
    assert used < 0.05, f"{used:.1%} of a core while waiting alone"
    assert rate < 10, f"{rate:.1f} messages/s to the master while waiting alone"


async def _use_line(p: Proc, pattern: str, lines: list[str], timeout: float = 60) -> str:
    """The first line of a Use-block peer matching ``pattern`` (every line read is kept)."""
    while True:
        lines.append(await p.line(timeout))
        if re.search(pattern, lines[-1]):
            return lines[-1]


@pytest.mark.timeout(150)
async def test_the_use_example_rides_out_a_master_restart_and_a_frozen_peer(
        tmp_path: Path, procs: list[Proc]):
    """The README loop, verbatim, on three peers: once they reduce, the master (a process of
    its own) is SIGKILLed and restarted on its port; later one peer is SIGSTOPped for 7 s,
    past every heartbeat timeout, and resumed. Every peer exits 0 at the run's last step with
    the same weights (before, all three died with MasterLostError from sync_shared_state)."""
    path = tmp_path / "use_block.py"
    path.write_text(USE.code)
    master = await spawn("master", str(ROOT / "tests/process/masterproc.py"), "2.0", "0")
    procs.append(master)
    port = await master.line()
    env = {**ENV, "MASTER": f"127.0.0.1:{port}", "STEPS": "700"}
    peers = []
    for name in "abc":
        procs.append(p := await spawn(name, str(path), env=env))
        peers.append(p)
    lines: dict[str, list[str]] = {p.name: [] for p in peers}
    a, _, c = peers
    await _use_line(a, r": step 100, 3 peers$", lines["a"])
    master.signal(signal.SIGKILL)
    await master.proc.wait()
    procs.append(master := await spawn("master2", str(ROOT / "tests/process/masterproc.py"),
                                       "2.0", port))
    assert await master.line() == port
    await _use_line(a, r": step 200, ", lines["a"])
    c.signal(signal.SIGSTOP)
    await _use_line(a, r": step 300, 2 peers$", lines["a"])  # the others went on without it
    c.signal(signal.SIGCONT)
    finals = []
    for p in peers:
        final = await _use_line(p, r" all-reduces, stopped at step ", lines[p.name], 90)
        assert await p.proc.wait() == 0, (p.name, lines[p.name])
        finals.append(FINAL.fullmatch(final))
    assert all(finals), lines
    assert {int(f.group(3)) for f in finals} == {700}, lines  # all at the run's last step
    assert len({f.group(4) for f in finals}) == 1, lines  # with the same weights
