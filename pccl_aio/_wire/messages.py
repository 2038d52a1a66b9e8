"""Every control-plane wire message, as msgspec Structs in tagged unions per direction.

Schema rules (msgspec schema evolution): never reorder fields, append new fields only with
defaults, never reuse a tag. Tag ranges name the direction: 1-63 peer->master,
64-127 master->peer. Tensor payloads never pass through msgspec (see ``_dataplane``).
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import msgspec

from .._errors import RemoteProtocolError

PROTOCOL_VERSION: Final = 1


class _Msg(msgspec.Struct, array_like=True, frozen=True, gc=False, tag_field="t"):
    """Base of every wire message."""


# ---- peer -> master ------------------------------------------------------------------------
class Hello(_Msg, frozen=True, tag=1):
    """First message of a session; the master refuses another protocol ``version``."""

    version: int
    peer_group: int
    p2p_port: int
    advertise_host: str = ""
    state_port: int = 0


class Heartbeat(_Msg, frozen=True, tag=2):
    """Liveness beacon, sent both ways every heartbeat interval."""


class VoteUpdateTopology(_Msg, frozen=True, tag=3):
    """Joint vote of all accepted peers: admit the pending peers."""


class VotePeersPending(_Msg, frozen=True, tag=4):
    """Joint vote of all accepted peers: are any peers waiting to be admitted?"""


class CollectiveInit(_Msg, frozen=True, tag=5):
    """Vote to start the collective ``tag`` in this peer's group with this descriptor."""

    tag: int
    count: int
    dtype: int
    op: int
    quant_algo: int = 0
    quant_dtype: int = 0


class CollectiveDone(_Msg, frozen=True, tag=6):
    """This peer finished its part of collective (tag, seq); ``ok`` False reports a failure."""

    tag: int
    seq: int
    ok: bool
    reason: str = ""


class Leave(_Msg, frozen=True, tag=7):
    """Graceful goodbye; the master then treats the peer as gone."""


class SyncEntry(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One shared-state entry as voted: xxh3-128 ``hash`` of its bytes (empty if not compared)."""

    key: str
    dtype: int
    nbytes: int
    hash: bytes
    allow_inequality: bool = False


class VoteSync(_Msg, frozen=True, tag=8):
    """Vote to synchronise the group's shared state; ``fresh``: never synced by this peer."""

    revision: int
    strategy: int
    entries: list[SyncEntry]
    fresh: bool = False


class SyncDone(_Msg, frozen=True, tag=9):
    """This peer finished its part of the sync (served or fetched); ``ok`` False if it failed."""

    ok: bool
    reason: str = ""


class CollectiveWait(_Msg, frozen=True, tag=11):
    """The caller now waits on collective ``tag``, which this peer launched (``CollectiveInit``)
    and the master has not started yet; sent at most once per attempt. Lets the master tell a
    peer that is blocked from one that is computing (deadlock detection)."""

    tag: int


class WithdrawVote(_Msg, frozen=True, tag=10):
    """The caller stopped waiting on its ``update_topology`` ("topology") or
    ``are_peers_pending`` ("pending") vote: take it back (ignored if the vote already ended)."""

    kind: Literal["topology", "pending"]


# ---- master -> peer ------------------------------------------------------------------------
class PeerAddr(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Where a peer's data-plane listener is."""

    peer_id: int
    host: str
    port: int
    state_port: int = 0


class Welcome(_Msg, frozen=True, tag=64):
    """Registration accepted; ``accepted`` False means: wait for the others' update_topology."""

    peer_id: int
    accepted: bool
    version: int = PROTOCOL_VERSION


class Rejected(_Msg, frozen=True, tag=65):
    """Registration refused (e.g. protocol version mismatch); the master closes the connection."""

    reason: str
    version: int = PROTOCOL_VERSION


class Membership(_Msg, frozen=True, tag=66):
    """The run's membership as of ``epoch``; ``ring`` is this peer's group in ring order."""

    epoch: int
    global_world_size: int
    num_groups: int
    largest_group_world_size: int
    ring: list[PeerAddr]


class TopologyUpdated(_Msg, frozen=True, tag=67):
    """Answer to VoteUpdateTopology, sent after the new Membership."""

    epoch: int


class PeersPendingAnswer(_Msg, frozen=True, tag=68):
    """Answer to VotePeersPending."""

    pending: bool


class CollectiveStart(_Msg, frozen=True, tag=69):
    """All group peers voted for ``tag`` with one descriptor: run it as ``seq`` on ring ``epoch``."""

    tag: int
    seq: int
    epoch: int


class CollectiveComplete(_Msg, frozen=True, tag=70):
    """Every participant reported success: the result of (tag, seq) stands."""

    tag: int
    seq: int


class CollectiveAbort(_Msg, frozen=True, tag=71):
    """Collective ``tag`` (``seq`` 0 if it never started) was aborted; the caller may retry."""

    tag: int
    seq: int
    reason: str


class CollectiveRejected(_Msg, frozen=True, tag=72):
    """The group's peers disagreed on the descriptor of ``tag``, or (``deadlock``) it could
    never start because the peers wait on each other; nothing ran."""

    tag: int
    reason: str
    deadlock: bool = False


class Kicked(_Msg, frozen=True, tag=73):
    """The master ends this session (protocol violation); the connection closes next."""

    reason: str


class MasterHeartbeat(_Msg, frozen=True, tag=74):
    """Liveness beacon of the master."""


class SyncPlan(_Msg, frozen=True, tag=76):
    """Result of the election: adopt ``revision``; fetch ``keys`` (verify ``hashes``) from ``sources``."""

    revision: int
    keys: list[str]
    hashes: list[bytes]
    sources: list[PeerAddr]


class SyncComplete(_Msg, frozen=True, tag=77):
    """Every peer of the group finished the sync."""

    revision: int


class SyncFailed(_Msg, frozen=True, tag=78):
    """The group's sync could not run (e.g. no up-to-date peer); nothing was changed."""

    reason: str


class VoteRejected(_Msg, frozen=True, tag=75):
    """A vote of kind ``kind`` ("topology", "pending", "sync") was withdrawn: other peers are
    in another phase; ``deadlock``: the peers wait on each other and none can go on."""

    kind: str
    reason: str
    deadlock: bool = False


PeerToMaster: TypeAlias = (
    Hello | Heartbeat | VoteUpdateTopology | VotePeersPending | CollectiveInit | CollectiveDone
    | Leave | VoteSync | SyncDone | WithdrawVote | CollectiveWait
)
MasterToPeer: TypeAlias = (
    Welcome | Rejected | Membership | TopologyUpdated | PeersPendingAnswer | CollectiveStart
    | CollectiveComplete | CollectiveAbort | CollectiveRejected | Kicked | MasterHeartbeat
    | VoteRejected | SyncPlan | SyncComplete | SyncFailed
)

_ENCODER: Final = msgspec.msgpack.Encoder()
_P2M: Final = msgspec.msgpack.Decoder(PeerToMaster)
_M2P: Final = msgspec.msgpack.Decoder(MasterToPeer)


# msgspec raises more than DecodeError on hostile input: invalid UTF-8 in a str field and
# deeply nested arrays surface as UnicodeDecodeError / RecursionError.
_DECODE_ERRORS: Final = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def encode(msg: _Msg) -> bytes:
    """Encode one message body (without the frame's length prefix)."""
    return _ENCODER.encode(msg)


def decode_peer_to_master(buf: bytes | memoryview) -> PeerToMaster:
    """Decode a peer->master body; raises RemoteProtocolError on anything malformed."""
    try:
        msg: PeerToMaster = _P2M.decode(buf)
        return msg
    except _DECODE_ERRORS as exc:
        raise RemoteProtocolError(f"bad peer->master message: {exc}") from exc


def decode_master_to_peer(buf: bytes | memoryview) -> MasterToPeer:
    """Decode a master->peer body; raises RemoteProtocolError on anything malformed."""
    try:
        reply: MasterToPeer = _M2P.decode(buf)
        return reply
    except _DECODE_ERRORS as exc:
        raise RemoteProtocolError(f"bad master->peer message: {exc}") from exc


def peek_hello_version(buf: bytes | memoryview) -> int | None:
    """The protocol version inside a Hello body this version cannot decode, else None.

    Lets the master refuse a peer of another version with a clear reason even when the
    Hello's schema changed.
    """
    try:
        raw = msgspec.msgpack.decode(buf)
    except _DECODE_ERRORS:
        return None
    if (isinstance(raw, list) and len(raw) >= 2 and raw[0] == 1 and type(raw[1]) is int):
        return raw[1]
    return None
