"""A TorchX component for a pccl_aio run: a ``master`` role and ``replicas`` replicas of a
training script (``pip install torchx``; docs/engines/torchx.md)::

    torchx run -s local_cwd pccl_aio/torchx.py:run --script examples/diloco.py \\
        --replicas 2 --master_flag=--master -- --tiny
    torchx run -s kubernetes pccl_aio/torchx.py:run --image IMAGE --script \\
        examples/fsdp_diloco.py --replicas 4 --nproc_per_node 2 --max_retries 3

Outside the repository, name this file by its path (``python -c "import pccl_aio.torchx as
t; print(t.__file__)"``). The ``master`` role runs ``python -m pccl_aio.torchx``: a master
that exits (0) once its run had peers and then none for ``idle_exit`` seconds, so the app
ends when training does. Each replica runs ``python SCRIPT ARGS``, or with
``nproc_per_node`` K > 1 ``torchrun`` on one node (K processes, one pccl_aio replica;
rendezvous on a free local port, run id ``APP-REPLICA-RANDOM``: distinct per replica and per
restart, so a restarted replica never merges with what the master still holds of its
predecessor).

The replicas find the master through TorchX's ``rank0_env`` macro, as ``dist.ddp`` finds
its rank 0: the name of the variable that holds the host of the first role's first replica
(``TORCHX_RANK0_HOST`` = localhost on the local schedulers, ``VC_MASTER_0_HOSTS`` on
Kubernetes, ``SLURM_JOB_NODELIST_HET_GROUP_0`` on SLURM), so ``master`` stays the first role.
Each replica's shell exports ``PCCL_AIO_MASTER=HOST:master_port`` (``Communicator.
from_env()`` reads it); ``master_flag`` also passes it to a script that takes it as an option.
"""

import argparse
import asyncio
import contextlib
import shlex
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchx.specs import AppDef

__all__ = ["main", "run"]


def run(script: str, *script_args: str, replicas: int = 2, nproc_per_node: int = 1,
        master_port: int = 48148, status_port: int = 0, idle_exit: int = 60,
        master_flag: str = "", secret_file: str = "", image: str = "pccl_aio:latest",
        cpu: int = 2, gpu: int = 0, memMB: int = 4096, max_retries: int = 0,
        name: str = "pccl_aio") -> "AppDef":
    """A pccl_aio run: one master and ``replicas`` replicas of ``script``.

    Args:
        script: the training script each replica runs (a path in the image or cwd)
        script_args: the script's arguments
        replicas: how many replicas (TorchX replicas of the ``replicas`` role)
        nproc_per_node: processes per replica (above 1: under torchrun, one replica)
        master_port: the master's TCP port
        status_port: the master's status page on its host's loopback (0: none)
        idle_exit: once the run had peers, seconds without any till the master exits (0: never)
        master_flag: an option of the script that takes the master's HOST:PORT
        secret_file: the run secret's file, the same path on every host
        image: the image with pccl_aio and the script (kubernetes, docker)
        cpu: CPUs per replica
        gpu: GPUs per replica
        memMB: memory per replica, in MB
        max_retries: restarts of each role's replicas, where the scheduler supports them
        name: the app's name
    """
    from torchx import specs

    env = {"PCCL_AIO_SECRET_FILE": secret_file} if secret_file else {}
    serve = ["-m", "pccl_aio.torchx", "--port", str(master_port), "--idle-exit",
             str(idle_exit)]
    ports = {"pccl": master_port}
    if status_port:
        serve += ["--status-port", str(status_port)]
        ports["status"] = status_port
    master = specs.Role(
        name="master", image=image, entrypoint="python", args=serve, env=dict(env),
        resource=specs.resource(cpu=1, gpu=0, memMB=2048), port_map=ports,
        max_retries=max_retries, retry_policy=specs.RetryPolicy.REPLICA)
    if nproc_per_node > 1:  # ${app_id}, ${replica_id}: TorchX's macros; $$: a literal $
        launch = ["python", "-m", "torch.distributed.run", "--nnodes", "1",
                  "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", "localhost:0", "--tee", "3", "--rdzv-id"]
        rdzv = f" {specs.macros.app_id}-{specs.macros.replica_id}-$$RANDOM$$RANDOM"
    else:
        launch, rdzv = ["python"], ""
    tail = f' {shlex.quote(master_flag)} "$$PCCL_AIO_MASTER"' if master_flag else ""
    command = (f'export PCCL_AIO_MASTER="$${{{specs.macros.rank0_env}:-localhost}}:'
               f'{master_port}"; exec {shlex.join(launch)}{rdzv} '
               f"{shlex.join([script, *script_args])}{tail}")
    workers = specs.Role(
        name="replicas", image=image, entrypoint="bash", args=["-c", command], env=env,
        num_replicas=replicas, resource=specs.resource(cpu=cpu, gpu=gpu, memMB=memMB),
        max_retries=max_retries, retry_policy=specs.RetryPolicy.REPLICA)
    return specs.AppDef(name=name, roles=[master, workers])


async def _serve(args: argparse.Namespace) -> int:
    """A master until SIGINT/SIGTERM, or until its run had peers and then none (members or
    joiners) for ``args.idle_exit`` seconds."""
    from pccl_aio import Master

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Master(args.host, args.port, status_port=args.status_port) as master:
        busy_at: float | None = None  # when the run last had a peer (None: never yet)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if master.state.accepted() or master.state.pending():
                busy_at = loop.time()
            elif busy_at is not None and 0 < args.idle_exit <= loop.time() - busy_at:
                break
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pccl_aio.torchx``: the component's master (``--help`` says more)."""
    ap = argparse.ArgumentParser(
        prog="python -m pccl_aio.torchx", description="A pccl_aio master that exits (0) "
        "once its run had peers and then none for --idle-exit seconds (TorchX's master "
        "role); the run secret from $PCCL_AIO_SECRET_FILE or $PCCL_AIO_SECRET.")
    ap.add_argument("--host", default="0.0.0.0", help="address to listen on")
    ap.add_argument("--port", type=int, default=48148, help="TCP port to listen on")
    ap.add_argument("--status-port", type=int, help="status page port (loopback)")
    ap.add_argument("--idle-exit", type=float, default=60.0, metavar="SECONDS",
                    help="exit after this long without peers, once it had some (0: never)")
    args = ap.parse_args(argv)
    from pccl_aio import run as run_loop
    from pccl_aio._log import configure

    configure()
    return run_loop(_serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
