"""Bad input to the engines' entry points is refused before anything starts: the sbatch
script's settings and arguments (``deploy/slurm/pccl_aio.sbatch``, run by bash outside
SLURM) and ``pccl_aio.ray.run_workers``'s worker count."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import pccl_aio as pccl

pytestmark = pytest.mark.timeout(60)

SBATCH = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "pccl_aio.sbatch"


def _sbatch(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SBATCH), *args], capture_output=True, text=True,
                          timeout=30, env={"PATH": os.environ["PATH"], **env})


def test_the_sbatch_script_needs_a_script():
    done = _sbatch()
    assert done.returncode == 2 and "usage: sbatch" in done.stderr


@pytest.mark.parametrize(("name", "value"), [("REPLICAS", "x"), ("REPLICAS", "0"),
                                             ("NPROC", "-1"), ("MAX_RESTARTS", "two"),
                                             ("PCCL_AIO_PORT", "0")])
def test_a_bad_sbatch_setting_is_named(name, value):
    done = _sbatch("train.py", **{name: value, "SLURM_JOB_NODELIST": "n1"})
    shown = "PORT" if name == "PCCL_AIO_PORT" else name
    least = 0 if name == "MAX_RESTARTS" else 1
    assert done.returncode == 2 and f"{shown} must be an integer >= {least}" in done.stderr


def test_the_sbatch_script_outside_a_slurm_job_says_so():
    done = _sbatch("train.py")
    assert done.returncode != 0 and "not inside a SLURM job" in done.stderr


def test_ray_run_workers_refuses_a_bad_count():
    ray = pytest.importorskip("ray")
    import pccl_aio.ray

    for n in (0, -1, 1.5):
        with pytest.raises(pccl.InvalidUsageError, match="n must be a positive int"):
            pccl_aio.ray.run_workers(print, n, "127.0.0.1:1")
    assert not ray.is_initialized()  # (refused before Ray was asked for anything)
