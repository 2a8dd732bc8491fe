"""LEB128 (docs/protocol/dcp.md §3), Snappy (§2), XATTR blocks (§2) and FlatBuffers values (§6.7)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp_cdc import flatbuf, snappy
from dcp_cdc.errors import FieldError
from dcp_cdc.varint import encode_uleb128, read_uleb128, read_uleb128_many
from dcp_cdc.xattrs import join_xattrs, split_xattrs
from tests.support.snappy_oracle import compress_literal, decompress_pure

# docs/protocol/dcp.md §3 test vectors, as written there
LEB128_VECTORS = [
    (0x00, "00"),
    (0x01, "01"),
    (0x08, "08"),
    (0x7F, "7f"),
    (0x80, "8001"),
    (0x555, "d50a"),
    (555, "ab04"),
    (0x7FFF, "ffff01"),
    (0xFFFF, "ffff03"),
    (0x8000, "808002"),
    (0x5555, "d5aa01"),
    (0xCAFEF00, "80debf65"),
    (0xCAFEF00D, "8de0fbd70c"),
    (0xFFFFFFFF, "ffffffff0f"),
]


@pytest.mark.parametrize(("cid", "hex_bytes"), LEB128_VECTORS)
def test_leb128_spec_vectors(cid: int, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes)
    assert read_uleb128(data + b"key") == (cid, len(data))
    assert encode_uleb128(cid) == data


@pytest.mark.parametrize(
    ("hex_bytes", "reason"),
    [
        ("", "ends inside the prefix"),
        ("80", "ends inside the prefix"),
        ("ffffffff", "ends inside the prefix"),
        ("8080808080", "longer than 5 bytes"),
        ("ffffffff7f", "exceeds 32 bits"),
    ],
)
def test_leb128_malformed(hex_bytes: str, reason: str) -> None:
    with pytest.raises(FieldError, match=reason):
        read_uleb128(bytes.fromhex(hex_bytes))


@given(st.lists(st.binary(max_size=7), min_size=1, max_size=20))
@settings(max_examples=100, deadline=None)
def test_leb128_many_agrees_with_the_scalar_reader(chunks: list[bytes]) -> None:
    """The columnar face reads many varints at once by the same rule (accepted or not)."""
    data = b"".join(chunks) + b"\x00"  # a trailing byte no container reaches
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    values, sizes, ok = read_uleb128_many(data, starts, lengths)
    for i, chunk in enumerate(chunks):
        try:
            value, end = read_uleb128(chunk)
        except FieldError:
            assert not ok[i], chunk.hex()
        else:
            assert ok[i], chunk.hex()
            assert (values[i], sizes[i]) == (value, end)


@given(st.binary(max_size=3000))
@settings(max_examples=80, deadline=None)
def test_snappy_round_trip_and_readers_agree(data: bytes) -> None:
    block = snappy.compress(data)
    assert snappy.decompress(block) == data
    assert decompress_pure(block) == data
    assert decompress_pure(compress_literal(data)) == data


def test_snappy_pure_reader_handles_overlapping_copies() -> None:
    # literal "ab", then copy length 6 offset 2 (1-byte-offset copy): "abababab"
    block = bytes([8, 0x04, ord("a"), ord("b"), 0x01 | (2 << 2), 2])
    assert decompress_pure(block) == b"abababab"
    assert snappy.decompress(block) == b"abababab"


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (b"", "truncated length preamble"),
        (b"\xff\xff\xff\xff\xff\x01", "longer than 5 bytes"),
        (b"\xff\xff\xff\x7f", "impossible uncompressed length"),
        (bytes([5, 0x10, 1]), "literal runs past"),
        (bytes([4, 0x01 | (0 << 2), 9]), "copy offset outside"),
        (bytes([3, 0x00, ord("a")]), "length differs"),
    ],
)
def test_snappy_malformed_both_readers(block: bytes, reason: str) -> None:
    with pytest.raises(FieldError, match=reason):
        decompress_pure(block)
    with pytest.raises(FieldError, match="bad Snappy block"):
        snappy.decompress(block)


def test_xattrs_split_document_layout() -> None:
    # Document.md layout: u32 total, then u32 pair length, key NUL value NUL
    pair = b'_sync\x00{"rev":1}\x00'
    value = (len(pair) + 4).to_bytes(4, "big") + len(pair).to_bytes(4, "big") + pair + b'{"a":1}'
    assert split_xattrs(value) == ({"_sync": '{"rev":1}'}, b'{"a":1}')
    assert join_xattrs({"_sync": '{"rev":1}'}, b'{"a":1}') == value


@given(
    st.dictionaries(
        st.text(min_size=1).filter(lambda s: "\x00" not in s),
        st.text().filter(lambda s: "\x00" not in s),
        max_size=5,
    ),
    st.binary(max_size=50),
)
@settings(max_examples=60, deadline=None)
def test_xattrs_round_trip(xattrs: dict[str, str], body: bytes) -> None:
    assert split_xattrs(join_xattrs(xattrs, body)) == (xattrs, body)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\x00\x00", "too short for the length word"),
        (b"\x00\x00\x00\x10abc", "longer than the value"),
        (b"\x00\x00\x00\x03abc", "truncated pair length"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x09abcd", "runs past the section"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x04abcd", "not key NUL value NUL"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x04\x00bc\x00", "empty key"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x04\xffb\x00\x00", "not UTF-8"),
    ],
)
def test_xattrs_malformed(value: bytes, reason: str) -> None:
    with pytest.raises(FieldError, match=reason):
        split_xattrs(value)


def test_flatbuffers_collection_round_trip_with_defaults() -> None:
    data = flatbuf.build_table(
        flatbuf.COLLECTION,
        {
            "uid": 0x1F,
            "scope_id": 8,
            "collection_id": 9,
            "ttl_valid": True,
            "max_ttl": 60,
            "name": "orders",
            "flush_uid": 0x20,
        },
    )
    assert flatbuf.read_table(data, flatbuf.COLLECTION) == {
        "uid": 0x1F,
        "scope_id": 8,
        "collection_id": 9,
        "ttl_valid": True,
        "max_ttl": 60,
        "name": "orders",
        "history": False,
        "default_collection_mvs": 0,
        "metered": False,
        "flush_uid": 0x20,
    }
    # the same value read again (each vbucket's copy of an event) is a dict of its own
    first = flatbuf.read_table(memoryview(data), flatbuf.COLLECTION)
    first["name"] = "changed"
    assert flatbuf.read_table(data, flatbuf.COLLECTION)["name"] == "orders"
    dropped = flatbuf.read_table(data, flatbuf.DROPPED_COLLECTION)  # by the schema asked for
    assert set(dropped) == {name for name, _ in flatbuf.DROPPED_COLLECTION}


def test_flatbuffers_reads_tables_built_by_the_reference_builder() -> None:
    flatbuffers = pytest.importorskip("flatbuffers")
    builder = flatbuffers.Builder(64)
    name = builder.CreateString("inventory")
    builder.StartObject(3)
    builder.PrependUint64Slot(0, 0xABCDEF, 0)
    builder.PrependUint32Slot(1, 9, 0)
    builder.PrependUOffsetTRelativeSlot(2, name, 0)
    builder.Finish(builder.EndObject())
    data = bytes(builder.Output())
    assert flatbuf.read_table(data, flatbuf.SCOPE) == {
        "uid": 0xABCDEF,
        "scope_id": 9,
        "name": "inventory",
    }


@given(st.binary(max_size=80))
@settings(max_examples=200, deadline=None)
def test_flatbuffers_garbage_is_a_field_error(data: bytes) -> None:
    """Any other exception (IndexError, struct.error, ...) fails the test."""
    for schema in (flatbuf.COLLECTION, flatbuf.SCOPE, flatbuf.DROPPED_COLLECTION):
        with contextlib.suppress(FieldError):
            flatbuf.read_table(data, schema)
