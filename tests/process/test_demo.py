"""The README's first command works: the demo passes its own checks and shows what it claims.

Its output must show every peer's progress by peer id, a ``PeerLostError`` on every survivor of
the peer killed mid-all-reduce, and the verdict as the last line; with the numpy kernels, a
warning (and how to fix it) is the first line on stderr."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys

from pccl_aio._compute import ops as _ops
from tests.process.procs import HERE
from tests.process.test_observability import http_get

WARNING = "WARNING: pccl_aio is running its slow numpy reference kernels"


async def _demo(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    full = {**os.environ, "PYTHONPATH": str(HERE.parent.parent), **(env or {})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.demo", *args, "--timeout", "90",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=full)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 110)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _check_story(text: str, peers: int) -> None:
    """Every peer's id in the progress, PeerLostError on each survivor, the verdict last."""
    lines = text.strip().splitlines()
    verdict = lines[-1]
    assert verdict.startswith("VERDICT: PASS"), text[-3000:]
    world = f"{peers}->{peers - 1}->{peers},"
    assert world in verdict and "identical on every peer" in verdict, verdict
    first = {int(p) for p in re.findall(r"^peer (\d+) joined", text, re.M)}
    newcomer = {int(p) for p in re.findall(r"^--- newcomer joined as peer (\d+)", text, re.M)}
    killed = {int(p) for p in re.findall(r"^--- peer (\d+) \(pid \d+\) SIGKILLs itself in the "
                                         r"middle of the all-reduce of step \d+ \(tag \d+\)$",
                                         text, re.M)}
    assert len(first) == peers and len(newcomer) == 1 and len(killed) == 1, text[-3000:]
    assert killed <= first
    stepped: set[int] = set()
    for ids in re.findall(r"^step +\d+ +world \d+ +peers ([\d, ]+?) +ok ", text, re.M):
        stepped |= {int(p) for p in ids.split(",")}
    assert stepped == first | newcomer, (stepped, first, newcomer)
    lost = {int(p) for p in re.findall(r"^peer (\d+): step \d+ \([^)]+\) raised PeerLostError: ",
                                       text, re.M)}
    assert lost == first - killed, (lost, first, killed)
    # a step number and a tag number on one line: the tag is labelled as what it is
    for line in re.findall(r"^.*\bstep \d+\b.*\btag \d+.*$", text, re.M):
        step = re.search(r"\bstep (\d+)", line)
        tags = {int(t) for t in re.findall(r"\btag (\d+)", line)}
        assert step and tags, line
        if tags != {int(step.group(1))}:
            assert re.search(r"\bstep \d+ \((its all-reduce, tag \d+|the stop vote, all-reduce "
                             r"tag 1|tag \d+)\)", line), line
    assert re.search(r"^peer \d+: received [\d.]+ MiB of shared state", text, re.M)


async def test_demo_passes_and_shows_the_lost_peer_on_every_survivor():
    code, out, err = await _demo("--steps", "24", "--count", "65536", "--status-port", "0")
    assert code == 0, out[-3000:] + err[-3000:]
    _check_story(out, 4)
    assert re.search(r"^status page: http://127\.0\.0\.1:\d+/ ", out, re.M), out[:2000]
    # the master's view, before the verdict: 5 joins, the victim killed (its connection
    # dropped), its all-reduce aborted, the newcomer's fetch
    saw = re.search(r"^master saw: 5 peers joined, departures: (.*); (\d+) collectives "
                    r"completed, aborted: (.*); (\d+) syncs, ([\d.]+) MiB fetched$", out, re.M)
    assert saw, out[-3000:]
    assert re.search(r"\b1 killed \((connection dropped|no heartbeat)\)", saw.group(1)), \
        saw.group(0)
    assert not re.search(r"\b(closed|heartbeat)\b", saw.group(1)), saw.group(0)
    assert re.fullmatch(r"\d+ peer_(failed|left)(, \d+ peer_(failed|left))?", saw.group(3)), \
        saw.group(0)
    assert int(saw.group(2)) >= 24 and int(saw.group(4)) > 0 and float(saw.group(5)) > 0
    if _ops.IMPLEMENTATION == "cython":  # no warning when the compiled kernels run
        assert WARNING not in err, err[:2000]
    else:
        assert err.startswith(WARNING), err[:2000]


async def test_demo_warns_first_on_stderr_when_the_numpy_kernels_run():
    code, out, err = await _demo("--peers", "3", "--steps", "9", "--count", "16400",
                                 env={"PCCL_AIO_NO_EXTENSIONS": "1"})
    first = err.splitlines()[0] if err else ""
    assert first.startswith(WARNING), err[:2000]
    assert "PCCL_AIO_NO_EXTENSIONS is set" in err.splitlines()[1], err[:2000]
    assert code == 0, out[-3000:] + err[-3000:]
    _check_story(out, 3)


class _Lines:
    """A stream's lines as they come, and a wait for the first that matches."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.lines: list[str] = []
        self._stream, self._new = stream, asyncio.Event()
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for raw in self._stream:
            self.lines.append(raw.decode())
            self._new.set()
        self._new.set()

    async def until(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        seen = 0
        async with asyncio.timeout(timeout):
            while True:
                for line in self.lines[seen:]:
                    if m := re.search(pattern, line):
                        return m
                seen = len(self.lines)
                assert not self.task.done(), "".join(self.lines)[-3000:]
                self._new.clear()
                await self._new.wait()


async def _held_demo(*args: str) -> tuple[asyncio.subprocess.Process, _Lines, _Lines]:
    full = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pccl_aio.demo", "--status-port", "0", "--hold", "600", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=full)
    assert proc.stdout is not None and proc.stderr is not None
    return proc, _Lines(proc.stdout), _Lines(proc.stderr)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Kill the demo if it still runs (a test's ``finally``)."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def _interrupt(proc: asyncio.subprocess.Process, out: _Lines, err: _Lines) -> int:
    """Ctrl-C the demo; its exit status once both pipes were read (killed after 30 s)."""
    proc.send_signal(signal.SIGINT)
    try:
        code = await asyncio.wait_for(proc.wait(), 30)
    finally:
        await _reap(proc)
    await asyncio.gather(out.task, err.task)
    return code


async def test_hold_keeps_the_status_page_up_before_the_run_and_after_the_verdict():
    proc, out, err = await _held_demo("--steps", "12", "--count", "65536", "--timeout", "90")
    try:
        page = (await out.until(r"^status page: (http://\S+) "))[1]
        await out.until(r"^holding 600 s before starting the peers: .*press Enter")
        assert not any("joined" in line for line in out.lines)  # nobody started yet
        assert "<html" in (await http_get(page)).lower()
        assert proc.stdin is not None
        proc.stdin.write(b"\n")  # Enter: start now
        await out.until(r"^VERDICT: PASS")
        await err.until(r"the status page stays up for 600 s \(Ctrl-C ends the demo now\)")
        status = json.loads(await http_get(page + "status.json"))  # the run's end, still served
        assert status["counts"]["joins"] == 5, status["counts"]
        code = await _interrupt(proc, out, err)
    finally:
        await _reap(proc)
    assert code == 0, "".join(err.lines)[-3000:]
    assert out.lines[-1].startswith("VERDICT: PASS"), out.lines[-3:]
    assert "Traceback" not in "".join(err.lines), "".join(err.lines)[-3000:]


async def test_ctrl_c_during_the_hold_before_the_run_ends_the_demo_cleanly():
    proc, out, err = await _held_demo()
    try:
        await out.until(r"^holding 600 s before starting the peers")
        code = await _interrupt(proc, out, err)
    finally:
        await _reap(proc)
    assert code == 130, "".join(err.lines)[-3000:]
    assert "interrupted before the peers started" in "".join(err.lines)
    assert "Traceback" not in "".join(err.lines), "".join(err.lines)[-3000:]
    assert not any("joined" in line for line in out.lines), out.lines
