"""``pccl_aio/torchx.py`` under TorchX's own command line: ``torchx run -s local_cwd`` starts
the master and two replicas of ``examples/diloco.py`` (one process each) or of
``examples/fsdp_diloco.py`` (two processes each, under torchrun), which train together (world
2, the same digest at every outer step); the master ends the app when the run is over and
the app succeeds. ``--dryrun`` renders the SLURM and Kubernetes requests: the master role
first, one entry per replica, ``PCCL_AIO_MASTER`` taken from the master's host."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = "pccl_aio/torchx.py:run"
LINE = re.compile(r"^replicas/(\d+) (?:\[\D*(\d+)\]:)?(step|done) (.*)$")
TRAIN = ("--tiny", "--seed", "${replica_id}", "--inner", "5", "--inner-steps", "20")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchx(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``torchx ARGS`` from the repository root; on a timeout it is stopped with SIGTERM (it
    stops its app's processes then) and the test fails."""
    beside = Path(sys.executable).with_name("torchx")
    exe = str(beside) if beside.exists() else shutil.which("torchx")
    assert exe, "the torchx command is missing (pip install torchx)"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.Popen([exe, *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"torchx {' '.join(args)} ran over {timeout:g} s:\n"
                             f"{out[-3000:]}\n{err[-5000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _trained(err: str) -> dict[tuple[int, int], list[dict[str, str]]]:
    """The ``step`` and ``done`` lines of each (replica, rank), from TorchX's log stream."""
    lines: dict[tuple[int, int], list[dict[str, str]]] = defaultdict(list)
    for raw in err.splitlines():
        if match := LINE.match(raw.strip()):
            replica, rank, kind, rest = match.groups()
            fields = dict(p.split("=", 1) for p in rest.split() if "=" in p)
            lines[(int(replica), int(rank or 0))].append({"kind": kind, **fields})
    return lines


def _check_run(done: subprocess.CompletedProcess[str], ranks: int) -> None:
    """Both replicas made outer steps 1-4 together (world 2), each rank's digest the same on
    both at every step and at the end, and the app succeeded."""
    where = f"{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, where
    assert "Job finished: SUCCEEDED" in done.stderr, where
    lines = _trained(done.stderr)
    assert set(lines) == {(r, k) for r in (0, 1) for k in range(ranks)}, where
    for rank in range(ranks):
        a, b = lines[(0, rank)], lines[(1, rank)]
        for got in (a, b):
            steps = [f for f in got if f["kind"] == "step"]
            assert [int(f["outer"]) for f in steps] == [1, 2, 3, 4], where
            assert all(f["world"] == "2" for f in steps), where
            assert got[-1]["kind"] == "done", where
        assert [f["digest"] for f in a] == [f["digest"] for f in b], where
    if ranks > 1:  # (each rank holds its own shard: the digests of the two differ)
        assert lines[(0, 0)][-1]["digest"] != lines[(0, 1)][-1]["digest"]


def test_local_cwd_runs_two_single_process_replicas() -> None:
    done = _torchx("run", "-s", "local_cwd", COMPONENT, "--script", "examples/diloco.py",
                   "--replicas", "2", "--master_port", str(_free_port()), "--idle_exit", "2",
                   "--master_flag=--master", "--", *TRAIN)
    _check_run(done, ranks=1)


def test_local_cwd_runs_two_torchrun_replicas_of_two_processes() -> None:
    done = _torchx("run", "-s", "local_cwd", COMPONENT, "--script", "examples/fsdp_diloco.py",
                   "--replicas", "2", "--nproc_per_node", "2", "--master_port",
                   str(_free_port()), "--idle_exit", "2", "--", *TRAIN)
    _check_run(done, ranks=2)


def test_slurm_dryrun_renders_a_master_and_the_replicas() -> None:
    done = _torchx("run", "--dryrun", "-s", "slurm", COMPONENT, "--script",
                   "examples/fsdp_diloco.py", "--replicas", "3", "--nproc_per_node", "2",
                   "--master_port", "40001", "--max_retries", "2", "--", "--tiny", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    script = done.stdout.partition("=== SCHEDULER REQUEST ===")[2]
    jobs = re.findall(r"^#SBATCH --job-name=(\S+)", script, re.M)
    assert jobs == ["master-0", "replicas-0", "replicas-1", "replicas-2"]
    assert "python -m pccl_aio.torchx --port 40001" in script
    assert "export TORCHX_MAX_RETRIES=2" in script
    master = 'PCCL_AIO_MASTER="${SLURM_JOB_NODELIST_HET_GROUP_0:-localhost}:40001"'
    assert script.count(master) == 3
    for r in range(3):  # one torchrun job per replica, its own rendezvous id
        assert f"--rdzv-id '\"$SLURM_JOB_ID\"'-{r}-$RANDOM$RANDOM" in script
    assert script.count("--nproc-per-node 2") == 3


def test_kubernetes_dryrun_renders_a_master_and_the_replicas() -> None:
    done = _torchx("run", "--dryrun", "--workspace", "", "-s", "kubernetes",
                   "-cfg", "queue=default", COMPONENT, "--image", "trainer:1", "--script",
                   "examples/diloco.py", "--replicas", "3", "--master_port", "40002",
                   "--status_port", "40003", "--master_flag=--master", "--secret_file",
                   "/secrets/run.secret", "--", "--tiny",
                   timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    job = yaml.safe_load(done.stdout.partition("=== SCHEDULER REQUEST ===")[2])
    tasks = {t["name"]: t["template"]["spec"]["containers"][0] for t in job["spec"]["tasks"]}
    assert list(tasks) == ["master-0", "replicas-0", "replicas-1", "replicas-2"]
    master = tasks["master-0"]
    assert master["image"] == "trainer:1"
    assert master["command"][:5] == ["python", "-m", "pccl_aio.torchx", "--port", "40002"]
    assert {p["name"]: p["containerPort"] for p in master["ports"]} == {
        "pccl": 40002, "status": 40003}
    for task in tasks.values():
        assert {"name": "PCCL_AIO_SECRET_FILE", "value": "/secrets/run.secret"} in task["env"]
    for r in range(3):
        command = tasks[f"replicas-{r}"]["command"]
        assert command[:2] == ["bash", "-c"]
        assert command[2] == (
            'export PCCL_AIO_MASTER="${VC_MASTER_0_HOSTS:-localhost}:40002"; exec python '
            "examples/diloco.py --tiny --master \"$PCCL_AIO_MASTER\""), command


def test_import_pccl_aio_does_not_import_torchx() -> None:
    code = "import sys, pccl_aio; assert 'torchx' not in sys.modules, 'torchx imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
