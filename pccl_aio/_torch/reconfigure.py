"""Replacing a lost rank of a by-name world: torch's reconfigure API on a ``FixedGroup``.

torch 2.15's fault-tolerance flow (``dist._get_reconfigure_handle``, ``dist._reconfigure``;
``pccl_aio.torch.reconfigure_handle`` and ``reconfigure`` on every torch): after a rank was
lost, the survivors and a replacement process each take a handle, exchange them out of band
(any way: a store, a file, a scheduler) and all call ``reconfigure(uuid, handles)``. The
replacement was made to join then: ``dist.init_process_group("pccl_aio", rank=r,
world_size=n, enable_reconfigure=True)`` (torch 2.15) or with ``$PCCL_AIO_RECONFIGURE=1``
(any torch); it connects to nothing until ``reconfigure``.

A handle is ``pccl_aio;1;<rank>;<master address>;<nonce>``: the rank the process holds,
the run's master as the process knows it (empty for a replacement) and a random nonce that
names the process. ``reconfigure``:

1. checks the handles: one per rank 0..n-1 (a list in rank order, or a set), this process's
   own among them, one master named (``InvalidUsageError`` otherwise, nothing sent);
2. connects a replacement to that master (TLS from the environment, ``tls_from_env``);
3. waits until the peer group is exactly n peers (the lost ones dropped by the master, the
   replacements admitted by everyone's joint vote, ``wait_for_peers``), and all-gathers
   (uuid, rank, nonce) over it: every rank sees the same table, so every rank either
   takes the new ranks or raises the same ``InvalidUsageError`` (a uuid or a nonce that
   does not match). A peer lost meanwhile starts the wait again;
4. rebinds the group: the same torch rank and size, the new ring; tags start again.

Blocks for all of it (``timeout`` seconds, ``PcclTimeoutError``). The master must outlive
the lost rank: rank 0's process hosts it unless ``$PCCL_AIO_MASTER`` names one, so a lost
rank 0 takes the run's master with it and cannot be replaced this way.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .._errors import InvalidUsageError, PcclTimeoutError, PeerLostError
from .._net.credentials import tls_from_env
from ..blocking import Communicator
from .group import TAGS

__all__ = ["ENV", "Group", "Handle", "handle_of", "reconfigure"]

ENV = "PCCL_AIO_RECONFIGURE"
PREFIX = "pccl_aio;1"
POLL = 0.05  # seconds between looks at the membership while more peers than ranks remain
_MASK = (1 << 63) - 1


class Group(Protocol):
    """What ``reconfigure`` needs of a by-name group (``FixedGroup``)."""

    comm: Communicator
    address: str
    nonce: str
    timeout: float

    @property
    def joined(self) -> bool: ...

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def rebind(self, comm: Communicator, order: list[int], address: str) -> None: ...


@dataclass(frozen=True)
class Handle:
    """One process's reconfigure handle (see the module)."""

    rank: int
    master: str
    nonce: str

    def __str__(self) -> str:
        return f"{PREFIX};{self.rank};{self.master};{self.nonce}"

    @classmethod
    def parse(cls, text: object) -> Handle:
        """The handle ``text`` spells; ``InvalidUsageError`` for anything else."""
        parts = text.split(";") if isinstance(text, str) else []
        if len(parts) != 5 or ";".join(parts[:2]) != PREFIX or not parts[2].isdigit() \
                or not parts[4]:
            raise InvalidUsageError(f"{text!r} is not a pccl_aio reconfigure handle (one of "
                                    "get_reconfigure_handle())")
        return cls(int(parts[2]), parts[3], parts[4])

    @property
    def check(self) -> int:
        return zlib.crc32(self.nonce.encode())


def handle_of(group: Group) -> str:
    """This process's handle in ``group``. Does not block."""
    return str(Handle(group.rank(), group.address if group.joined else "", group.nonce))


def reconfigure(group: Group, uuid: int, handles: Collection[str],
                timeout: float | None = None) -> None:
    """Make ``group``'s ranks the processes of ``handles`` (see the module). Blocks until
    then, ``timeout`` seconds at most (the group's by default). A cancellation cannot
    reach a blocking call; a failure leaves the group as it was (a replacement stays
    unjoined, its connection closed)."""
    size = group.size()
    parsed = [Handle.parse(h) for h in handles]
    if isinstance(handles, (set, frozenset)):
        parsed.sort(key=lambda h: h.rank)
    if [h.rank for h in parsed] != list(range(size)):
        raise InvalidUsageError(f"reconfigure needs one handle per rank 0..{size - 1} (a "
                                f"list in rank order or a set), not ranks "
                                f"{[h.rank for h in parsed]}")
    if parsed[group.rank()].nonce != group.nonce:
        raise InvalidUsageError(f"rank {group.rank()}'s handle is not this process's (take "
                                "it with get_reconfigure_handle() in this process)")
    masters = sorted({h.master for h in parsed if h.master})
    if len(masters) != 1:
        raise InvalidUsageError(f"the handles must name one master (a member's handle names "
                                f"the run's), not {masters}")
    address = masters[0]
    if group.joined and address != group.address:
        raise InvalidUsageError(f"the handles name master {address}; this rank's run is "
                                f"{group.address}")
    end = time.monotonic() + (group.timeout if timeout is None else timeout)
    comm = group.comm if group.joined else _connect(address, end)
    try:
        order = _agree(comm, uuid, parsed, group.rank(), end)
    except BaseException:
        if comm is not group.comm:
            comm.close()
        raise
    group.rebind(comm, order, address)


def _connect(address: str, end: float) -> Communicator:
    server, client = tls_from_env()
    comm = Communicator(address, ssl=client, ssl_server=server)
    try:
        comm.connect(timeout=_left(end))
    except BaseException:
        comm.close()
        raise
    return comm


def _agree(comm: Communicator, uuid: int, handles: list[Handle], rank: int,
           end: float) -> list[int]:
    """The peer ids in rank order, once the peer group is the handles' processes."""
    size = len(handles)
    while True:
        comm.wait_for_peers(size, timeout=_left(end))
        members = tuple(comm.ranks)
        if len(members) != size:  # (a lost peer the master has not dropped yet)
            time.sleep(POLL)  # (the master's news arrive on the communicator's loop)
            _left(end)
            continue
        mine = np.array([int(uuid) & _MASK, rank, handles[rank].check], dtype=np.int64)
        table = np.empty(3 * size, dtype=np.int64)
        try:
            comm.all_gather_async(mine, table, tag=TAGS, ring=members).wait(_left(end))
        except PeerLostError:  # (MembershipChangedError too: a peer left meanwhile)
            _left(end)
            continue
        rows = table.reshape(size, 3).tolist()
        if {row[0] for row in rows} != {mine[0]}:
            raise InvalidUsageError(f"the ranks reconfigure with different uuids: "
                                    f"{sorted({row[0] for row in rows})}")
        if sorted(row[1] for row in rows) != list(range(size)) \
                or any(handles[r].check != check for _, r, check in rows):
            raise InvalidUsageError("the peer group's processes are not the handles' (a "
                                    "rank passed other handles, or a stranger joined)")
        order = [0] * size
        for member, (_, r, _) in zip(members, rows):
            order[r] = member
        return order


def _left(end: float) -> float:
    left = end - time.monotonic()
    if left <= 0:
        raise PcclTimeoutError("reconfigure: the peer group did not become the handles' "
                               "processes in time")
    return left
