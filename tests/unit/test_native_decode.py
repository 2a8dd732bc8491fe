"""The compiled pass of the columnar decoder (dcp_cdc/_native.c) against its oracles.

The numpy face is the oracle of the whole table (every column, byte for byte, nulls and
types included); the pure-Python Snappy reader of google/snappy's format description
(:mod:`tests.support.snappy_oracle`) is the oracle of its Snappy reader, and
:func:`dcp_cdc.xattrs.split_xattrs` of its XATTR reader. A frame the compiled pass is not sure
of goes through the per-frame path, so for bad values both faces must report the same error.
"""

from __future__ import annotations

import random
import struct

import cramjam
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcp_cdc import layouts
from dcp_cdc.columnar import DecodedBatch, decode_batch, decode_frames
from dcp_cdc.columnar import native as native_pass
from dcp_cdc.encoder import doc_key, frame, make_header
from dcp_cdc.errors import DecoderUsageError, FieldError
from dcp_cdc.protocol import Datatype, Opcode
from dcp_cdc.varint import encode_uleb128
from dcp_cdc.xattrs import split_xattrs
from tests.support.fuzz_decoder import corpus, inputs
from tests.support.snappy_oracle import compress_literal, decompress_pure
from tests.support.strategies import frames

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_compiled_pass_is_built() -> None:
    assert native_pass.NATIVE, (
        "dcp_cdc._native is not built: `make setup` builds it from dcp_cdc/_native.c "
        "(pip install -e . needs gcc and the Python headers)"
    )


def both(data: bytes, *, collections: bool, **kwargs: object) -> DecodedBatch:
    """The batch of the compiled pass, checked equal to the numpy face's in every part."""
    native = decode_batch(data, collections=collections, native=True, **kwargs)  # type: ignore[arg-type]
    numpy = decode_batch(data, collections=collections, native=False, **kwargs)  # type: ignore[arg-type]
    assert native.table.schema == numpy.table.schema
    for name in native.table.column_names:
        assert native.table[name].equals(numpy.table[name]), name
    assert [(e.offset, e.reason) for e in native.errors] == [
        (e.offset, e.reason) for e in numpy.errors
    ]
    assert native.consumed == numpy.consumed
    assert (native.fatal is None) == (numpy.fatal is None)
    if native.fatal is not None and numpy.fatal is not None:
        assert (native.fatal.offset, native.fatal.reason) == (
            numpy.fatal.offset,
            numpy.fatal.reason,
        )
    return native


def mutation(value: bytes, datatype: int, *, key: bytes = b"doc-1", cid: int | None = 8) -> bytes:
    extras = layouts.MUTATION.pack(by_seqno=7, rev_seqno=3, flags=1, expiration=0, lock_time=0)
    h = make_header(Opcode.DCP_MUTATION, vbucket=5, datatype=datatype, cas=(1 << 63) | 12345)
    return frame(h, extras, doc_key(cid, key), value)


# --- whole streams: generated events, the fuzzer's corpus and mutations ---------------------


@FAST
@given(st.booleans().flatmap(lambda c: st.tuples(st.just(c), frames(c, max_size=60))))
def test_generated_streams_decode_alike(case: tuple[bool, list[bytes]]) -> None:
    collections, encoded = case
    batch = both(b"".join(encoded), collections=collections)
    assert batch.table.num_rows == len(encoded)


@pytest.mark.parametrize("collections", [False, True])
def test_the_fuzz_corpus_and_its_mutations_decode_alike(collections: bool) -> None:
    """Every message of the fuzzer's corpus, then 3,000 mutated inputs decoded as streams."""
    both(b"".join(corpus()), collections=collections)
    stream: list[bytes] = []
    for data, c in inputs(seed=17, count=3000):
        if c is not collections:
            continue
        stream.append(data)
        if len(stream) == 32:  # one mutated frame can end the framing: short streams
            both(b"".join(stream), collections=collections)
            stream = []
    both(b"".join(stream), collections=collections)


@pytest.mark.parametrize("max_expanded", [1, 200, 5000, None])
def test_bounded_expansion_cuts_alike(max_expanded: int | None) -> None:
    rng = random.Random(3)
    data = b"".join(
        mutation(cramjam.snappy.compress_raw(rng.randbytes(rng.randrange(1, 900))).read(), 0x02)
        for _ in range(40)
    )
    batch = both(data, collections=True, max_expanded=max_expanded, final=False)
    assert (batch.table.num_rows == 40) == (max_expanded is None)
    assert batch.table.num_rows >= 1


def test_stream_ids_responses_and_long_collection_ids_decode_alike() -> None:
    h = make_header(Opcode.DCP_MUTATION, vbucket=2, datatype=1, stream_id=9)
    with_sid = frame(h, layouts.MUTATION.pack(by_seqno=1), doc_key(7, b"k"), b"{}")
    two_byte_cid = mutation(b"{}", 1, cid=300)  # a LEB128 of two bytes: the per-frame path
    response = frame(make_header(Opcode.DCP_MUTATION, status=0, stream_id=4), b"", b"", b"")
    batch = both(with_sid + two_byte_cid + response, collections=True)
    assert batch.table["stream_id"].to_pylist() == [9, None, 4]
    assert batch.table["collection_id"].to_pylist() == [7, 300, None]


def test_a_per_frame_rows_xattrs_beside_a_compiled_rows_empty_section() -> None:
    """Found by the fuzzer: a frame the compiled pass leaves to the per-frame path (a
    framing-extras section that is not a stream-id) carries XATTR pairs, the next one an
    empty XATTR section; the map offsets of the first must not be those of the second."""
    body = _section(b"_sync\x00{}\x00", b"meta\x00{}\x00") + b"{}"
    h = make_header(Opcode.DCP_MUTATION, datatype=Datatype.XATTR | Datatype.JSON, stream_id=1)
    odd = bytearray(frame(h, layouts.MUTATION.pack(by_seqno=1), doc_key(8, b"k"), body))
    odd[24] = 0x12  # a framing-extras tag the compiled pass does not know (1 byte, id 1)
    plain = mutation(_section() + b"{}", Datatype.XATTR | Datatype.JSON)
    batch = both(bytes(odd) + plain, collections=True)
    assert batch.table["xattrs"].to_pylist() == [[("_sync", "{}"), ("meta", "{}")], []]


# --- Snappy values against the pure-Python reader (docs/protocol/dcp.md §2) ---------------------------------


def _snappy_row(block: bytes) -> bytes | FieldError:
    """What decoding a mutation with this Snappy value gives: its value, or the error."""
    batch = both(mutation(block, Datatype.SNAPPY | Datatype.JSON), collections=True)
    if batch.errors:
        return FieldError(batch.errors[0].reason)
    value = batch.table["value"][0].as_py()
    assert isinstance(value, bytes)
    return value


def _oracle(block: bytes) -> bytes | None:
    try:
        return decompress_pure(block)
    except FieldError:
        return None


def _copy(length: int, offset: int, width: int) -> bytes:
    """A copy element with a 1-, 2- or 4-byte offset (format_description.txt)."""
    if width == 1:
        return bytes([0x01 | ((length - 4) << 2) | ((offset >> 8) << 5), offset & 0xFF])
    kind, fmt = (0x02, "<H") if width == 2 else (0x03, "<I")
    return bytes([kind | ((length - 1) << 2)]) + struct.pack(fmt, offset)


def _literal(data: bytes) -> bytes:
    return compress_literal(data)[len(encode_uleb128(len(data))) :]


HAND_MADE = [
    # runs: copies that overlap their own output, every offset below 16
    encode_uleb128(2 + 60) + _literal(b"ab") + _copy(60, 2, 2),
    encode_uleb128(1 + 64) + _literal(b"x") + _copy(64, 1, 2),
    *(encode_uleb128(o + 40) + _literal(bytes(range(o))) + _copy(40, o, 4) for o in range(1, 17)),
    # 1-byte-offset copies of every length, one ending exactly at the declared size
    *(
        encode_uleb128(20 + n) + _literal(b"0123456789abcdefghij") + _copy(n, 20, 1)
        for n in range(4, 12)
    ),
    # literals with 1 to 4 length bytes (tags 60..63)
    encode_uleb128(61) + bytes([60 << 2, 60]) + b"L" * 61,
    encode_uleb128(300) + bytes([61 << 2]) + struct.pack("<H", 299) + b"M" * 300,
    encode_uleb128(70000) + bytes([62 << 2]) + (69999).to_bytes(3, "little") + b"N" * 70000,
    encode_uleb128(17) + bytes([63 << 2]) + (16).to_bytes(4, "little") + b"O" * 17,
    # bad: offset 0, offset before the start, longer or shorter than declared, trailing tag,
    # a literal or copy cut short, a copy past the declared size
    encode_uleb128(8) + _literal(b"abcd") + _copy(4, 0, 1),
    encode_uleb128(8) + _literal(b"abcd") + _copy(4, 5, 1),
    encode_uleb128(3) + _literal(b"abcd"),
    encode_uleb128(5) + _literal(b"abcd"),
    encode_uleb128(4) + _literal(b"abcd") + b"\x00",
    encode_uleb128(10) + bytes([9 << 2]) + b"abc",
    encode_uleb128(8) + _literal(b"abcd") + b"\x02\x04",
    encode_uleb128(6) + _literal(b"abcd") + _copy(4, 4, 1),
    encode_uleb128(0),
    b"\x80",
]


@pytest.mark.parametrize("block", HAND_MADE, ids=lambda b: b[:10].hex())
def test_hand_made_snappy_blocks_read_as_the_reference_reads_them(block: bytes) -> None:
    expected = _oracle(block)
    got = _snappy_row(block)
    if expected is None:
        assert isinstance(got, FieldError), got
        assert "Snappy" in str(got)
    else:
        assert got == expected


@FAST
@given(
    st.one_of(
        st.binary(min_size=1, max_size=2000),
        st.lists(
            st.sampled_from(
                [b"ab", b"abc", b"0123456789", b'{"a":'],
            ),
            max_size=300,
        ).map(b"".join),
    ),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
)
def test_snappy_blocks_and_their_mutations_read_as_the_reference_reads_them(
    data: bytes, flips: list[tuple[int, int]]
) -> None:
    """Blocks from cramjam's compressor (copies of every kind) and the same blocks with bytes
    flipped: the compiled reader accepts exactly what the reference accepts."""
    block = bytearray(cramjam.snappy.compress_raw(data).read())
    for at, value in flips:
        block[at % len(block)] = value
    expected = _oracle(bytes(block))
    got = _snappy_row(bytes(block))
    if expected is None:
        assert isinstance(got, FieldError), got
    else:
        assert got == expected
    if not flips:
        assert got == data


# --- XATTR sections against xattrs.split_xattrs ---------------------------------------------


def _section(*pairs: bytes) -> bytes:
    body = b"".join(len(p).to_bytes(4, "big") + p for p in pairs)
    return len(body).to_bytes(4, "big") + body


XATTR_VALUES = [
    _section(b"_sync\x00{}\x00", b"meta\x00x\x00") + b'{"a":1}',
    _section() + b"body",
    _section(b"k\x00\x00"),  # empty value
    _section(b"\xc3\xa9t\xc3\xa9\x00\xf0\x9f\x98\x80\x00"),  # 2- and 4-byte UTF-8
    *(
        _section(b"k\x00" + bad + b"\x00")
        for bad in (
            b"\xc0\xaf",  # overlong
            b"\xed\xa0\x80",  # a surrogate
            b"\xf4\x90\x80\x80",  # past U+10FFFF
            b"\xe2\x82",  # cut short
            b"\x80",  # a lone continuation byte
            b"abcdefgh\xff",  # past the ASCII fast path
        )
    ),
    _section(b"k\x00v\x00", b"k\x00w\x00"),  # a key twice
    _section(b"\x00v\x00"),  # empty key
    _section(b"k\x00v\x00w\x00"),  # three NULs
    _section(b"kv\x00"),  # one NUL
    _section(*(f"k{i}\x00v\x00".encode() for i in range(64))),  # as many pairs as batched
    _section(*(f"k{i}\x00v\x00".encode() for i in range(65))),  # one more: per frame
    b"\x00\x00\x00\x10abc",
    b"\x00\x00",
    b"\x00\x00\x00\x08\x00\x00\x00\x09abcd",
]


@pytest.mark.parametrize("snappy", [False, True])
@pytest.mark.parametrize("value", XATTR_VALUES, ids=lambda v: v[:12].hex())
def test_xattr_sections_split_as_split_xattrs_splits_them(value: bytes, snappy: bool) -> None:
    datatype = Datatype.XATTR | Datatype.JSON | (Datatype.SNAPPY if snappy else 0)
    wire = cramjam.snappy.compress_raw(value).read() if snappy else value
    batch = both(mutation(wire, datatype), collections=True)
    try:
        xattrs, body = split_xattrs(value)
    except FieldError:
        assert batch.table.num_rows == 0 and len(batch.errors) == 1
        return
    assert batch.table["xattrs"][0].as_py() == list(xattrs.items())
    assert batch.table["value"][0].as_py() == body


# --- the helpers' own checks (the walk: tests/unit/test_decoder_properties.py) --------------


def test_decode_refuses_starts_that_are_not_frames() -> None:
    data = mutation(b"{}", 1) * 2
    starts = np.array([0, 3], dtype=np.int64)  # the second lies inside the first frame
    with pytest.raises(ValueError, match=r"no whole frame at starts\[1\]"):
        decode_frames(data, starts, collections=True, native=True)


def test_gather_refuses_ranges_outside_their_source() -> None:
    compiled = native_pass.native_module()
    offsets = np.empty(2, dtype=np.int32)
    one = np.ones(1, dtype=np.int64)
    with pytest.raises(ValueError, match="row 0's range lies outside its source"):
        compiled.gather((b"abc",), one * 0, one * 2, one * 2, offsets, pa.allocate_buffer)


def test_native_true_without_the_compiled_pass_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(native_pass, "NATIVE", False)
    with pytest.raises(DecoderUsageError, match="not built"):
        decode_batch(mutation(b"{}", 1), collections=True, native=True)


def test_keeping_freed_memory_changes_no_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_pass, "_pool", native_pass._pool)  # the pool goes back afterwards
    rng = random.Random(5)
    data = b"".join(
        mutation(cramjam.snappy.compress_raw(rng.randbytes(300)).read(), 0x02) for _ in range(50)
    )
    before = decode_batch(data, collections=True).table
    assert native_pass.keep_freed_memory()
    after = both(data, collections=True).table
    assert after.equals(before)
