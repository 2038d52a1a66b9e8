"""How the launcher starts a run's processes: the master, and each peer as a replica of one
process or, with ``--replica-procs K``, of K (``--shard j --replica-store HOST:PORT``, a
sharded model's processes that meet at the store), their output forwarded to the launcher's
queue line by line (``Starter``, the base of ``runner.Launcher``)."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .procs import Child, open_log
from .record import Record

_LISTENING = re.compile(r"listening on \S+:(\d+)")


@dataclass
class Config:
    """The launcher's command line."""

    example: Path
    peers: int  # replicas of the run
    churn: float | None
    out: Path
    seed: int
    timeout: float | None
    peer_args: list[str]
    replica_procs: int = 1  # processes per replica (a sharded model: one per shard)


def free_port() -> int:
    """A port of 127.0.0.1 free now (for a replica's store, which its shard 0 listens on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Starter:
    """Starts the master and the replicas; every line a replica's process prints, then its
    exit, goes to ``queue`` as ``(child, "line", text)`` and ``(child, "exit", None)``."""

    cfg: Config
    record: Record
    env: dict[str, str]
    preexec: Callable[[], None] | None
    queue: asyncio.Queue[tuple[Child | None, str, str | None]]
    children: list[Child]
    tasks: list[asyncio.Task[None]]
    master: Child | None
    address: str
    next_seed: int
    outer: int
    inner: int

    def now(self) -> float:
        raise NotImplementedError

    async def _spawn(self, *args: str, stdout: int, stderr: int | IO[str]
                     ) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, *args, stdin=asyncio.subprocess.DEVNULL, stdout=stdout,
            stderr=stderr, env=self.env, start_new_session=True, preexec_fn=self.preexec)

    async def start_master(self) -> None:
        """``python -m pccl_aio.master`` on a port the OS picks; its log says which.
        ``RuntimeError`` if it did not start within 30 s."""
        log_path = self.cfg.out / "logs" / "master.log"
        proc = await self._spawn("-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0",
                                 "--log-level", "INFO", stdout=asyncio.subprocess.DEVNULL,
                                 stderr=asyncio.subprocess.PIPE)
        self.master = Child("master", None, proc, err_path=log_path)
        self.record.row(self.now(), "start", None, {}, f"master pid={proc.pid}")
        log = open_log(log_path)  # closed by its pump
        assert proc.stderr is not None
        while not self.address:
            try:
                raw = await asyncio.wait_for(proc.stderr.readline(), 30)
            except TimeoutError:
                raw = b""
            if not raw:
                log.close()
                raise RuntimeError(f"the master did not start (its log: {log_path}):\n"
                                   f"{self.master.stderr_tail()}")
            log.write(raw.decode(errors="replace"))
            log.flush()
            if m := _LISTENING.search(raw.decode(errors="replace")):
                self.address = f"127.0.0.1:{m.group(1)}"
        self.tasks.append(asyncio.ensure_future(self._pump(self.master, proc.stderr, log)))

    async def start_replica(self, replacement: bool) -> list[Child]:
        """A replica with the next seed: one process, or ``replica_procs`` sharing a store
        (``--shard j --replica-store``); replacements need only one other replica."""
        seed, self.next_seed = self.next_seed, self.next_seed + 1
        k = self.cfg.replica_procs
        store = [] if k == 1 else ["--replica-store", f"127.0.0.1:{free_port()}"]
        return [await self._start(seed, None if k == 1 else j, store, replacement)
                for j in range(k)]

    async def _start(self, seed: int, shard: int | None, store: list[str],
                     replacement: bool) -> Child:
        logs = self.cfg.out / "logs"
        stem = f"seed{seed}" if shard is None else f"seed{seed}.shard{shard}"
        err_path = logs / f"{stem}.err"
        sharding = [] if shard is None else ["--shard", str(shard), *store]
        with open_log(err_path) as err:
            proc = await self._spawn(
                str(self.cfg.example), "--master", self.address, "--seed", str(seed),
                *sharding, "--min-peers", str(2 if replacement else self.cfg.peers),
                *self.cfg.peer_args, stdout=asyncio.subprocess.PIPE, stderr=err)
        out = open_log(logs / f"{stem}.out")  # closed by its pump
        name = f"seed {seed}" if shard is None else f"seed {seed} shard {shard}"
        child = Child(name, seed, proc, out, err_path, replacement, shard=shard)
        self.children.append(child)
        self.record.row(self.now(), "start", seed, {"outer": str(self.outer),
                                                    "inner": str(self.inner)},
                        f"pid={proc.pid}" + (" replacement" if replacement else ""), shard)
        assert proc.stdout is not None
        self.tasks.append(asyncio.ensure_future(self._pump(child, proc.stdout, out)))
        return child

    async def _pump(self, child: Child, stream: asyncio.StreamReader, copy: IO[str]) -> None:
        """Forward ``child``'s lines to the queue, then its exit (after its last line)."""
        try:
            async for raw in stream:
                text = raw.decode(errors="replace")
                copy.write(text)
                copy.flush()
                if child.seed is not None:
                    await self.queue.put((child, "line", text))
        finally:
            copy.close()
        await child.proc.wait()
        await self.queue.put((child, "exit", None))
