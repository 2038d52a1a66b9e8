"""The exception tree of pccl_aio.

::

    PcclError                                   base of everything pccl_aio raises
    ├── InvalidUsageError(PcclError, ValueError) bad argument or call order (raised before I/O)
    │   └── DeadlockError                        the peers' calls wait on each other
    ├── MasterConnectionError(PcclError, ConnectionError)
    │   └── VersionMismatchError                 master speaks another protocol version
    ├── PeerLostError(PcclError, ConnectionError) a collective was aborted: a peer left; retry
    │   ├── MasterLostError                        the master was lost meanwhile; retry
    │   └── MembershipChangedError                 the group is not the one the caller sized
    ├── TooFewPeersError(PcclError)               fewer than two peers in the peer group
    ├── KickedError(PcclError)                    the master closed our session
    ├── SharedStateError(PcclError)               shared-state sync could not complete
    ├── PcclTimeoutError(PcclError, TimeoutError) a protocol deadline passed
    └── ProtocolError(PcclError)                  a frame or message broke the protocol
        └── RemoteProtocolError                   the other side sent garbage

Each class names the PCCL result code it corresponds to in ``code``.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthenticationError",
    "DeadlockError",
    "InvalidUsageError",
    "KickedError",
    "MasterConnectionError",
    "MasterLostError",
    "MembershipChangedError",
    "PcclError",
    "PcclTimeoutError",
    "PeerLostError",
    "ProtocolError",
    "RemoteProtocolError",
    "SharedStateError",
    "TooFewPeersError",
    "VersionMismatchError",
]


class PcclError(Exception):
    """Base class of every exception raised by pccl_aio."""

    code: ClassVar[str] = "INTERNAL_ERROR"


class InvalidUsageError(PcclError, ValueError):
    """A wrong argument or a call in the wrong state; nothing was sent."""

    code = "INVALID_USAGE"


class DeadlockError(InvalidUsageError):
    """The peers of a group wait on each other and none can go on (different tags, different
    votes): the master failed every blocked call at once. The message says which peer waits
    on what. Nothing ran; the communicator stays usable."""

    code = "INVALID_USAGE"


class MasterConnectionError(PcclError, ConnectionError):
    """The master could not be reached, or the connection to it was lost."""

    code = "MASTER_CONNECTION_FAILED"


class AuthenticationError(MasterConnectionError):
    """The master refused this peer's run secret or TLS (or could not prove its own)."""

    code = "AUTHENTICATION_FAILED"


class VersionMismatchError(MasterConnectionError):
    """The master speaks another protocol version; retrying will not help."""


class PeerLostError(PcclError, ConnectionError):
    """A collective in flight was aborted (a peer left or failed, a data link broke or
    stalled, or a peer cancelled it); retry it.

    An in-place input buffer has been restored bit-exactly. When the master saw a peer leave
    first, the survivors' world sizes are already updated; a broken data link can be reported
    before the departure, so read the group's size from the retry's ``ReduceInfo``.
    """

    code = "RANK_CONNECTION_LOST"


class MasterLostError(PeerLostError):
    """The master was lost while this call waited; retry it.

    The communicator keeps its state and links and rejoins the run on its own (its master
    address, or the next one given) for up to ``master_timeout``; a retried call waits for
    that. An all-reduce's in-place input has been restored; a collective that finished its
    data on every peer is not failed but completed by the next master. After
    ``master_timeout`` calls raise ``MasterConnectionError`` instead.

    Retry the call that raised, not the step around it: the other peers may have had the
    answers this peer missed, and they go on from there. ``new_member`` True: this peer's
    membership did not survive the outage (its master stepped down, or the rebuilt run went
    on without it) and it rejoined as a new member, admitted by the others' next
    ``update_topology()``: go on as a peer that has just connected does (sync the shared
    state first), not with the retry.
    """

    def __init__(self, *args: object, new_member: bool = False) -> None:
        super().__init__(*args)
        self.new_member = new_member


class MembershipChangedError(PeerLostError):
    """The peer group's membership is no longer the one the caller's work was sized by (a
    ``pccl_aio.torch`` process group's ranks and size, a collective's ``ring=``): a peer was
    lost or admitted since, or this peer rejoined the run as a new member. The collective
    failed on every peer of its attempt (here with this error, on a peer that learnt of the
    change later with ``PeerLostError``); a retry fails alike. Take the new membership first
    (``pccl_aio.torch.renew_process_group()``, then build DDP again on it)."""


class TooFewPeersError(PcclError):
    """The peer group has fewer than two peers, so no collective can run."""

    code = "TOO_FEW_PEERS"


class KickedError(PcclError):
    """The master ended this peer's session (protocol violation or shared-state mismatch)."""

    code = "UPDATE_TOPOLOGY_FAILED"


class SharedStateError(PcclError):
    """Shared-state synchronisation failed (no distributor, or a hash mismatch)."""

    code = "NO_SHARED_STATE_AVAILABLE"


class PcclTimeoutError(PcclError, TimeoutError):
    """A protocol deadline (heartbeat, data plane, connect) passed."""

    code = "RANK_CONNECTION_LOST"


class ProtocolError(PcclError):
    """A frame or message broke the wire protocol."""

    code = "INTERNAL_ERROR"


class RemoteProtocolError(ProtocolError):
    """The other side sent a malformed, oversized or illegal frame or message."""
