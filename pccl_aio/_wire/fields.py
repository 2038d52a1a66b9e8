"""The field types and limits of the control-plane messages (``messages.py``).

Every field with a closed set of values or a range is a constrained type here (msgspec
``Meta``, checked when decoding only); the rules that span fields are ``messages._check``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Annotated, Final, Literal, TypeAlias

import msgspec

from .._types import (
    MIN_MAX_ONLY,
    QUANTIZED_DTYPES,
    TENSOR_DTYPES,
    CollectiveKind,
    DataType,
    QuantAlgo,
    ReduceOp,
    SyncStrategy,
)
from .state import MAX_KEY

#: 2: tickets (``CollectiveComplete.next_seq``, early starts), ``optimize_topology``'s messages
#: and the uint4 quantization code; 3: master failover (``recovery.py``: rejoins, probes,
#: terms); 4: ``PeersWaiting`` (``wait_for_peers``), and an ``update_topology()`` round that
#: admits nobody changes no epoch; 5: membership seals, and a collective's ``kind`` (barrier);
#: 6: broadcast, all-gather and reduce-scatter (``CollectiveInit.root`` and ``.epoch``); 7: a
#: member's pair keys wrapped with one pad stream per ring (``auth.wrap``).
#: A master refuses peers of another version.
PROTOCOL_VERSION: Final = 7

#: The public call behind each kind of vote, for messages on both sides of the wire.
VOTE_CALLS: Final = {"topology": "update_topology()", "pending": "are_peers_pending()",
                     "sync": "sync_shared_state()", "optimize": "optimize_topology()"}
#: The kinds of vote a caller can take back (``WithdrawVote``) and the master can reject.
VoteKind: TypeAlias = Literal["topology", "pending", "sync", "optimize"]


def _codes(cls: type[enum.IntEnum], members: Iterable[enum.IntEnum] | None = None
           ) -> msgspec.Meta:
    """The range of an enum's wire values (or of some ``members``), which must be
    contiguous: membership as a range."""
    values = sorted(int(x) for x in (cls if members is None else members))
    if values != list(range(values[0], values[-1] + 1)):
        raise TypeError(f"{cls.__name__}'s values are not contiguous")
    return msgspec.Meta(ge=values[0], le=values[-1])


#: Non-negative; msgpack carries no integer above 2**64 - 1 (a tag, an element count).
U64: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]
#: Non-negative, below 2**63: a peer id, term, epoch, seq, round or revision. Whatever a peer
#: claims stays there, so the master's increments and its ids above every id seen never
#: leave 64 bits (one ``Rejoin`` with ring [2**64 - 1] made every later id unencodable).
U63: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
U32: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
Port: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=65535)]
#: A port or 0 (none).
OptPort: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=65535)]
#: A tensor's dtype (every DataType but UINT4, the last one: a quantization code only).
DType: TypeAlias = Annotated[int, _codes(DataType, TENSOR_DTYPES)]
#: A quantized dtype, 0 for none; which ones are allowed is checked by ``_check``.
QDType: TypeAlias = Annotated[int, _codes(DataType)]
Op: TypeAlias = Annotated[int, _codes(ReduceOp)]
Kind: TypeAlias = Annotated[int, _codes(CollectiveKind)]
Algo: TypeAlias = Annotated[int, _codes(QuantAlgo)]
Strategy: TypeAlias = Annotated[int, _codes(SyncStrategy)]
#: An xxh3-128 digest (16 bytes), or empty; the length is checked by ``_check``.
Hash: TypeAlias = Annotated[bytes, msgspec.Meta(max_length=16)]
HASH_SIZE: Final = 16
#: A wrapped pair key (``_wire/auth.py``): 32 bytes, or empty in a run without a secret.
Key: TypeAlias = Annotated[bytes, msgspec.Meta(max_length=32)]
QDTYPES: Final = frozenset(int(d) for d in QUANTIZED_DTYPES)
MIN_MAX_ONLY_CODES: Final = frozenset(int(d) for d in MIN_MAX_ONLY)
#: Caps on what a peer sends the master (so a frame cannot make it hold more): a host name
#: (DNS: 253 characters), a shared-state key (``_wire/state.py``'s MAX_KEY), a failure reason,
#: the entries of a sync vote.
HostName: TypeAlias = Annotated[str, msgspec.Meta(max_length=253)]
StateKey: TypeAlias = Annotated[str, msgspec.Meta(max_length=MAX_KEY)]
Reason: TypeAlias = Annotated[str, msgspec.Meta(max_length=1024)]
#: A replica's name ("" for none) and its number of processes (``Hello``).
ReplicaName: TypeAlias = Annotated[str, msgspec.Meta(max_length=128)]
ReplicaSize: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=1024)]
MAX_SYNC_ENTRIES: Final = 1 << 20
MAX_EVICTED: Final = 64
#: A measured link (``optimize_topology``): bits/s up to 10 Tbit/s (0: unreachable), one-way
#: latency up to 60 s; a measurement lasts at most ``MAX_MEASURE_SECONDS`` on at most
#: ``MAX_MEASURE_STREAMS`` streams (receivers enforce both).
BitsPerS: TypeAlias = Annotated[float, msgspec.Meta(ge=0.0, le=1e13)]
Latency: TypeAlias = Annotated[float, msgspec.Meta(ge=0.0, le=60.0)]
MAX_MEASURE_SECONDS: Final = 5.0
MAX_MEASURE_STREAMS: Final = 16
MeasureSeconds: TypeAlias = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_MEASURE_SECONDS)]
MeasureStreams: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=MAX_MEASURE_STREAMS)]
