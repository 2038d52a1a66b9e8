"""DiLoCo on Ray: the char-GPT of ``charlm.py`` trained by Ray worker actors, one pccl_aio
peer each, the run's master an actor too (``pccl_aio.ray``).

    ray start --head                      # or let ray.init() start a local instance
    python examples/ray_diloco.py --address auto --workers 3 -- --tiny

Every worker runs ``examples/diloco.py`` (the arguments after ``--``) with its own data seed
(its worker index). Kill a worker's process (``kill -9``): Ray starts the actor again
(``--max-restarts``) and reruns its training there; the new process joins the run live and
receives the global model and the step, while the others train on. Each worker prints the
line protocol of ``charlm.py`` (through Ray's log forwarding); at the end one JSON line
``{"event": "finished", "workers": [...]}`` with each worker's exit status and ``done``
line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

import ray

import pccl_aio.ray

HERE = Path(__file__).resolve().parent


class _Kept(io.TextIOBase):
    """stdout, keeping the last ``done`` line (Ray forwards a worker's output to the driver
    in the background: the last lines may not arrive before the driver ends)."""

    def __init__(self) -> None:
        self.done = ""

    def write(self, text: str) -> int:
        if text.startswith("done "):
            self.done = text.strip()
        return sys.__stdout__.write(text) if sys.__stdout__ else len(text)

    def flush(self) -> None:
        if sys.__stdout__:
            sys.__stdout__.flush()


def train(argv: list[str]) -> dict[str, object]:
    """One worker's run of ``diloco.py`` (in the worker's process): its exit status and
    its ``done`` line."""
    sys.path.insert(0, str(HERE))
    import diloco

    seed = os.environ.get("PCCL_AIO_WORKER_INDEX", "0")
    kept = _Kept()
    with contextlib.redirect_stdout(kept):
        status = int(diloco.main(diloco.parse([*argv, "--seed", seed])))
    return {"status": status, "done": kept.done}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", default=None, help="a Ray cluster (default: start one)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--max-restarts", type=int, default=5,
                    help="times Ray restarts a worker whose process died")
    ap.add_argument("--cpus-per-worker", type=float, default=0.5,
                    help="the CPUs Ray reserves for each worker")
    ap.add_argument("--heartbeat-timeout", type=float, default=5.0, help="the master's")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- diloco.py's arguments")
    args = ap.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    ray.init(address=args.address, runtime_env={"env_vars": {
        "PYTHONPATH": os.pathsep.join(filter(None, (str(HERE.parent),
                                                    os.environ.get("PYTHONPATH"))))}})
    master, address = pccl_aio.ray.start_master(heartbeat_timeout=args.heartbeat_timeout)
    print(json.dumps({"event": "master", "address": address}), flush=True)
    results = pccl_aio.ray.run_workers(train, args.workers, address, rest,
                                       max_restarts=args.max_restarts,
                                       num_cpus=args.cpus_per_worker)
    print(json.dumps({"event": "finished", "workers": results}), flush=True)
    ray.get(master.close.remote())
    ray.shutdown()
    return 0 if all(r["status"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
