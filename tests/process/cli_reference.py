"""The command lines' reference page, ``docs/reference/cli.md``: every ``python -m
pccl_aio.X --help`` as the program prints it (100 columns). ``python -m
tests.process.cli_reference`` writes the page; ``test_docs_site.py`` checks it is current."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "cli.md"
COMMANDS = {
    "pccl_aio.master": "The master (also installed as `pccl-aio-master`).",
    "pccl_aio.demo": "The one-command demo: a master and peers on this machine, a SIGKILL and "
                     "a joiner.",
    "pccl_aio.launch": "Launch a training example with churn on this machine.",
    "pccl_aio.secret": "Make a run secret.",
    "pccl_aio.torchx": "The master of a TorchX app (exits once its run had peers and then "
                       "none).",
}


def help_text(module: str) -> str:
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, timeout=60, env=env, check=True)
    return done.stdout.rstrip() + "\n"


def page() -> str:
    parts = ["# Command lines", "",
             "Each program's `--help`, as it prints it. The environment variables a peer "
             "reads are on [torchrun's page](../engines/torchrun.md).", ""]
    for module, what in COMMANDS.items():
        parts += [f"## `python -m {module}`", "", what, "", "```text", help_text(module).rstrip(),
                  "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    PAGE.write_text(page())
    print(f"wrote {PAGE}")
