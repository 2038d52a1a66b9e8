"""Every console script the package installs points at a function that imports, and the
installed ``pccl-aio-master`` runs (``--help``) as a user would run it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_console_scripts_target_imports(name):
    module, _, attr = SCRIPTS[name].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_the_installed_master_command_runs():
    command = Path(sys.executable).parent / "pccl-aio-master"
    assert command.exists(), f"{command}: install the package (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}  # (this checkout's code)
    done = subprocess.run([str(command), "--help"], capture_output=True, text=True,
                          timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "--status-port" in done.stdout
