"""Issue 47: ``deploy/slurm/pccl_aio.sbatch`` on a real single-node SLURM (Debian's
``slurm-wlm`` and ``munge``; the daemons are started here on OS-chosen ports and stopped at
the end). The job runs a master step and two replica steps of ``examples/diloco.py``; one
replica's process is SIGKILLed mid-run: the script starts its step again, the new process
joins the run live, the survivor loses no step, and both end with the same digest (each
outer step's digest the same on every process that printed it). Without the programs the
test fails under ``CI=true`` (CI installs them) and is skipped elsewhere, naming them."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "pccl_aio.sbatch"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo",
            "scancel")
STEP = re.compile(r"^step peer=(\d+) outer=(\d+) inner=\d+ world=(\d+) .*digest=(\w+)")
DONE = re.compile(r"^done peer=(\d+) outer=(\d+) .*digest=(\w+)")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check, timeout: float, what: str) -> None:
    import time

    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not seen in {timeout:g} s")
        time.sleep(0.5)  # (polling a daemon's state from outside: nothing to wait on)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A single-node SLURM of this machine: munged, slurmctld and slurmd in the foreground
    (their state under ``tmp_path``); the environment its clients need."""
    missing = [p for p in PROGRAMS if _which(p) is None]
    if missing:
        why = (f"SLURM is not installed ({', '.join(missing)} missing): `sudo apt-get install "
               "slurm-wlm munge` (Debian, Ubuntu) to run this test")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why} (CI=true: the SLURM test is required)")
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("the single-node SLURM of this test runs its daemons as root")
    host = socket.gethostname().split(".")[0]
    key = tmp_path / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = tmp_path / "munge.sock"
    (tmp_path / "spool").mkdir()
    conf = tmp_path / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=pcclaio", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
        f"StateSaveLocation={tmp_path}", f"SlurmdSpoolDir={tmp_path / 'spool'}",
        f"SlurmctldPidFile={tmp_path / 'ctld.pid'}", f"SlurmdPidFile={tmp_path / 'd.pid'}",
        f"SlurmctldLogFile={tmp_path / 'ctld.log'}", f"SlurmdLogFile={tmp_path / 'd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "ReturnToService=2", "JobAcctGatherType=jobacct_gather/none",
        f"NodeName={host} CPUs={os.cpu_count() or 2} State=UNKNOWN",
        f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=FORCE:8", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen(
        [_which("munged"), "-F", "--force", f"--socket={sock}", f"--key-file={key}",
         f"--pid-file={tmp_path / 'munged.pid'}", f"--log-file={tmp_path / 'munged.log'}",
         f"--seed-file={tmp_path / 'munged.seed'}"], stderr=subprocess.DEVNULL)]
    try:
        _wait(sock.exists, 20, "munged's socket")
        for daemon in ("slurmctld", "slurmd"):
            daemons.append(subprocess.Popen([_which(daemon), "-D", "-f", str(conf)], env=env,
                                            stderr=subprocess.DEVNULL))

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                 text=True, timeout=10)
            return out.stdout.strip() == "idle"

        _wait(idle, 60, "an idle node")
        yield {"SLURM_CONF": str(conf)}
        subprocess.run(["scancel", "--user", str(os.geteuid())], env=env, timeout=10)

        def empty() -> bool:
            return not subprocess.run(["squeue", "-h"], env=env, capture_output=True,
                                      text=True, timeout=10).stdout.strip()

        _wait(empty, 60, "no job left")
    finally:
        for d in reversed(daemons):
            d.terminate()
        for d in daemons:
            try:
                d.wait(15)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait(5)


def _diloco_pids(conf: str) -> list[int]:
    """The replicas' processes of this test's SLURM (their environment names its config)."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith(b"examples/diloco.py") \
                and f"SLURM_CONF={conf}".encode() in environ:  # (python, not bash or srun)
            out.append(int(proc.name))
    return out


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


async def test_the_sbatch_script_restarts_a_killed_replica_which_joins_live(slurm, tmp_path):
    out = tmp_path / "job.out"
    env = {**os.environ, **slurm, "PYTHON": sys.executable, "MAX_RESTARTS": "1",
           "PCCL_AIO_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    job = subprocess.run(
        ["sbatch", "--parsable", "--ntasks=3", "--overcommit", f"--output={out}", f"--chdir={ROOT}",
         str(SCRIPT), "examples/diloco.py", "--tiny", "--inner", "5", "--inner-steps", "3000"],
        env=env, capture_output=True, text=True, timeout=30, check=True).stdout.strip()

    def steps() -> list[tuple[int, int, int, str]]:
        return [(int(m[1]), int(m[2]), int(m[3]), m[4])
                for m in map(STEP.match, _lines(out)) if m]

    await asyncio.to_thread(_wait, lambda: len({p for p, _, w, _ in steps() if w == 2}) == 2
                            and max(o for *_, o, _, _ in [(0, *s[1:]) for s in steps()]) > 10,
                            120, "two replicas training together")
    first = {p for p, _, w, _ in steps() if w == 2}
    victims = _diloco_pids(slurm["SLURM_CONF"])
    assert len(victims) == 2, victims
    os.kill(victims[0], signal.SIGKILL)
    await asyncio.to_thread(
        _wait, lambda: any(p not in first and w == 2 for p, _, w, _ in steps()), 120,
        "the restarted replica training with the survivor")

    def finished() -> bool:
        q = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                           text=True, timeout=10)
        return not q.stdout.strip()

    await asyncio.to_thread(_wait, finished, 200, "the job's end")
    text = _lines(out)
    assert any("restart 1 of 1" in line for line in text), text[-20:]
    digests: dict[int, set[str]] = defaultdict(set)
    by_peer: dict[int, list[int]] = defaultdict(list)
    for peer, outer, _, digest in steps():
        digests[outer].add(digest)
        by_peer[peer].append(outer)
    assert all(len(d) == 1 for d in digests.values()), {o: d for o, d in digests.items()
                                                         if len(d) > 1}
    done = [m for m in map(DONE.match, text) if m]
    assert len(done) == 2 and done[0][3] == done[1][3] and done[0][2] == "600", text[-10:]
    survivor = int(done[0][1]) if int(done[0][1]) in first else int(done[1][1])
    assert by_peer[survivor] == list(range(1, 601))  # (the survivor lost no step)
    state = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True,
                           text=True, timeout=10).stdout
    assert "JobState=COMPLETED" in state, state
