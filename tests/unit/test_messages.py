"""Control-plane wire messages (``_messages``) and their length-prefixed framing (``_framing``)."""

from __future__ import annotations

import asyncio
import itertools
import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pccl_aio._errors import ProtocolError, RemoteProtocolError
from pccl_aio._net.stream import read_frame
from pccl_aio._wire import framing as fr
from pccl_aio._wire import messages as m

PV = m.PROTOCOL_VERSION
enc = msgspec.msgpack.encode

PEER_TO_MASTER = [
    m.Hello(PV, 7, 4242, "10.1.2.3"),
    m.Hello(PV, 0, 1),
    m.Heartbeat(),
    m.VoteUpdateTopology(),
    m.VotePeersPending(),
    m.CollectiveInit(3, 1 << 40, 10, 4, 1, 2),
    m.CollectiveInit(0, 0, 0, 0),
    m.CollectiveDone(3, 17, True),
    m.CollectiveDone(2**31, 2**62, False, "socket closed \u2013 peer 3"),
    m.Leave(),
    m.VoteSync(3, 0, [m.SyncEntry("w", 10, 4096, b"\x01" * 16), m.SyncEntry("m", 9, 2, b"", True)]),
    m.VoteSync(0, 2, [], True),
    m.SyncDone(True),
    m.SyncDone(False, "source closed"),
    m.WithdrawVote("topology"),
    m.WithdrawVote("pending"),
    m.WithdrawVote("sync"),
    m.CollectiveWait(7),
    m.WithdrawVote("optimize"),
    m.VoteOptimize(),
    m.MeasureReport(3, 2, 4.9e8, 0.005),
    m.MeasureReport(1, 9, 0.0, 0.0),
    m.Probe(),
    m.Hello(PV, 2, 4242, "", 4243, False, "run-7", 3,
            m.Rejoin(9, True, 3, 41, [4, 9, 2], 1 << 40, 17,
                     [m.Doubt(0, 5, 99, True), m.Doubt(1, 0, 18, False)])),
    m.Hello(PV, 0, 1, term=1, rejoin=m.Rejoin(2, False, 1, 0, [], 0, -1)),
]
MASTER_TO_PEER = [
    m.Welcome(5, True),
    m.Welcome(6, False, PV + 3),
    m.Rejected("protocol version 9 is not supported"),
    m.Membership(3, 4, 2, 3, [m.PeerAddr(1, "127.0.0.1", 5000), m.PeerAddr(9, "::1", 65535)]),
    m.Membership(1, 0, 0, 0, []),
    m.TopologyUpdated(12),
    m.PeersPendingAnswer(True),
    m.PeersPendingAnswer(False),
    m.PeersWaiting(True),
    m.PeersWaiting(False),
    m.CollectiveStart(4, 99, 3),
    m.CollectiveComplete(4, 99),
    m.CollectiveAbort(4, 0, "too few peers"),
    m.CollectiveRejected(4, "peers disagree"),
    m.Kicked("second Hello"),
    m.MasterHeartbeat(),
    m.VoteRejected("topology", "peers disagree on the phase"),
    m.VoteRejected("sync", "deadlock: peer 1 waits in all_reduce(tag=3)", True),
    m.CollectiveRejected(4, "deadlock", True),
    m.SyncPlan(4, ["w"], [b"\x02" * 16], [m.PeerAddr(2, "127.0.0.1", 5000, 5001)]),
    m.SyncPlan(0, [], [], []),
    m.SyncComplete(4),
    m.SyncFailed("no up-to-date peer"),
    m.SyncFailed("a peer's fetch failed", True),
    m.VoteWithdrawn("topology"),
    m.MeasurePlan(3, m.PeerAddr(2, "10.204.0.2", 5000), 0.5, 4),
    m.TopologyOptimized(7, [1, 3, 2, 4], 12, 4.9e8),
    m.TopologyOptimized(8, [5], 0, 0.0),
    m.VoteRejected("optimize", "no ring avoids 1->2"),
    m.ProbeAnswer(0, "", 0),
    m.ProbeAnswer(4, "run-7", 3, True),
    m.Superseded(5, "a master of term 5 serves this run"),
    m.Welcome(3, False, PV, 4, "run-7"),
    m.Membership(2, 1, 1, 1, [m.PeerAddr(1, "h", 5)], [], 4),
]
P2M_CLASSES = {type(x) for x in PEER_TO_MASTER}
M2P_CLASSES = {type(x) for x in MASTER_TO_PEER}


def _tag(cls: type) -> int:
    return cls.__struct_config__.tag  # type: ignore[attr-defined, no-any-return]


def test_samples_cover_every_message_class() -> None:
    from pccl_aio._wire.base import Msg

    assert set(Msg.__subclasses__()) == P2M_CLASSES | M2P_CLASSES
    assert not P2M_CLASSES & M2P_CLASSES
    assert set(m.PeerToMaster.__args__) == P2M_CLASSES
    assert set(m.MasterToPeer.__args__) == M2P_CLASSES


def test_tags_are_unique_and_inside_their_direction_range() -> None:
    tags = [_tag(c) for c in P2M_CLASSES | M2P_CLASSES]
    assert len(tags) == len(set(tags))
    assert all(isinstance(t, int) for t in tags)
    assert all(1 <= _tag(c) <= 63 for c in P2M_CLASSES)
    assert all(64 <= _tag(c) <= 127 for c in M2P_CLASSES)


@pytest.mark.parametrize("msg", PEER_TO_MASTER, ids=lambda x: type(x).__name__)
def test_peer_to_master_roundtrip(msg: m.PeerToMaster) -> None:
    body = m.encode(msg)
    assert isinstance(body, bytes)
    out = m.decode_peer_to_master(body)
    assert type(out) is type(msg) and out == msg
    assert m.decode_peer_to_master(memoryview(body)) == msg
    with pytest.raises(RemoteProtocolError):
        m.decode_master_to_peer(body)


@pytest.mark.parametrize("msg", MASTER_TO_PEER, ids=lambda x: type(x).__name__)
def test_master_to_peer_roundtrip(msg: m.MasterToPeer) -> None:
    body = m.encode(msg)
    out = m.decode_master_to_peer(body)
    assert type(out) is type(msg) and out == msg
    assert m.decode_master_to_peer(memoryview(body)) == msg
    with pytest.raises(RemoteProtocolError):
        m.decode_peer_to_master(body)


def test_wire_layout_is_a_msgpack_array_led_by_the_tag() -> None:
    """The layout ``peek_hello_version`` and older/newer peers rely on."""
    assert m.encode(m.Hello(PV, 2, 3, "h")) == enc([1, PV, 2, 3, "h", 0, False, "", 0, None, "", 1])
    assert m.encode(m.Heartbeat()) == enc([2])
    assert m.encode(m.Membership(1, 1, 1, 1, [m.PeerAddr(4, "h", 5)])) == enc(
        [66, 1, 1, 1, 1, [[4, "h", 5, 0]], [], 0, 0, 0, b""])


def test_defaults_and_schema_evolution() -> None:
    assert m.Welcome(1, True).version == PV
    assert m.Rejected("r").version == PV
    # an older sender that does not know the appended, defaulted fields
    assert m.decode_peer_to_master(enc([1, PV, 0, 5000])) == m.Hello(PV, 0, 5000, "")
    assert m.decode_peer_to_master(enc([5, 1, 2, 3, 4])) == m.CollectiveInit(1, 2, 3, 4, 0, 0, 0,
                                                                             False)
    assert m.decode_peer_to_master(enc([6, 1, 2, True])) == m.CollectiveDone(1, 2, True, "")
    assert m.decode_master_to_peer(enc([64, 5, True])) == m.Welcome(5, True, PV)
    # a newer sender that appended fields
    assert m.decode_peer_to_master(enc([2, "future", 3])) == m.Heartbeat()
    assert m.decode_master_to_peer(enc([70, 1, 2, 0, 0, [], [9]])) == m.CollectiveComplete(1, 2)
    assert m.decode_master_to_peer(enc([70, 1, 2])) == m.CollectiveComplete(1, 2, 0, 0, [])


def test_messages_are_immutable() -> None:
    msg = m.CollectiveStart(1, 2, 3)
    with pytest.raises(AttributeError):
        msg.seq = 5  # type: ignore[misc]


@pytest.mark.parametrize("body", [
    b"",
    b"\xc1",  # never-used msgpack byte
    b"\x90",  # empty array: no tag
    b"\x92\x01",  # truncated
    enc({"t": 1, "version": PV}),
    enc(None),
    enc(5),
    enc("Hello"),
    enc([0]),
    enc([8]),  # unknown peer->master tag
    enc([200, 1]),
    enc([-1]),
    enc(["1", PV, 0, 5000]),
    enc([1, PV, 0]),  # missing a required field
    enc([1, "one", 0, 5000]),
    enc([1, PV, 0, 5000, 7]),  # advertise_host must be a str
    enc([1, PV, 0.5, 5000]),
    enc([5, 1, 2, 3, "sum"]),
    enc([6, 1, 2, 1]),  # ok must be a bool
    enc([64, 5, True]),  # master->peer on the peer->master decoder
    enc([74]),
])
def test_garbage_and_wrong_types_raise_remote_protocol_error(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        m.decode_peer_to_master(body)
    assert isinstance(info.value, ProtocolError)
    assert "peer->master" in str(info.value)


@pytest.mark.parametrize("body", [b"", b"\xc1", enc([1, PV, 0, 5000]), enc([63]), enc([128]),
                                  enc([66, 1, 1, 1, 1, [[1, "h"]]]), enc([71, 1, 2])])
def test_master_to_peer_decoder_rejects_garbage(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError, match="master->peer"):
        m.decode_master_to_peer(body)


# ---- peek_hello_version -------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "expected"), [
    (m.encode(m.Hello(PV, 0, 5000)), PV),
    (m.encode(m.Hello(PV + 1, 0, 5000)), PV + 1),
    (enc([1, 7]), 7),
    (enc([1, 0, {"a": "future"}, [1, 2], b"x"]), 0),
    (enc([1, PV + 41, "a new schema"]), PV + 41),
    (enc([2, 5]), None),  # not a Hello
    (enc([64, 5, True]), None),
    (enc([1]), None),
    (enc([1, "2"]), None),
    (enc([1, 2.0]), None),
    (enc([]), None),
    (enc({"t": 1, "version": 2}), None),
    (enc(1), None),
    (b"", None),
    (b"\xc1", None),
    (b"\x92\x01", None),
])
def test_peek_hello_version(body: bytes, expected: int | None) -> None:
    assert m.peek_hello_version(body) == expected
    assert m.peek_hello_version(memoryview(body)) == expected


@settings(report_multiple_bugs=False)
@given(st.binary(max_size=64))
def test_peek_hello_version_never_raises_on_random_bytes(data: bytes) -> None:
    out = m.peek_hello_version(data)
    assert out is None or isinstance(out, int)


BAD_UTF8 = b"\xa2\xff\xfe"  # a msgpack str of two bytes that are not UTF-8


def test_peek_hello_version_of_deeply_nested_garbage_is_none() -> None:
    assert m.peek_hello_version(b"\x91" * 100_000) is None


@pytest.mark.parametrize("body", [BAD_UTF8, b"\x93\x01\x01" + BAD_UTF8], ids=["str", "in-array"])
def test_peek_hello_version_of_invalid_utf8_is_none(body: bytes) -> None:
    assert m.peek_hello_version(body) is None


@pytest.mark.parametrize("body", [
    b"\x95\x01\x01\x00\xcd\x13\x88" + BAD_UTF8,  # Hello(1, 0, 5000, advertise_host=<bad>)
    b"\x95\x06\x01\x02\xc2" + BAD_UTF8,  # CollectiveDone(1, 2, False, reason=<bad>)
], ids=["Hello.advertise_host", "CollectiveDone.reason"])
def test_invalid_utf8_in_a_peer_to_master_str_field_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        m.decode_peer_to_master(body)


def test_invalid_utf8_in_a_master_to_peer_str_field_is_a_protocol_error() -> None:
    with pytest.raises(RemoteProtocolError):
        m.decode_master_to_peer(b"\x92\x49" + BAD_UTF8)  # Kicked(reason=<bad>)


def test_deeply_nested_trailing_element_is_a_protocol_error() -> None:
    with pytest.raises(RemoteProtocolError):
        m.decode_peer_to_master(b"\x92\x02" + b"\x91" * 100_000 + b"\x01")


def test_deeply_nested_trailing_element_is_a_protocol_error_master_to_peer() -> None:
    with pytest.raises(RemoteProtocolError):
        m.decode_master_to_peer(b"\x92\x4a" + b"\x91" * 100_000 + b"\x01")


# ---- framing ------------------------------------------------------------------------------------


def test_frame_prefixes_a_big_endian_length() -> None:
    assert fr.HEADER_SIZE == 4
    assert fr.frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert fr.frame(b"") == b"\x00\x00\x00\x00"
    assert fr.frame(b"x" * 258)[:4] == b"\x00\x00\x01\x02"


def test_body_length() -> None:
    assert fr.body_length(b"\x00\x00\x01\x02") == 258
    assert fr.body_length(struct.pack(">I", fr.MAX_FRAME_SIZE)) == fr.MAX_FRAME_SIZE
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        fr.body_length(struct.pack(">I", fr.MAX_FRAME_SIZE + 1))
    assert fr.body_length(struct.pack(">I", 10), max_size=10) == 10
    with pytest.raises(RemoteProtocolError):
        fr.body_length(struct.pack(">I", 11), max_size=10)
    with pytest.raises(RemoteProtocolError):
        fr.body_length(b"\xff\xff\xff\xff")


def _read_all(data: bytes, max_size: int = fr.MAX_FRAME_SIZE, *, chunks: list[int] = ()
              ) -> tuple[list[bytes], bytes | Exception]:
    """Feed ``data`` (cut at ``chunks``) and EOF to the production reader (``read_frame`` on an
    ``asyncio.StreamReader``); the frame bodies read, then the incomplete tail at EOF or the
    RemoteProtocolError that ends the stream."""

    async def run() -> tuple[list[bytes], bytes | Exception]:
        reader = asyncio.StreamReader()
        points = sorted({min(c, len(data)) for c in chunks} | {0, len(data)})
        for lo, hi in itertools.pairwise(points):
            reader.feed_data(data[lo:hi])
        reader.feed_eof()
        bodies: list[bytes] = []
        while True:
            try:
                bodies.append(await read_frame(reader, max_size))
            except asyncio.IncompleteReadError as exc:
                return bodies, exc.partial
            except RemoteProtocolError as exc:
                return bodies, exc

    return asyncio.run(run())


def test_reader_reads_frames_fed_byte_by_byte() -> None:
    data = fr.frame(b"hello") + fr.frame(b"") + fr.frame(b"w")
    assert _read_all(data, chunks=list(range(len(data)))) == ([b"hello", b"", b"w"], b"")


def test_reader_several_frames_and_a_partial_tail() -> None:
    data = fr.frame(b"a") + fr.frame(b"bb") + fr.frame(b"ccc") + fr.frame(b"dddd")[:6]
    assert _read_all(data) == ([b"a", b"bb", b"ccc"], b"dd")


def test_reader_rejects_an_oversized_frame_as_soon_as_its_header_arrives() -> None:
    async def header_only() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(fr.frame(b"x" * 10) + struct.pack(">I", 11))  # no body, no EOF
        assert await read_frame(reader, 10) == b"x" * 10
        with pytest.raises(RemoteProtocolError):
            await asyncio.wait_for(read_frame(reader, 10), 5)  # no wait for the body

    asyncio.run(header_only())
    bodies, end = _read_all(fr.frame(b"ok") + fr.frame(b"y" * 11), 10)
    assert bodies == [b"ok"] and isinstance(end, RemoteProtocolError)


def test_reader_default_limit_is_max_frame_size() -> None:
    bodies, end = _read_all(struct.pack(">I", fr.MAX_FRAME_SIZE + 1))
    assert bodies == [] and isinstance(end, RemoteProtocolError)
    assert _read_all(struct.pack(">I", fr.MAX_FRAME_SIZE)) == ([], b"")  # waits for the body


@given(bodies=st.lists(st.binary(max_size=40), max_size=8), cuts=st.lists(st.integers(0, 400)))
def test_reader_reassembles_any_split_of_a_frame_stream(bodies: list[bytes],
                                                        cuts: list[int]) -> None:
    data = b"".join(fr.frame(b) for b in bodies)
    assert _read_all(data, 40, chunks=cuts) == (bodies, b"")


# ---- fuzz: bytes -> frames -> messages, only messages or RemoteProtocolError -----------------


def _decode_stream(chunks: list[bytes], decode: object, max_size: int = 256) -> list[object]:
    bodies, _ = _read_all(b"".join(chunks), max_size,
                          chunks=list(itertools.accumulate(len(c) for c in chunks)))
    out: list[object] = []
    for body in bodies:  # the reader closes the connection at the first framing error
        try:
            out.append(decode(body))  # type: ignore[operator]
        except RemoteProtocolError:
            out.append(None)
    return out


@settings(max_examples=300, report_multiple_bugs=False)
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_fuzz_random_bytes_through_framing_and_peer_to_master(chunks: list[bytes]) -> None:
    for msg in _decode_stream(chunks, m.decode_peer_to_master):
        assert msg is None or isinstance(msg, tuple(P2M_CLASSES))


_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() \
    | st.text(max_size=8) | st.binary(max_size=8)
_values = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=6)
                       | st.dictionaries(st.text(max_size=4), kids, max_size=4), max_leaves=20)


@settings(max_examples=200)
@given(tag=st.integers(-2, 130), fields=st.lists(_values, max_size=7))
def test_fuzz_structured_msgpack_through_both_decoders(tag: int, fields: list[object]) -> None:
    """Arrays led by a plausible tag reach the typed field validation."""
    body = enc([tag, *fields])
    for decode, classes in ((m.decode_peer_to_master, P2M_CLASSES),
                            (m.decode_master_to_peer, M2P_CLASSES)):
        (msg,) = _decode_stream([fr.frame(body)], decode, max_size=len(body))
        assert msg is None or isinstance(msg, tuple(classes))
        if msg is not None:  # whatever decodes re-encodes to a message that decodes equal
            assert decode(m.encode(msg)) == msg  # type: ignore[operator]


# ---- validation at decode: ranges and closed sets --------------------------------------------

U64_MAX = 2**64 - 1
H16 = b"\x01" * 16


# (body, the field the error must name); every body is one valid message with one field off
BAD_PEER_TO_MASTER = [
    (enc([1, -1, 0, 5000]), "Hello.version"),
    (enc([1, 2**32, 0, 5000]), "Hello.version"),
    (enc([1, PV, -1, 5000]), "Hello.peer_group"),
    (enc([1, PV, 2**32, 5000]), "Hello.peer_group"),
    (enc([1, PV, 0, 0]), "Hello.p2p_port"),
    (enc([1, PV, 0, -1]), "Hello.p2p_port"),
    (enc([1, PV, 0, 65536]), "Hello.p2p_port"),
    (enc([1, PV, 0, 5000, "", -1]), "Hello.state_port"),
    (enc([1, PV, 0, 5000, "", 65536]), "Hello.state_port"),
    (enc([1, PV, 0, 5000, "", 70000]), "Hello.state_port"),
    (enc([5, -1, 8, 10, 0]), "CollectiveInit.tag"),
    (enc([5, 1, -1, 10, 0]), "CollectiveInit.count"),
    (enc([5, 1, 8, -1, 0]), "CollectiveInit.dtype"),
    (enc([5, 1, 8, 12, 0]), "CollectiveInit.dtype"),  # uint4 is no tensor dtype
    (enc([5, 1, 8, 13, 0]), "CollectiveInit.dtype"),
    (enc([5, 1, 8, 10, -1]), "CollectiveInit.op"),
    (enc([5, 1, 8, 10, 5]), "CollectiveInit.op"),
    (enc([5, 1, 8, 10, 0, -1, 0]), "CollectiveInit.quant_algo"),
    (enc([5, 1, 8, 10, 0, 3, 0]), "CollectiveInit.quant_algo"),
    (enc([5, 1, 8, 10, 0, 1, -1]), "CollectiveInit.quant_dtype"),
    (enc([5, 1, 8, 10, 0, 1, 13]), "CollectiveInit.quant_dtype"),
    (enc([5, 1, 8, 10, 0, 2, 12]), "CollectiveInit.quant_dtype"),  # uint4 needs MIN_MAX
    (enc([5, 1, 8, 10, 0, 1, 1]), "CollectiveInit.quant_dtype"),  # int8: not a quantized dtype
    (enc([5, 1, 8, 10, 0, 1, 10]), "CollectiveInit.quant_dtype"),  # float32 neither
    (enc([5, 1, 8, 10, 0, 0, 2]), "CollectiveInit.quant_dtype"),  # a dtype without quantization
    (enc([6, -1, 1, True]), "CollectiveDone.tag"),
    (enc([6, 1, -1, True]), "CollectiveDone.seq"),
    (enc([11, -1]), "CollectiveWait.tag"),
    (enc([8, -1, 0, []]), "VoteSync.revision"),
    (enc([8, 0, -1, []]), "VoteSync.strategy"),
    (enc([8, 0, 3, []]), "VoteSync.strategy"),
    (enc([8, 0, 0, [["w", 12, 4, H16]]]), "VoteSync.entries[0].dtype"),  # uint4: codes only
    (enc([8, 0, 0, [["w", -1, 4, H16]]]), "VoteSync.entries[0].dtype"),
    (enc([8, 0, 0, [["w", 10, 4, H16], ["v", 10, -1, H16]]]), "VoteSync.entries[1].nbytes"),
    (enc([8, 0, 0, [["w", 10, 4, b"\x01" * 15]]]), "VoteSync.entries[0].hash"),
    (enc([8, 0, 0, [["w", 10, 4, b"\x01" * 17]]]), "VoteSync.entries[0].hash"),
    (enc([8, 0, 0, [["w", 10, 4, b"\x01"]]]), "VoteSync.entries[0].hash"),
    (enc([10, "merge"]), "WithdrawVote.kind"),
    (enc([10, ""]), "WithdrawVote.kind"),
]


@pytest.mark.parametrize(("body", "field"), BAD_PEER_TO_MASTER,
                         ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_PEER_TO_MASTER)])
def test_out_of_range_peer_to_master_field_is_a_protocol_error_naming_it(body: bytes,
                                                                         field: str) -> None:
    with pytest.raises(RemoteProtocolError, match="peer->master") as info:
        m.decode_peer_to_master(body)
    assert f"{field}:" in str(info.value)


BAD_MASTER_TO_PEER = [
    (enc([64, -1, True]), "Welcome.peer_id"),
    (enc([64, 1, True, -1]), "Welcome.version"),
    (enc([65, "r", -1]), "Rejected.version"),
    (enc([66, -1, 1, 1, 1, []]), "Membership.epoch"),
    (enc([66, 1, -1, 1, 1, []]), "Membership.global_world_size"),
    (enc([66, 1, 1, -1, 1, []]), "Membership.num_groups"),
    (enc([66, 1, 1, 1, -1, []]), "Membership.largest_group_world_size"),
    (enc([66, 1, 1, 1, 1, [[-1, "h", 5]]]), "Membership.ring[0].peer_id"),
    (enc([66, 1, 1, 1, 1, [[1, "h", 0]]]), "Membership.ring[0].port"),
    (enc([66, 1, 1, 1, 1, [[1, "h", 5], [2, "h", 65536]]]), "Membership.ring[1].port"),
    (enc([66, 1, 1, 1, 1, [[1, "h", 5, 65536]]]), "Membership.ring[0].state_port"),
    (enc([66, 1, 1, 1, 1, [[1, "h", 5, -1]]]), "Membership.ring[0].state_port"),
    (enc([67, -1]), "TopologyUpdated.epoch"),
    (enc([69, -1, 1, 1]), "CollectiveStart.tag"),
    (enc([69, 1, -1, 1]), "CollectiveStart.seq"),
    (enc([69, 1, 1, -1]), "CollectiveStart.epoch"),
    (enc([70, -1, 1]), "CollectiveComplete.tag"),
    (enc([70, 1, -1]), "CollectiveComplete.seq"),
    (enc([71, -1, 0, "r"]), "CollectiveAbort.tag"),
    (enc([71, 1, -1, "r"]), "CollectiveAbort.seq"),
    (enc([72, -1, "r"]), "CollectiveRejected.tag"),
    (enc([75, "other", "r"]), "VoteRejected.kind"),
    (enc([76, -1, [], [], []]), "SyncPlan.revision"),
    (enc([76, 1, ["w"], [b"\x01" * 17], []]), "SyncPlan.hashes[0]"),
    (enc([76, 1, ["w"], [b"\x01" * 3], []]), "SyncPlan.hashes"),
    (enc([76, 1, ["w", "v"], [H16], []]), "SyncPlan"),
    (enc([76, 1, [], [], [[1, "h", 5, 70000]]]), "SyncPlan.sources[0].state_port"),
    (enc([77, -1]), "SyncComplete.revision"),
]


@pytest.mark.parametrize(("body", "field"), BAD_MASTER_TO_PEER,
                         ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_MASTER_TO_PEER)])
def test_out_of_range_master_to_peer_field_is_a_protocol_error_naming_it(body: bytes,
                                                                         field: str) -> None:
    with pytest.raises(RemoteProtocolError, match="master->peer") as info:
        m.decode_master_to_peer(body)
    assert f"{field}:" in str(info.value)


I63_MAX = 2**63 - 1  # ids, terms, epochs, seqs, rounds, revisions (tags and counts: U64_MAX)
EDGES_PEER_TO_MASTER = [
    m.Hello(0, 0, 1),
    m.Hello(2**32 - 1, 2**32 - 1, 65535, "h", 65535, term=I63_MAX),
    m.Hello(PV, 0, 1, "", 0),
    m.CollectiveInit(U64_MAX, U64_MAX, 11, 4, 2, 2),
    m.CollectiveInit(0, 0, 0, 0, 1, 0),
    m.CollectiveDone(U64_MAX, I63_MAX, False, ""),
    m.CollectiveWait(U64_MAX),
    m.CollectiveWait(0),
    m.VoteSync(I63_MAX, 2, [m.SyncEntry("w", 11, U64_MAX, b""), m.SyncEntry("", 0, 0, H16)]),
]
EDGES_MASTER_TO_PEER = [
    m.Welcome(I63_MAX, False, 2**32 - 1),
    m.Membership(I63_MAX, I63_MAX, I63_MAX, I63_MAX,
                 [m.PeerAddr(I63_MAX, "h", 1, 65535), m.PeerAddr(0, "h", 65535, 0)]),
    m.CollectiveStart(U64_MAX, I63_MAX, I63_MAX),
    m.CollectiveAbort(0, 0, ""),
    m.VoteRejected("pending", "r"),
    m.SyncPlan(I63_MAX, ["a", "b"], [b"", H16], []),
    m.SyncComplete(0),
]


@pytest.mark.parametrize("msg", [
    m.Hello(PV, 0, 1, term=2**63),
    m.Hello(PV, 0, 1, rejoin=m.Rejoin(2**63, True, 1, 1, [1], 0, 0)),
    m.Hello(PV, 0, 1, rejoin=m.Rejoin(1, True, 1, 1, [1, 2**64 - 1], 0, 0)),
    m.Hello(PV, 0, 1, rejoin=m.Rejoin(1, True, 1, 1, [1], 2**63, 0)),
    m.Hello(PV, 0, 1, rejoin=m.Rejoin(1, True, 1, 1, [1], 0, 2**63)),
    m.CollectiveDone(0, 2**63, False, ""),
    m.VoteSync(2**63, 2, []),
], ids=repr)
def test_ids_terms_seqs_and_revisions_past_63_bits_are_refused(msg: m.PeerToMaster) -> None:
    """What a peer claims stays below 2**63, so the master's increments and the ids it hands
    out above every id seen stay within 64 bits."""
    with pytest.raises(RemoteProtocolError):
        m.decode_peer_to_master(m.encode(msg))


@pytest.mark.parametrize("msg", EDGES_PEER_TO_MASTER + EDGES_MASTER_TO_PEER, ids=repr)
def test_values_at_the_edges_of_every_range_decode(msg: m.PeerToMaster | m.MasterToPeer) -> None:
    decode = (m.decode_peer_to_master if type(msg) in P2M_CLASSES else m.decode_master_to_peer)
    assert decode(m.encode(msg)) == msg


def test_every_enum_member_decodes_and_the_next_value_does_not() -> None:
    from pccl_aio._types import TENSOR_DTYPES, DataType, QuantAlgo, ReduceOp, SyncStrategy

    assert list(TENSOR_DTYPES) == [dt for dt in DataType if dt != DataType.UINT4]
    for dt in TENSOR_DTYPES:
        assert m.decode_peer_to_master(enc([5, 1, 8, int(dt), 0])).dtype == dt
        assert m.decode_peer_to_master(enc([8, 0, 0, [["w", int(dt), 4, H16]]])
                                       ).entries[0].dtype == dt
    for op in ReduceOp:
        assert m.decode_peer_to_master(enc([5, 1, 8, 10, int(op)])).op == op
    for algo, qd in [(QuantAlgo.MIN_MAX, DataType.UINT4),
                     *((a, q) for a in (QuantAlgo.MIN_MAX, QuantAlgo.ZERO_POINT_SCALE)
                       for q in (DataType.UINT8, DataType.UINT16))]:
        msg = m.decode_peer_to_master(enc([5, 1, 8, 10, 0, int(algo), int(qd)]))
        assert (msg.quant_algo, msg.quant_dtype) == (algo, qd)
    for s in SyncStrategy:
        assert m.decode_peer_to_master(enc([8, 0, int(s), []])).strategy == s
    for body in (enc([5, 1, 8, len(TENSOR_DTYPES), 0]), enc([5, 1, 8, 10, len(ReduceOp)]),
                 enc([5, 1, 8, 10, 0, 1, len(DataType)]),
                 enc([5, 1, 8, 10, 0, len(QuantAlgo), 0]), enc([8, 0, len(SyncStrategy), []])):
        with pytest.raises(RemoteProtocolError):
            m.decode_peer_to_master(body)


def test_decoded_enum_fields_are_plain_ints() -> None:
    """Validation changes no type: the hot path and the encoding see the same ints."""
    msg = m.decode_peer_to_master(enc([5, 1, 8, 10, 1, 1, 2]))
    assert [type(x) for x in (msg.tag, msg.count, msg.dtype, msg.op, msg.quant_algo,
                              msg.quant_dtype)] == [int] * 6


def test_a_collectives_kind_is_validated_at_decode() -> None:
    """Issue 32: the kind is part of a collective's descriptor (version 6, with a broadcast's
    root and a ranked kind's launch epoch); a kind no peer knows is refused at decode, like
    any out-of-range field, and so are fields a kind does not have."""
    init = m.CollectiveInit(3, 0, 0, 0, kind=1, epoch=4)
    assert m.decode_peer_to_master(m.encode(init)) == init
    assert m.decode_peer_to_master(enc([5, 3, 0, 0, 0])).kind == 0  # an older peer's: all-reduce
    with pytest.raises(RemoteProtocolError):
        m.decode_peer_to_master(enc([5, 3, 0, 0, 0, 0, 0, 0, False, 9]))
    ok = [m.CollectiveInit(1, 8, 10, 0, kind=2, root=3, epoch=2),  # broadcast from rank 3
          m.CollectiveInit(1, 8, 10, 0, kind=3, epoch=2),  # all-gather
          m.CollectiveInit(1, 8, 10, 4, 1, 0, kind=4, epoch=2)]  # quantized reduce-scatter
    for msg in ok:
        assert m.decode_peer_to_master(m.encode(msg)) == msg
    bad = {"root": m.CollectiveInit(1, 8, 10, 0, kind=3, root=1, epoch=2),
           "nothing is reduced": m.CollectiveInit(1, 8, 10, 2, kind=2, epoch=2),
           "moves no data": m.CollectiveInit(1, 8, 10, 0, kind=1, epoch=2),
           "launch epoch due": m.CollectiveInit(1, 8, 10, 0, kind=3),
           "(all-reduce).epoch": m.CollectiveInit(1, 8, 10, 0, epoch=2),
           "uint32": m.CollectiveInit(1, 8, 10, 0, kind=2, root=2**32, epoch=2)}
    for words, msg in bad.items():
        with pytest.raises(RemoteProtocolError) as err:
            m.decode_peer_to_master(m.encode(msg))
        assert words in str(err.value) or words == "uint32", (words, err.value)
