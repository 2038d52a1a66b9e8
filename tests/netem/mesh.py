"""An emulated WAN mesh (the vendored ``wan-mesh``: N network namespaces, per-pair delay and
rate) and processes inside it, for ``tests/netem`` and ``bench/topology.py``. Needs root."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WAN_MESH = HERE / "wan-mesh"
DRIVER = HERE / "mesh_peer.py"


class Mesh:
    """``n`` hosts 10.204.0.1..n in namespaces pccl_mesh_1..n; ``up`` then always ``down``."""

    def __init__(self, n: int, delay_ms: float, rate_mbit: float) -> None:
        self.n, self.delay_ms, self.rate_mbit = n, delay_ms, rate_mbit

    def up(self) -> None:
        """Bring the mesh up (one retry: on a loaded machine the forwarder once missed the
        tool's 12 s start-up wait)."""
        args = ("up", str(self.n), f"{self.delay_ms:g}", f"{self.rate_mbit:g}")
        try:
            self._run(*args)
        except RuntimeError:
            self._run(*args)
        for i in range(1, self.n + 1):  # long-fat-link tuning (bench/wan.py does the same)
            subprocess.run(["ip", "netns", "exec", self.ns(i), "sysctl", "-qw",
                            "net.ipv4.tcp_slow_start_after_idle=0"], check=True, timeout=30)

    def down(self) -> None:
        self._run("down")

    def set(self, i: int, j: int, *opts: str, both: bool = True) -> None:
        """``wan-mesh set I J [both] OPTS`` (e.g. ``rate=50``)."""
        self._run("set", str(i), str(j), *(["both"] if both else []), *opts)

    def uniform(self) -> None:
        """Every ordered pair back to the mesh's delay and rate, no loss, no cut."""
        for i in range(1, self.n + 1):
            for j in range(i + 1, self.n + 1):
                self.set(i, j, f"delay={self.delay_ms:g}", f"rate={self.rate_mbit:g}",
                         "loss=0", "cut=0")

    @staticmethod
    def ns(i: int) -> str:
        return f"pccl_mesh_{i}"

    @staticmethod
    def ip(i: int) -> str:
        return f"10.204.0.{i}"

    def _run(self, *args: str) -> None:
        done = subprocess.run(["bash", str(WAN_MESH), *args], timeout=60, capture_output=True,
                              text=True, env={**os.environ, "PYTHON": sys.executable})
        if done.returncode:
            log = Path("/tmp/pccl-wan-mesh.log")
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"wan-mesh {' '.join(args)}: status {done.returncode}\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}\nlog: {tail}")


class Proc:
    """``mesh_peer.py`` in a namespace: commands on stdin, one JSON event per stdout line."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str, err: Any) -> None:
        self.proc, self.name, self._err = proc, name, err

    @classmethod
    async def start(cls, host: int, *args: str) -> Proc:
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(
                   x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)}
        err = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop)
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", Mesh.ns(host), sys.executable, str(DRIVER), *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err, env=env)
        return cls(proc, f"{args[0]} on host {host}", err)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    async def expect(self, event: str, timeout: float = 60.0) -> dict[str, Any]:
        """The next event, which must be ``event``."""
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            await self.proc.wait()
            self._err.seek(0)
            tail = self._err.read().decode(errors="replace")[-3000:]
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}): {tail}")
        got: dict[str, Any] = json.loads(raw)
        if got["event"] != event:
            raise AssertionError(f"{self.name}: expected {event!r}, got {got}")
        return got

    async def stop(self) -> None:
        """Kill it (if it still runs) and reap it."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()
        self._err.close()


async def run_master(host: int = 1) -> tuple[Proc, str]:
    """A master on ``host``; returns it and its address."""
    m = await Proc.start(host, "master", Mesh.ip(host))
    port = (await m.expect("up"))["port"]
    return m, f"{Mesh.ip(host)}:{port}"


async def run_peers(addr: str, hosts: list[int], world: int
                    ) -> tuple[list[Proc], list[int], list[int]]:
    """Peers on ``hosts`` (one each), joined until the run has ``world`` peers; returns them,
    their peer ids (in ``hosts`` order) and the ring they all see."""
    procs = [await Proc.start(h, "peer", addr, Mesh.ip(h), str(world)) for h in hosts]
    joined = await asyncio.gather(*(p.expect("joined", 120) for p in procs))
    rings = {tuple(j["ring"]) for j in joined}
    assert len(rings) == 1, joined
    return procs, [j["id"] for j in joined], list(rings.pop())
