"""pccl_aio on Ray: the run's master as an actor, the peers as actors Ray restarts.

    import ray
    import pccl_aio.ray

    ray.init()                                   # or ray.init(address="auto")
    master, address = pccl_aio.ray.start_master()
    results = pccl_aio.ray.run_workers(train, 3, address, max_restarts=5)

``start_master`` runs a ``blocking.Master`` in an actor (no CPU reserved) on this node's IP
and a port the OS chooses, and returns the actor and ``host:port``. ``run_workers`` starts
``n`` worker actors and calls ``fn(*args)`` in each with ``$PCCL_AIO_MASTER`` set (so
``Communicator.from_env()``, ``pccl_aio.torch.init_process_group()`` and the examples'
``--master`` find the run) and ``$PCCL_AIO_WORKER_INDEX`` (0..n-1); it blocks until every
call returned and gives their results in worker order. A worker whose process dies is
restarted by Ray (``max_restarts`` times) and its call is run again there
(``max_task_retries``): the new process connects as a new peer, is admitted by the others'
next vote and receives the shared state, as any joiner; nobody restarts the run. Raises
the worker's exception (``ray.exceptions.RayTaskError``) once a worker failed more often
than that. Needs ``ray``; importing ``pccl_aio`` does not import it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ray

from ._errors import InvalidUsageError
from .blocking import Master

__all__ = ["MasterActor", "WorkerActor", "run_workers", "start_master"]


class _Master:
    """A ``blocking.Master`` listening on ``host:port`` (``port`` 0: the OS chooses)."""

    def __init__(self, host: str, port: int, options: dict[str, Any]) -> None:
        host = host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._master = Master(host, port, **options)
        self._master.start()

    def address(self) -> str:
        """``host:port`` the peers connect to."""
        return self._master.address

    def close(self) -> None:
        self._master.close()


class _Worker:
    """One peer's process: ``run(fn, ...)`` calls ``fn`` with the run in the environment."""

    def __init__(self, master: str, index: int, env: dict[str, str]) -> None:
        os.environ.update(env)
        os.environ["PCCL_AIO_MASTER"] = master
        os.environ["PCCL_AIO_WORKER_INDEX"] = str(index)

    def pid(self) -> int:
        return os.getpid()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


MasterActor: Any = ray.remote(num_cpus=0)(_Master)
WorkerActor: Any = ray.remote(_Worker)


def start_master(host: str = "", port: int = 0, **options: Any) -> tuple[Any, str]:
    """The master actor and its address (see the module); ``options`` are
    ``blocking.Master``'s (``secret``, ``heartbeat_timeout``, ``status_port`` ...). Blocks
    until it listens; raises its error (``OSError`` for a port in use)."""
    actor = MasterActor.remote(host, port, options)
    return actor, str(ray.get(actor.address.remote()))


def run_workers(fn: Callable[..., Any], n: int, master: str, *args: Any,
                max_restarts: int = 3, num_cpus: float = 1,
                env: dict[str, str] | None = None) -> list[Any]:
    """``fn(*args)`` in each of ``n`` worker actors (see the module); blocks until all
    returned. ``env``: more environment variables for the workers. ``InvalidUsageError``
    for a bad ``n``."""
    if not isinstance(n, int) or n < 1:
        raise InvalidUsageError(f"n must be a positive int, not {n!r}")
    workers = [WorkerActor.options(
        max_restarts=max_restarts, max_task_retries=max_restarts, num_cpus=num_cpus,
    ).remote(master, i, dict(env or {})) for i in range(n)]
    return list(ray.get([w.run.remote(fn, *args) for w in workers]))
