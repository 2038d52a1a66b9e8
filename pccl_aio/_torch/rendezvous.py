"""The by-name backend's creator: ``dist.init_process_group("pccl_aio", ...)`` (torchrun's
``env://``, ``file://``, ``tcp://``, a ``store=``) meets the ranks through torch's store.

Rank 0 starts the run's master (``pccl_aio.blocking.Master``) on a port the OS chooses, on
the host the store is reached at (``MASTER_ADDR`` or the ``TCPStore``'s host; 127.0.0.1 for a
store on this machine, a ``FileStore`` or a ``HashStore``), and publishes ``host:port`` in the
store, unless ``$PCCL_AIO_MASTER`` names a master to use (the same on every rank). The
master lives in rank 0's process: when it dies, the run's master dies with it (an external
master, ``$PCCL_AIO_MASTER``, does not). Every rank connects a ``blocking.Communicator``
(the run secret from ``$PCCL_AIO_SECRET_FILE`` or ``$PCCL_AIO_SECRET``, as every
communicator and master reads it; TLS from ``$PCCL_AIO_TLS_CERT``, ``_KEY`` and ``_CA``:
``tls_from_env``), publishes its peer id, waits asleep until ``world_size``
peers are in its peer group and makes a ``FixedGroup`` with torch's ranks. Keys are under
``pccl_aio/<n>/``, ``n`` counting the store's rendezvous, so a second
``init_process_group`` on the same store finds none of the first's. A subgroup
(``new_group``, ``new_subgroups``, ``split_group``, a ``DeviceMesh``'s dimensions) is a run of
its own in the same way, met through torch's store for it, with its master in its rank 0.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import time
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import PrefixStore, TCPStore

from .._errors import InvalidUsageError, PcclTimeoutError
from .._net.credentials import TLS_ENV, tls_from_env
from ..blocking import Communicator, Master
from .fixed import FixedGroup

__all__ = ["MASTER_ENV", "TLS_ENV", "create", "master_host", "tls_from_env"]

MASTER_ENV = "PCCL_AIO_MASTER"
#: the master's options: ranks arriving together are admitted together (0.25 s); no master
#: secret (the run secret is read from the environment as usual)
OPTIONS: dict[str, Any] = {"admission_interval": 0.25, "master_secret": ""}
LINGER = 30.0  # at most, rank 0's wait at the end for the others to leave (``FixedGroup``)


def create(store: Any, rank: int, world_size: int, timeout: timedelta,
           subgroup: bool = False) -> FixedGroup:
    """The by-name group of torch rank ``rank`` of ``world_size``, met through ``store``.
    ``subgroup`` (``dist.new_group`` and the like: ``rank`` and ``world_size`` are the
    subgroup's): a run of its own, whose master the subgroup's rank 0 starts, whatever
    ``$PCCL_AIO_MASTER`` says (a subgroup's peers must not join the world's peer group).
    Blocks until every rank is in the peer group, ``timeout`` at most (``PcclTimeoutError``:
    the ranks that did not arrive named); ``InvalidUsageError`` for a bad ``rank`` or
    ``world_size`` (nothing is started), the communicator's and master's errors as they
    are. On an error everything started here is closed."""
    if not (isinstance(world_size, int) and world_size >= 2):
        raise InvalidUsageError(f"world_size must be an int >= 2 (a pccl_aio collective "
                                f"needs two peers; gloo for one process), not {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise InvalidUsageError(f"rank must be in [0, {world_size}), not {rank!r}")
    deadline = time.monotonic() + timeout.total_seconds()
    keys = f"pccl_aio/{(store.add('pccl_aio/ranks', 1) - 1) // world_size}"
    address, master = ("" if subgroup else os.environ.get(MASTER_ENV, "")), None
    server, client = tls_from_env()
    try:
        if not address:
            if rank == 0:
                master, address = _start_master(master_host(store), server)
                store.set(f"{keys}/master", address)
            else:
                address = _get(store, [f"{keys}/master"], deadline, "rank 0's master address")[0]
        comm = Communicator(address, ssl=client, ssl_server=server)
        try:
            comm.connect(timeout=_left(deadline))
            store.set(f"{keys}/peer/{rank}", str(comm.peer_id))
            try:
                comm.wait_for_peers(world_size, timeout=_left(deadline))
            except PcclTimeoutError:
                raise _missing(store, keys, world_size, timeout) from None
            order = _get(store, [f"{keys}/peer/{r}" for r in range(world_size)], deadline,
                         "the ranks' peer ids")
            return FixedGroup(comm, [int(p) for p in order], master=master, linger=LINGER,
                              address=address, timeout=timeout.total_seconds())
        except BaseException:
            comm.close()
            raise
    except BaseException:
        if master is not None:
            master.close()
        raise


def master_host(store: Any) -> str:
    """The host the ranks reach rank 0 at: the ``TCPStore``'s (under torch's prefixes),
    else ``$MASTER_ADDR``, else 127.0.0.1."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    host = store.host if isinstance(store, TCPStore) else ""
    return str(host or os.environ.get("MASTER_ADDR") or "127.0.0.1")


def _start_master(host: str, tls: ssl.SSLContext | None = None) -> tuple[Master, str]:
    """A master listening on ``host`` (the loopback for a local one; every interface when
    ``host`` is not this machine's, published under this machine's name) and its address.
    No master secret: this master is never restarted (it ends with rank 0's process)."""
    if _loopback(host):
        host = "127.0.0.1"
    master = Master(host, 0, ssl=tls, **OPTIONS)
    try:
        master.start()
        return master, master.address
    except OSError:  # (not an address of this machine: rank 0 is not where the store is)
        master.close()
    master = Master("0.0.0.0", 0, ssl=tls, **OPTIONS)
    master.start()
    return master, f"{socket.getfqdn()}:{master.port}"


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _left(deadline: float) -> float:
    """Seconds to ``deadline``; ``PcclTimeoutError`` once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise PcclTimeoutError("init_process_group('pccl_aio'): the timeout passed")
    return left


def _get(store: Any, names: list[str], deadline: float, what: str) -> list[str]:
    """The values of ``names``, waiting (asleep, in the store) until they are all set."""
    try:
        store.wait(names, timedelta(seconds=_left(deadline)))
    except RuntimeError as exc:  # (a store's timeout: DistStoreError, FileStore's RuntimeError)
        if "timeout" not in str(exc).lower():
            raise
        raise PcclTimeoutError(f"init_process_group('pccl_aio'): {what} did not come in "
                               f"time ({exc})") from exc
    return [bytes(store.get(n)).decode() for n in names]


def _missing(store: Any, keys: str, world_size: int, timeout: timedelta) -> PcclTimeoutError:
    """The timeout of a wait for the peers, naming the ranks that did not connect."""
    absent = [r for r in range(world_size) if not store.check([f"{keys}/peer/{r}"])]
    why = (f"ranks {absent} did not connect" if absent
           else "every rank connected, not every one was admitted")
    return PcclTimeoutError(
        f"init_process_group('pccl_aio'): {world_size - len(absent)} of {world_size} ranks "
        f"arrived within {timeout.total_seconds():g} s; {why}")
