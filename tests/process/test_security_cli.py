"""Issue 17 from the command line: ``python -m pccl_aio.master`` with ``--secret-file`` and
``--tls-*``, peers that take the secret from ``$PCCL_AIO_SECRET``, and rogues, all as real
processes."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import subprocess
import sys

import trustme

from tests.helpers import OTHER_SECRET, SECRET
from tests.process.procs import HERE, Proc, spawn
from tests.process.test_observability import MasterCli

ROGUE = """
import asyncio, sys, pccl_aio as pccl
async def main():
    ctx = None
    if len(sys.argv) > 2:
        ctx = pccl.tls_contexts(sys.argv[2], sys.argv[3], sys.argv[4])[1]
    async with pccl.Communicator(sys.argv[1], heartbeat_timeout=2.0, ssl=ctx) as c:
        await c.connect(attempts=1)
        print("joined", c.peer_id, flush=True)
pccl.run(main())
"""


async def _master(procs: list[Proc], *args: str, env: dict[str, str] | None = None
                  ) -> tuple[Proc, str]:
    m = await spawn("master", "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port", "0",
                    *args, env=env)
    procs.append(m)
    assert m.proc.stderr is not None
    lines = ""
    while "listening on" not in lines:  # after the line on the master secret, if any
        lines += (await asyncio.wait_for(m.proc.stderr.readline(), 20)).decode()
    port = re.search(r"listening on 127\.0\.0\.1:(\d+)", lines)
    assert port is not None, lines
    return m, f"127.0.0.1:{port.group(1)}"


async def cli_master(procs: list[Proc], *args: str, env: dict[str, str] | None = None,
                     port: int = 0) -> tuple[MasterCli, int]:
    """``python -m pccl_aio.master`` on ``port`` (0: the OS's choice) with JSON logs (read as
    they come) and ``args``, and the port it listens on."""
    proc = await spawn("master", "-m", "pccl_aio.master", "--host", "127.0.0.1", "--port",
                       str(port), "--log-format", "json", *args, env=env)
    procs.append(proc)
    master = MasterCli(proc)
    return master, int((await master.wait(r"listening on 127\.0\.0\.1:(\d+)")).group(1))


async def _rogue(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    p = await spawn("rogue", "-c", ROGUE, *args, env=env)
    out, err = await asyncio.wait_for(p.proc.communicate(), 20)
    return p.proc.returncode or 0, out.decode(), err.decode()


async def test_cli_master_with_a_secret_file_admits_only_peers_with_the_secret(procs, tmp_path):
    (tmp_path / "secret").write_text(SECRET + "\n")
    m, addr = await _master(procs, "--secret-file", str(tmp_path / "secret"),
                            env={"PCCL_AIO_STATE_DIR": str(tmp_path / "state")})
    env = {"PCCL_AIO_SECRET": SECRET}
    peers = []
    for i in range(2):
        p = await spawn(f"peer{i}", str(HERE / "worker.py"), addr, str(i), "2", "reduce",
                        str(1 << 16), env=env)
        procs.append(p)
        peers.append(p)
    done = [await p.expect("done") for p in peers]
    assert done[0]["hash"] == done[1]["hash"] and done[0]["ws"] == 2

    code, out, err = await _rogue(addr)  # no secret at all
    assert code != 0 and "AuthenticationError" in err and "joined" not in out, err
    assert "the master requires a run secret and this peer has none" in err, err
    assert "$PCCL_AIO_SECRET_FILE or $PCCL_AIO_SECRET" in err, err
    code, out, err = await _rogue(addr, env={"PCCL_AIO_SECRET": OTHER_SECRET})
    assert code != 0 and "AuthenticationError" in err and "joined" not in out, err
    assert "the run secrets differ" in err and OTHER_SECRET not in err, err
    code, out, _ = await _rogue(addr, env={"PCCL_AIO_SECRET_FILE": str(tmp_path / "secret")})
    assert code == 0 and out.startswith("joined"), out

    m.signal(signal.SIGTERM)
    assert await asyncio.wait_for(m.proc.wait(), 10) == 0
    assert m.proc.stderr is not None
    log = (await m.proc.stderr.read()).decode()
    assert log.count("refused a connection from 127.0.0.1") == 2, log
    assert "the peer has no run secret (this master requires one)" in log, log
    assert "the peer's run secret differs from this master's" in log, log
    assert SECRET not in log and OTHER_SECRET not in log, log


async def test_cli_master_over_mutual_tls(procs, tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    paths = {n: str(tmp_path / f"{n}.pem") for n in ("cert", "key", "ca")}
    cert.cert_chain_pems[0].write_to_path(paths["cert"])
    cert.private_key_pem.write_to_path(paths["key"])
    ca.cert_pem.write_to_path(paths["ca"])
    _, addr = await _master(procs, "--tls-cert", paths["cert"], "--tls-key", paths["key"],
                            "--tls-ca", paths["ca"])
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    code, _, err = await _rogue(addr)  # a plain client
    assert code != 0 and "AuthenticationError" in err, err
    assert loop.time() - t0 < 10  # a process start included; the error itself is at once
    code, out, err = await _rogue(addr, paths["cert"], paths["key"], paths["ca"])
    assert code == 0 and out.startswith("joined"), err


async def test_cli_warns_without_a_secret_on_a_public_address(procs):
    m = await spawn("master", "-m", "pccl_aio.master", "--host", "0.0.0.0", "--port", "0")
    procs.append(m)
    assert m.proc.stderr is not None
    lines = [(await asyncio.wait_for(m.proc.stderr.readline(), 20)).decode() for _ in range(2)]
    assert "no run secret" in lines[0] and "WARNING" in lines[1], lines
    assert "without a run secret: anyone who reaches this port can join" in lines[1]


async def test_cli_refuses_a_bad_secret_file_or_half_a_tls_pair(tmp_path):
    (tmp_path / "weak").write_text("correcthorse77\n")
    for args in (["--secret-file", str(tmp_path / "missing")],
                 ["--secret-file", str(tmp_path / "weak")],
                 ["--master-secret-file", str(tmp_path / "weak")],
                 ["--tls-cert", str(tmp_path / "cert.pem")]):
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pccl_aio.master", "--port", "0", *args,
            stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(p.communicate(), 20)
        assert p.returncode == 2, err
        assert (b"secret file" in err or b"--tls-cert and --tls-key go together" in err
                or (b"too weak" in err and b"python -m pccl_aio.secret" in err)), err


def _secret_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pccl_aio.secret", *args], capture_output=True,
                          text=True, timeout=30)


def test_the_secret_cli_prints_a_fresh_256_bit_secret():
    one, two = _secret_cli(), _secret_cli()
    assert one.returncode == two.returncode == 0 and one.stderr == ""
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}\n", one.stdout), one.stdout
    assert one.stdout != two.stdout
    assert _secret_cli("--help").stdout.startswith("usage: python -m pccl_aio.secret")


async def test_the_secret_cli_writes_an_owner_only_file_a_master_and_peers_use(tmp_path, procs):
    """``python -m pccl_aio.secret --file F``: mode 0600, never overwritten; the master's
    ``--secret-file`` and a peer's ``$PCCL_AIO_SECRET_FILE`` take it: the peer joins."""
    path = tmp_path / "run.secret"
    assert _secret_cli("--file", str(path)).returncode == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = path.read_text()
    again = _secret_cli("--file", str(path))
    assert again.returncode == 1 and "cannot create" in again.stderr and "exists" in again.stderr
    assert path.read_text() == first  # never replaced
    _, addr = await _master(procs, "--secret-file", str(path),
                            env={"PCCL_AIO_STATE_DIR": str(tmp_path / "state")})
    rogue = await spawn("peer", "-c", ROGUE, addr, env={"PCCL_AIO_SECRET_FILE": str(path)})
    procs.append(rogue)
    assert (await rogue.line(timeout=30)).startswith("joined ")
