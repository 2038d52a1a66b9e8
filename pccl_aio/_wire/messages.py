"""The control-plane wire messages, as msgspec Structs in tagged unions per direction.

A collective's messages (``collective.py``) and fail-over's (``recovery.py``) live in their
own modules; this one re-exports them and holds the unions, so ``m.Name`` names every message.
Schema rules (msgspec schema evolution): never reorder fields, append new fields only with
defaults, never reuse a tag. Tag ranges name the direction: 1-63 peer->master,
64-127 master->peer. Tensor payloads never pass through msgspec (their frames: ``data.py``).

Validation at decode: every field with a closed set of values or a range is constrained
(msgspec ``Meta`` on the field types of ``fields.py``, checked only when decoding;
constructing a message checks nothing), and ``_check`` adds the rules that span fields. A
message that fails is a RemoteProtocolError naming the field.
"""

from __future__ import annotations

from typing import Annotated, Final, TypeAlias

import msgspec

from .._errors import RemoteProtocolError
from .._types import QuantAlgo
from .base import Msg, Record
from .explain import DECODE_ERRORS, explain
from .explain import peek_hello_version as peek_hello_version
from .recovery import Doubt as Doubt, Probe as Probe, ProbeAnswer as ProbeAnswer
from .recovery import Rejoin as Rejoin, Round as Round, RunId as RunId
from .recovery import Superseded as Superseded
from .collective import CollectiveAbort as CollectiveAbort, CollectiveDone as CollectiveDone
from .collective import CollectiveComplete as CollectiveComplete
from .collective import CollectiveInit as CollectiveInit, CollectiveStart as CollectiveStart
from .collective import kind_error
from .collective import CollectiveRejected as CollectiveRejected
from .collective import CollectiveWait as CollectiveWait

# The field types and limits, re-exported (``m.U64``, ``m.PROTOCOL_VERSION``, ...).
from .fields import (
    PROTOCOL_VERSION as PROTOCOL_VERSION,
    VOTE_CALLS as VOTE_CALLS,
    VoteKind as VoteKind,
    U63 as U63,
    U64 as U64,
    U32 as U32,
    Port as Port,
    OptPort as OptPort,
    DType as DType,
    QDType as QDType,
    Op as Op,
    Algo as Algo,
    Strategy as Strategy,
    Hash as Hash,
    HASH_SIZE as HASH_SIZE,
    Key as Key,
    QDTYPES as QDTYPES,
    MIN_MAX_ONLY_CODES as MIN_MAX_ONLY_CODES,
    HostName as HostName,
    ReplicaName as ReplicaName,
    ReplicaSize as ReplicaSize,
    StateKey as StateKey,
    Reason as Reason,
    MAX_SYNC_ENTRIES as MAX_SYNC_ENTRIES,
    MAX_EVICTED as MAX_EVICTED,
    BitsPerS as BitsPerS,
    Latency as Latency,
    MAX_MEASURE_SECONDS as MAX_MEASURE_SECONDS,
    MAX_MEASURE_STREAMS as MAX_MEASURE_STREAMS,
    MeasureSeconds as MeasureSeconds,
    MeasureStreams as MeasureStreams,
)


# ---- peer -> master ------------------------------------------------------------------------
class Hello(Msg, frozen=True, tag=1):
    """First message of a session; the master refuses another protocol ``version``. ``tls``:
    this peer's listeners speak TLS (all peers of a run must agree). ``run_id``: the run this
    peer belongs to ("" for any); ``term``: the highest master term it followed; ``rejoin``:
    who it was under its previous master (``recovery.Rejoin``), None for a new peer;
    ``replica``, ``replica_size``: the replica this process is one of ("": none) and how many
    processes it has (they are admitted together)."""

    version: U32
    peer_group: U32
    p2p_port: Port
    advertise_host: HostName = ""
    state_port: OptPort = 0
    tls: bool = False
    run_id: RunId = ""
    term: U63 = 0
    rejoin: Rejoin | None = None
    replica: ReplicaName = ""
    replica_size: ReplicaSize = 1


class Heartbeat(Msg, frozen=True, tag=2):
    """Liveness beacon, sent both ways every heartbeat interval."""


class VoteUpdateTopology(Msg, frozen=True, tag=3):
    """Joint vote of all accepted peers: admit the pending peers."""


class VotePeersPending(Msg, frozen=True, tag=4):
    """Joint vote of all accepted peers: are any peers waiting to be admitted?"""


class Leave(Msg, frozen=True, tag=7):
    """Graceful goodbye; the master then treats the peer as gone."""


class SyncEntry(Record, frozen=True):
    """One shared-state entry as voted: xxh3-128 ``hash`` of its bytes (empty if not compared)."""

    key: StateKey
    dtype: DType
    nbytes: U64
    hash: Hash
    allow_inequality: bool = False


class VoteSync(Msg, frozen=True, tag=8):
    """Vote to synchronise the group's shared state; ``fresh``: never synced by this peer."""

    revision: U63
    strategy: Strategy
    entries: Annotated[list[SyncEntry], msgspec.Meta(max_length=MAX_SYNC_ENTRIES)]
    fresh: bool = False


class SyncDone(Msg, frozen=True, tag=9):
    """This peer finished its part of the sync (served or fetched); ``ok`` False if it failed."""

    ok: bool
    reason: Reason = ""


class WithdrawVote(Msg, frozen=True, tag=10):
    """The caller stopped waiting on its ``update_topology`` ("topology"),
    ``are_peers_pending`` ("pending"), ``sync_shared_state`` ("sync") or
    ``optimize_topology`` ("optimize") vote: take it back (a sync it already takes part in
    counts as failed; an optimize that is measuring ends for the group). Always answered by
    ``VoteWithdrawn``."""

    kind: VoteKind


class VoteOptimize(Msg, frozen=True, tag=12):
    """Joint vote of the group's accepted peers: measure the links that lack a measurement,
    then order the group's ring to fit them (``optimize_topology``)."""


class MeasureReport(Msg, frozen=True, tag=13):
    """The measurement ``MeasurePlan(round)`` asked for: this peer -> ``to``, ``bits_per_s``
    (0: unreachable) and one-way ``latency`` in seconds."""

    round: U63
    to: U63
    bits_per_s: BitsPerS
    latency: Latency


# ---- master -> peer ------------------------------------------------------------------------
class PeerAddr(Record, frozen=True):
    """Where a peer's data-plane listener is."""

    peer_id: U63
    host: str
    port: Port
    state_port: OptPort = 0


class Welcome(Msg, frozen=True, tag=64):
    """Registration accepted; ``accepted`` False means: wait for the others' update_topology.
    ``term`` and ``run_id``: the master's (a peer follows terms upwards only); ``rebuild``:
    this rejoining peer takes part in the run's rebuild as a member (else it is a joiner)."""

    peer_id: U63
    accepted: bool
    version: U32 = PROTOCOL_VERSION
    term: U63 = 0
    run_id: RunId = ""
    rebuild: bool = False


class Rejected(Msg, frozen=True, tag=65):
    """Registration refused (e.g. protocol version mismatch); the master closes the connection."""

    reason: str
    version: U32 = PROTOCOL_VERSION


class Membership(Msg, frozen=True, tag=66):
    """The run's membership as of ``epoch``; ``ring`` is this peer's group in ring order.
    In a run with a secret, ``keys[i]`` is the key this peer shares with ``ring[i]``,
    wrapped for this peer's master session (``auth.unwrap``); else ``keys`` is empty.
    ``term``: the master's term (the same for every member of the run); the rounds: how many
    joint votes of each kind the run had answered (a rejoining peer reports them); ``seal``:
    with a master secret, the master's proof of this peer's place (``auth.seal``), which it
    shows a restarted master in its ``Rejoin``."""

    epoch: U63
    global_world_size: U63
    num_groups: U63
    largest_group_world_size: U63
    ring: list[PeerAddr]
    keys: list[Key] = []
    term: U63 = 0
    pending_round: U63 = 0
    topology_round: U63 = 0
    seal: Key = b""


class TopologyUpdated(Msg, frozen=True, tag=67):
    """Answer to VoteUpdateTopology, sent after the new Membership; ``round``: the run's
    count of update_topology rounds (a rejoining peer reports the last it saw)."""

    epoch: U63
    round: U63 = 0


class PeersPendingAnswer(Msg, frozen=True, tag=68):
    """Answer to VotePeersPending; ``round``: the run's count of such rounds."""

    pending: bool
    round: U63 = 0


class PeersWaiting(Msg, frozen=True, tag=84):
    """Sent to every member when a batch of joiners becomes due for admission (``waiting``:
    an ``are_peers_pending()`` vote now would answer True) and when that stops being so;
    ``wait_for_peers`` waits on it instead of polling. A new member gets the current value."""

    waiting: bool


class Kicked(Msg, frozen=True, tag=73):
    """The master ends this session (protocol violation); the connection closes next."""

    reason: str


class MasterHeartbeat(Msg, frozen=True, tag=74):
    """Liveness beacon of the master."""


class SyncPlan(Msg, frozen=True, tag=76):
    """Result of the election: adopt ``revision``; fetch ``keys`` (verify ``hashes``, one per
    key) from ``sources``. ``fetchers`` are the peers that fetch: a source serves them only.
    ``kicked``: "peer N was kicked: why" for each voter this election kicked."""

    revision: U63
    keys: list[str]
    hashes: list[Hash]
    sources: list[PeerAddr]
    fetchers: list[U63] = []
    kicked: list[str] = []


class SyncComplete(Msg, frozen=True, tag=77):
    """Every peer of the group finished the sync."""

    revision: U63


class SyncFailed(Msg, frozen=True, tag=78):
    """The group's sync could not run (e.g. no up-to-date peer; nothing was changed), or a
    participant's fetch failed (``completed``: sent instead of ``SyncComplete``; every peer
    retries)."""

    reason: str
    completed: bool = False


class VoteWithdrawn(Msg, frozen=True, tag=79):
    """The master handled this peer's ``WithdrawVote(kind)``: answers of that kind sent before
    this one belong to the withdrawn vote, the ones after it to a new vote."""

    kind: VoteKind


class MeasurePlan(Msg, frozen=True, tag=80):
    """Measure the link from this peer to ``to`` now: ``streams`` connections for
    ``seconds``, then answer ``MeasureReport(round, ...)``. In one round every peer sends to
    at most one peer and receives from at most one."""

    round: U63
    to: PeerAddr
    seconds: MeasureSeconds
    streams: MeasureStreams


class TopologyOptimized(Msg, frozen=True, tag=81):
    """Answer to ``VoteOptimize``, sent after the new ``Membership`` (``epoch``): the group's
    ``ring`` (peer ids), the ordered pairs measured for this vote, the ring's slowest link."""

    epoch: U63
    ring: list[U63]
    measured: U63
    bottleneck_bps: BitsPerS


class VoteRejected(Msg, frozen=True, tag=75):
    """A vote of kind ``kind`` ("topology", "pending", "sync", "optimize") was withdrawn:
    other peers are in another phase; ``deadlock``: the peers wait on each other and none can
    go on. For "optimize" also: no ring avoids the unreachable pairs, or a member gave up."""

    kind: VoteKind
    reason: str
    deadlock: bool = False


PeerToMaster: TypeAlias = (
    Hello | Heartbeat | VoteUpdateTopology | VotePeersPending | CollectiveInit | CollectiveDone
    | Leave | VoteSync | SyncDone | WithdrawVote | CollectiveWait | VoteOptimize | MeasureReport
    | Probe
)
MasterToPeer: TypeAlias = (
    Welcome | Rejected | Membership | TopologyUpdated | PeersPendingAnswer | CollectiveStart
    | CollectiveComplete | CollectiveAbort | CollectiveRejected | Kicked | MasterHeartbeat
    | VoteRejected | SyncPlan | SyncComplete | SyncFailed | VoteWithdrawn | MeasurePlan
    | TopologyOptimized | ProbeAnswer | Superseded | PeersWaiting
)

_ENCODER: Final = msgspec.msgpack.Encoder()
_P2M: Final = msgspec.msgpack.Decoder(PeerToMaster)
_M2P: Final = msgspec.msgpack.Decoder(MasterToPeer)


_BY_TAG: Final = {c.__struct_config__.tag: c for c in (*PeerToMaster.__args__,
                                                       *MasterToPeer.__args__)}


def encode(msg: msgspec.Struct) -> bytes:
    """Encode one message body (without the frame's length prefix)."""
    return _ENCODER.encode(msg)


def decode_peer_to_master(buf: bytes | memoryview) -> PeerToMaster:
    """Decode a peer->master body; raises RemoteProtocolError on anything malformed or out of
    range."""
    try:
        msg: PeerToMaster = _P2M.decode(buf)
    except DECODE_ERRORS as exc:
        why = explain(buf, exc, _BY_TAG)
        raise RemoteProtocolError(f"bad peer->master message: {why}") from exc
    if type(msg) in _CHECKED:
        _check(msg, "peer->master")
    return msg


def decode_master_to_peer(buf: bytes | memoryview) -> MasterToPeer:
    """Decode a master->peer body; raises RemoteProtocolError on anything malformed or out of
    range."""
    try:
        reply: MasterToPeer = _M2P.decode(buf)
    except DECODE_ERRORS as exc:
        why = explain(buf, exc, _BY_TAG)
        raise RemoteProtocolError(f"bad master->peer message: {why}") from exc
    if type(reply) in _CHECKED:
        _check(reply, "master->peer")
    return reply


def _check(msg: msgspec.Struct, direction: str) -> None:
    """The rules that span fields (or a set msgspec cannot express)."""
    bad = ""
    if isinstance(msg, CollectiveInit):
        if msg.quant_algo == QuantAlgo.NONE and msg.quant_dtype != 0:
            bad = f"CollectiveInit.quant_dtype: {msg.quant_dtype} without quantization (must be 0)"
        elif msg.quant_dtype not in QDTYPES:
            bad = f"CollectiveInit.quant_dtype: {msg.quant_dtype} is not uint8, uint16 or uint4"
        elif msg.quant_dtype in MIN_MAX_ONLY_CODES and msg.quant_algo != QuantAlgo.MIN_MAX:
            bad = (f"CollectiveInit.quant_dtype: {msg.quant_dtype} (uint4) needs MIN_MAX, "
                   f"not algorithm {msg.quant_algo}")
        else:
            bad = kind_error(msg)
    elif isinstance(msg, VoteSync):
        for i, e in enumerate(msg.entries):
            if len(e.hash) not in (0, HASH_SIZE):
                bad = f"VoteSync.entries[{i}].hash: {len(e.hash)} bytes (must be 0 or 16)"
                break
    elif isinstance(msg, SyncPlan):
        if len(msg.keys) != len(msg.hashes):
            bad = f"SyncPlan: {len(msg.keys)} keys but {len(msg.hashes)} hashes"
        elif any(len(h) not in (0, HASH_SIZE) for h in msg.hashes):
            bad = "SyncPlan.hashes: a hash is neither 0 nor 16 bytes long"
    elif isinstance(msg, Hello):
        if msg.replica_size > 1 and not msg.replica:
            bad = f"Hello.replica_size: {msg.replica_size} without a replica name"
    elif isinstance(msg, Membership) and msg.keys and (
            len(msg.keys) != len(msg.ring) or any(len(k) != 32 for k in msg.keys)):
        bad = f"Membership.keys: {len(msg.keys)} keys for {len(msg.ring)} peers (or not 32 bytes)"
    if bad:
        raise RemoteProtocolError(f"bad {direction} message: {bad}")


_CHECKED: Final = frozenset({CollectiveInit, VoteSync, SyncPlan, Membership, Hello})
