"""Automatic connections over an emulated 100 ms RTT link: two network namespaces this test
creates, joined by the userspace forwarder ``wan_emulator.py`` (this kernel has no netem).
Needs root, ``ip`` and ``/dev/net/tun``.

Master and peer A run in one namespace, peer B in the other; each peer measures the RTT on its
link's first connection and opens ``AUTO_CAP`` connections (the bandwidth is assumed), where
loopback opens one (``tests/integration/test_connections.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pccl_aio._peer.data.core import bdp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
IP_A, IP_B = "10.209.0.1", "10.209.0.2"


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=10)


@pytest.fixture
def wan() -> Iterator[tuple[str, str]]:
    """Two fresh namespaces joined by a 50 ms one-way, 1 Gbit/s emulated link."""
    assert os.geteuid() == 0, "this test creates network namespaces: run it as root"
    tag = f"pccl_t{os.getpid()}"
    ns = (f"{tag}_a", f"{tag}_b")
    for n in ns:
        _run("ip", "netns", "add", n)
    emu = subprocess.Popen(
        [sys.executable, str(HERE / "wan_emulator.py"), "--ns-a", ns[0], "--ns-b", ns[1],
         "--ip-a", IP_A, "--ip-b", IP_B, "--delay-ms", "50", "--rate-mbit", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert emu.stdout is not None
        assert emu.stdout.readline().strip() == "ready", "the emulator did not start"
        yield ns
    finally:
        emu.terminate()
        emu.wait(10)
        for n in ns:
            pids = subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True)
            for pid in pids.stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def _spawn(ns: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable,
                             str(HERE / "wan_peer.py"), *args],
                            stdout=subprocess.PIPE, text=True, env=env)


def _pair(ns: tuple[str, str], k: str) -> list[dict[str, object]]:
    """Master and peer A in ``ns[0]``, peer B in ``ns[1]``: each peer's link report."""
    master = _spawn(ns[0], "master", IP_A)
    try:
        assert master.stdout is not None
        addr = f"{IP_A}:{int(master.stdout.readline())}"
        peers = [_spawn(ns[0], "peer", addr, IP_A, k), _spawn(ns[1], "peer", addr, IP_B, k)]
        outs = [p.communicate(timeout=60)[0] for p in peers]
        assert [p.returncode for p in peers] == [0, 0], outs
        return [json.loads(o.strip().splitlines()[-1]) for o in outs]
    finally:
        master.kill()
        master.wait()


@pytest.mark.timeout(150)
def test_auto_opens_the_cap_on_a_100ms_link_and_an_int_is_honoured(wan):
    for report in _pair(wan, "auto"):
        (k,) = report["k"].values()  # type: ignore[attr-defined]
        (rtt,) = report["rtt"]  # type: ignore[misc]
        assert 0.095 < rtt < 0.5, rtt  # 2 x 50 ms, measured on the first connection
        assert k == bdp.AUTO_CAP
    for report in _pair(wan, "3"):
        assert list(report["k"].values()) == [3]  # type: ignore[attr-defined]
        assert report["rtt"] == [None]
