"""Malformed input: each kind gives a typed error that says what and where (both faces)."""

from __future__ import annotations

import pytest

from dcp_cdc.columnar import decode_batch
from dcp_cdc.decoder import END_OF_STREAM, DcpDecoder, decode_frame, iter_decode
from dcp_cdc.encoder import encode, frame, make_header
from dcp_cdc.errors import DecoderUsageError, MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import Mutation, UnknownFrame
from dcp_cdc.protocol import ClientOpcode, Datatype, Opcode
from dcp_cdc.snappy import compress

MUTATION_8_2 = bytes.fromhex(
    "805700061f0102100000002c0000121017a8b0d8e6f40000000000000000000400000000000000010200000600"
    "000000000000000000000868656c6c6f7b2261223a317d"
)


def _mutation(ext: bytes, key: bytes, value: bytes, datatype: int = 0) -> bytes:
    return frame(make_header(Opcode.DCP_MUTATION, datatype=datatype), ext, key, value)


GOOD_EXT = MUTATION_8_2[24:55]


def _xattrs(*pairs: bytes) -> bytes:
    """An XATTR section of raw ``key NUL value NUL`` pairs (well-formed or not), then a body."""
    section = b"".join(len(p).to_bytes(4, "big") + p for p in pairs)
    return len(section).to_bytes(4, "big") + section + b"{}"


_XA, _XS = Datatype.XATTR, Datatype.XATTR | Datatype.SNAPPY
_ALL_VB_SEQNOS = ClientOpcode.GET_ALL_VB_SEQNOS

CASES = [
    (
        "extras too short",
        _mutation(GOOD_EXT[:30], b"\x08k", b""),
        "extras length",
        "31 bytes",
        "30 bytes",
    ),
    ("bad LEB128", _mutation(GOOD_EXT, b"\x80\x80", b""), "bad LEB128", None, None),
    ("empty key", _mutation(GOOD_EXT, b"", b""), "bad LEB128", None, "an empty key"),
    (
        "bad Snappy",
        _mutation(GOOD_EXT, b"\x08k", b"\x05\x00", Datatype.SNAPPY),
        "bad Snappy",
        None,
        None,
    ),
    (
        "bad XATTR",
        _mutation(GOOD_EXT, b"\x08k", b"\x00\x00\x00\x09abc", Datatype.XATTR),
        "bad XATTR",
        None,
        None,
    ),
    (
        "XATTR duplicate key",
        _mutation(GOOD_EXT, b"\x08k", _xattrs(b"a\x001\x00", b"a\x002\x00"), _XA),
        "duplicate key",
        None,
        None,
    ),
    (
        "XATTR duplicate key apart",
        _mutation(GOOD_EXT, b"\x08k", _xattrs(b"a\x001\x00", b"b\x00\x00", b"a\x00\x00"), _XA),
        "duplicate key",
        None,
        None,
    ),
    (
        "XATTR duplicate key, Snappy",
        _mutation(GOOD_EXT, b"\x08k", compress(_xattrs(b"a\x00\x00", b"a\x00\x00")), _XS),
        "duplicate key",
        None,
        None,
    ),
    (
        "XATTR NUL in value",
        _mutation(GOOD_EXT, b"\x08k", _xattrs(b"a\x00x\x00y\x00"), _XA),
        "not key NUL value NUL",
        None,
        None,
    ),
    (
        "XATTR empty key",
        _mutation(GOOD_EXT, b"\x08k", _xattrs(b"\x00v\x00"), _XA),
        "empty key",
        None,
        None,
    ),
    (
        "XATTR key not UTF-8",
        _mutation(GOOD_EXT, b"\x08k", compress(_xattrs(b"\xff\x00v\x00")), _XS),
        "not UTF-8",
        None,
        None,
    ),
    (
        "unknown datatype bit",
        _mutation(GOOD_EXT, b"\x08k", b"x", 0x08),
        "unknown datatype",
        "bits within 0x07",
        "0x08",
    ),
    (
        "marker V2.1",
        frame(make_header(Opcode.DCP_SNAPSHOT_MARKER), b"\x01", b"", bytes(44)),
        "V2.1",
        None,
        "0x01",
    ),
    (
        "marker V2.0 value",
        frame(make_header(Opcode.DCP_SNAPSHOT_MARKER), b"\x00", b"", bytes(30)),
        "V2.0 value length",
        "36 bytes",
        "30 bytes",
    ),
    (
        "rollback value",
        frame(make_header(Opcode.DCP_STREAM_REQ, status=0x23), b"", b"", bytes(4)),
        "rollback response",
        "8 bytes",
        "4 bytes",
    ),
    (
        "failover log",
        frame(make_header(Opcode.DCP_STREAM_REQ, status=0), b"", b"", bytes(20)),
        "bad failover log",
        None,
        "20 bytes",
    ),
    (
        "system event value",
        frame(make_header(Opcode.DCP_SYSTEM_EVENT), bytes(13), b"c", bytes(15)),
        "create_collection v0 value length",
        "16 bytes",
        "15 bytes",
    ),
    (
        "modify without flatbuffers",
        frame(
            make_header(Opcode.DCP_SYSTEM_EVENT),
            bytes(8) + b"\x00\x00\x00\x05\x00",
            b"c",
            bytes(16),
        ),
        "unsupported modify_collection version",
        "version 2",
        "0",
    ),
    (
        "add stream without flags",
        frame(make_header(Opcode.DCP_ADD_STREAM), b"", b"", b""),
        "extras length",
        "4 bytes",
        "0 bytes",
    ),
    (
        "add stream with a value",
        frame(make_header(Opcode.DCP_ADD_STREAM), bytes(4), b"", b"x"),
        "unexpected value",
        None,
        None,
    ),
    (
        "add stream success without stream opaque",
        frame(make_header(Opcode.DCP_ADD_STREAM, status=0), b"", b"", b""),
        "extras length",
        "4 bytes",
        "0 bytes",
    ),
    (
        "stream end with key",
        frame(make_header(Opcode.DCP_STREAM_END), bytes(4), b"k", b""),
        "unexpected key",
        None,
        None,
    ),
    (
        "vb seqnos request extras",
        frame(make_header(_ALL_VB_SEQNOS), bytes(3), b"", b""),
        "extras length",
        "4 bytes or 8 bytes",
        "3 bytes",
    ),
    (
        "vb seqnos request of no vbucket state",
        frame(make_header(_ALL_VB_SEQNOS), (0x8000).to_bytes(4, "big"), b"", b""),
        "unknown vbucket state",
        "0 to 4",
        "32768",
    ),
    (
        "vb seqnos request with a key",
        frame(make_header(_ALL_VB_SEQNOS), bytes(4), b"k", b""),
        "unexpected key",
        "no key",
        "1 bytes",
    ),
    (
        "vb seqnos request with a value",
        frame(make_header(_ALL_VB_SEQNOS), bytes(4), b"", b"v"),
        "unexpected value",
        "no value",
        "1 bytes",
    ),
    (
        "vb seqnos reply of a partial entry",
        frame(make_header(_ALL_VB_SEQNOS, status=0), b"", b"", bytes(15)),
        "bad GET_ALL_VB_SEQNOS reply",
        "a multiple of 10 bytes",
        "15 bytes",
    ),
    (
        "failover log reply of a partial entry",
        frame(make_header(Opcode.DCP_GET_FAILOVER_LOG, status=0), b"", b"", bytes(24)),
        "bad failover log",
        "a non-empty multiple of 16 bytes",
        "24 bytes",
    ),
]


@pytest.mark.parametrize(
    ("name", "data", "reason", "expected", "got"), CASES, ids=[c[0] for c in CASES]
)
def test_malformed_frame_is_typed_and_located(
    name: str, data: bytes, reason: str, expected: str | None, got: str | None
) -> None:
    prefix = MUTATION_8_2  # a good frame first, so the bad one is at a non-zero offset
    with pytest.raises(MalformedFrameError, match=reason) as info:
        decode_frame(data, collections=True, base_offset=len(prefix))
    err = info.value
    assert err.offset == len(prefix)
    assert err.opcode == data[1]
    assert err.recoverable and err.frame_length == len(data)
    if expected is not None:
        assert err.expected == expected
    if got is not None:
        assert err.got == got
    # the stream goes on after the bad frame, in both faces
    stream = prefix + data + prefix
    items = list(iter_decode(stream, collections=True, file="cap.dcpcap"))
    assert [type(i).__name__ for i in items] == ["Mutation", type(err).__name__, "Mutation"]
    assert items[1].file == "cap.dcpcap" and items[1].offset == len(prefix)  # type: ignore[union-attr]
    batch = decode_batch(stream, collections=True)
    assert batch.table.column("op").to_pylist() == ["mutation", "mutation"]
    assert [(e.offset, e.reason) for e in batch.errors] == [(len(prefix), err.reason)]


def test_impossible_lengths_in_header() -> None:
    data = bytearray(MUTATION_8_2)
    data[4] = 60  # extras longer than the body
    with pytest.raises(MalformedFrameError, match="longer than the body") as info:
        decode_frame(bytes(data), collections=True)
    assert info.value.recoverable


def test_unknown_magic_stops_framing() -> None:
    stream = MUTATION_8_2 + b"\x42" + MUTATION_8_2[1:]
    items = list(iter_decode(stream, collections=True))
    assert isinstance(items[0], Mutation)
    err = items[1]
    assert isinstance(err, MalformedFrameError) and not err.recoverable
    assert err.offset == len(MUTATION_8_2) and err.got == "0x42"
    assert len(items) == 2
    batch = decode_batch(stream, collections=True)
    assert batch.table.num_rows == 1 and batch.consumed == len(MUTATION_8_2)
    assert batch.fatal is not None and batch.fatal.offset == len(MUTATION_8_2)


def test_impossible_body_length_stops_framing() -> None:
    data = bytearray(MUTATION_8_2)
    data[8:12] = (0x7FFF_FFFF).to_bytes(4, "big")
    (err,) = list(iter_decode(bytes(data), collections=True))
    assert isinstance(err, MalformedFrameError) and not err.recoverable
    assert "impossible body length" in str(err)


@pytest.mark.parametrize("cut", [1, 23, 24, 60])
def test_truncated_tail_is_reported_as_such(cut: int) -> None:
    stream = MUTATION_8_2 + MUTATION_8_2[:cut]
    decoder = DcpDecoder(collections=True, base_offset=100, file="f.dcpcap")
    decoder.receive_data(stream)
    decoder.receive_data(b"")
    assert isinstance(decoder.next_event(), Mutation)
    with pytest.raises(TruncatedFrameError) as info:
        decoder.next_event()
    err = info.value
    assert (err.offset, err.available, err.file) == (100 + len(MUTATION_8_2), cut, "f.dcpcap")
    assert err.needed == (len(MUTATION_8_2) if cut >= 24 else None)
    with pytest.raises(TruncatedFrameError):  # the decoder stays in its error state
        decoder.next_event()
    batch = decode_batch(stream, collections=True, base_offset=100)
    assert isinstance(batch.fatal, TruncatedFrameError)
    assert batch.fatal.offset == 100 + len(MUTATION_8_2)
    partial = decode_batch(stream, collections=True, final=False)
    assert partial.fatal is None and partial.consumed == len(MUTATION_8_2)


def test_unknown_opcode_is_an_event_carrying_its_bytes() -> None:
    data = frame(make_header(0x66, vbucket=3), b"", b"", b"packed items")  # cache transfer
    event = decode_frame(data, collections=True)
    assert isinstance(event, UnknownFrame)
    assert event.raw == data and event.header.vbucket == 3 and event.op == "unknown"
    assert encode(event) == data
    dcp_open_reply = frame(make_header(Opcode.DCP_OPEN, status=0), b"", b"", b"")
    assert isinstance(decode_frame(dcp_open_reply, collections=False), UnknownFrame)


def test_feeding_after_end_of_stream_is_a_usage_error() -> None:
    decoder = DcpDecoder(collections=False)
    decoder.receive_data(b"")
    assert decoder.next_event() is END_OF_STREAM
    with pytest.raises(DecoderUsageError):
        decoder.receive_data(b"x")


def test_error_message_names_what_and_where() -> None:
    data = _mutation(GOOD_EXT[:30], b"\x08k", b"")
    with pytest.raises(MalformedFrameError) as info:
        decoder = DcpDecoder(collections=True, base_offset=40, file="landing/s-00001.dcpcap")
        decoder.receive_data(data)
        decoder.next_event()
    assert str(info.value) == (
        "malformed frame at landing/s-00001.dcpcap@40, opcode 0x57: extras length does not fit "
        "the opcode (expected 31 bytes, got 30 bytes)"
    )


def _stream_request(value: str) -> bytes:
    return frame(make_header(Opcode.DCP_STREAM_REQ), bytes(48), b"", value.encode())


@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
def test_deeply_nested_stream_request_value_is_a_typed_error(depth: int) -> None:
    """Once: a value nested ~1,000 deep raised RecursionError in both faces, and the
    frame after it was lost. Now a fixed depth limit judges it alike in both faces."""
    bad = _stream_request("[" * depth + "]" * depth)
    stream = MUTATION_8_2 + bad + MUTATION_8_2
    items = list(iter_decode(stream, collections=True))
    assert [type(i).__name__ for i in items] == ["Mutation", "MalformedFrameError", "Mutation"]
    err = items[1]
    assert isinstance(err, MalformedFrameError)
    assert (err.offset, err.opcode, err.frame_length) == (len(MUTATION_8_2), 0x53, len(bad))
    assert "nests too deep" in err.reason and err.got == f"{depth} levels"
    batch = decode_batch(stream, collections=True)
    assert batch.table.column("op").to_pylist() == ["mutation", "mutation"]
    assert [(e.offset, e.reason) for e in batch.errors] == [(err.offset, err.reason)]


def test_json_depth_limit_is_exact_and_ignores_brackets_in_strings() -> None:
    at_limit = '{"a":' * 63 + '["[[[[{{{{"]' + "}" * 63  # 64 levels; brackets in a string
    event = decode_frame(_stream_request(at_limit), collections=False)
    assert event.value == at_limit  # type: ignore[union-attr]
    beyond = "[" * 65 + "]" * 65
    with pytest.raises(MalformedFrameError, match="nests too deep"):
        decode_frame(_stream_request(beyond), collections=False)
    with pytest.raises(MalformedFrameError, match="not JSON"):
        decode_frame(_stream_request('{"a": [}'), collections=False)


@pytest.mark.parametrize("cut", range(len(MUTATION_8_2)))
def test_decode_frame_on_a_short_buffer_is_a_truncated_frame(cut: int) -> None:
    """Once: ``decode_frame`` returned a truncated mutation (cut inside the value) or
    raised IndexError / struct.error (cut inside the header)."""
    with pytest.raises(TruncatedFrameError) as info:
        decode_frame(MUTATION_8_2[:cut], collections=True, base_offset=7)
    err = info.value
    assert (err.offset, err.available) == (7, cut)
    assert err.needed == (len(MUTATION_8_2) if cut >= 24 else None)
