"""The README's first command works: the demo passes its own checks and shows what it claims.

Its output must show every peer's progress by peer id, a ``PeerLostError`` on every survivor of
the peer killed mid-all-reduce, and the verdict as the last line; with the numpy kernels, a
warning (and how to fix it) is the first line on stderr."""

from __future__ import annotations

import asyncio
import os
import re
import sys

from pccl_aio._compute import front
from tests.process.procs import HERE

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
                                         r"middle of the all-reduce", text, re.M)}
    assert len(first) == peers and len(newcomer) == 1 and len(killed) == 1, text[-3000:]
    assert killed <= first
    stepped: set[int] = set()
    for ids in re.findall(r"^step +\d+ +world \d+ +peers ([\d, ]+?) +ok ", text, re.M):
        stepped |= {int(p) for p in ids.split(",")}
    assert stepped == first | newcomer, (stepped, first, newcomer)
    lost = {int(p) for p in re.findall(r"^peer (\d+): step \d+ raised PeerLostError: ", text,
                                       re.M)}
    assert lost == first - killed, (lost, first, killed)
    assert re.search(r"^peer \d+: received [\d.]+ MiB of shared state", text, re.M)


async def test_demo_passes_and_shows_the_lost_peer_on_every_survivor():
    code, out, err = await _demo("--steps", "24", "--count", "65536", "--status-port", "0")
    assert code == 0, out[-3000:] + err[-3000:]
    _check_story(out, 4)
    assert re.search(r"^status page: http://127\.0\.0\.1:\d+/ ", out, re.M), out[:2000]
    # the master's view, before the verdict: 5 joins, the victim dead (its connection
    # closed), its all-reduce aborted, the newcomer's fetch
    saw = re.search(r"^master saw: 5 peers joined, departures: (.*); (\d+) collectives "
                    r"completed, aborted: (.*); (\d+) syncs, ([\d.]+) MiB fetched$", out, re.M)
    assert saw, out[-3000:]
    assert re.search(r"\b1 (closed|heartbeat)\b", saw.group(1)), saw.group(0)
    assert re.fullmatch(r"\d+ peer_(failed|left)(, \d+ peer_(failed|left))?", saw.group(3)), \
        saw.group(0)
    assert int(saw.group(2)) >= 24 and int(saw.group(4)) > 0 and float(saw.group(5)) > 0
    if front.IMPLEMENTATION == "cython":  # no warning when the compiled kernels run
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
