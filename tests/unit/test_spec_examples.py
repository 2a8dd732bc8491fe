"""Every worked example of docs/protocol/dcp.md §8, decoded to the values the spec writes down.

Each example is read three ways (h11 style): whole, one byte at a time, and with trailing
bytes left in the buffer; and re-encoded byte for byte.
"""

from __future__ import annotations

import datetime as dt

import pytest

from dcp_cdc.columnar import decode_batch
from dcp_cdc.columnar.schema import COLUMNS, event_to_row
from dcp_cdc.decoder import END_OF_STREAM, NEED_DATA, DcpDecoder, decode_frame
from dcp_cdc.encoder import encode
from dcp_cdc.events import Event
from dcp_cdc.protocol import cas_time
from tests.support.spec_examples import EXAMPLES, Example


def _check(example: Example, event: Event, offset: int = 0) -> None:
    assert event.op == example.op
    assert event.header.offset == offset
    for name, expected in example.header.items():
        assert getattr(event.header, name) == expected, name
    for name, expected in example.fields.items():
        assert getattr(event, name) == expected, name


@pytest.fixture(params=EXAMPLES, ids=[e.section for e in EXAMPLES])
def example(request: pytest.FixtureRequest) -> Example:
    return request.param  # type: ignore[no-any-return]


def test_whole(example: Example) -> None:
    data = bytes.fromhex(example.hex)
    _check(example, decode_frame(data, collections=example.collections))


def test_byte_by_byte(example: Example) -> None:
    data = bytes.fromhex(example.hex)
    decoder = DcpDecoder(collections=example.collections)
    events = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        event = decoder.next_event()
        if i < len(data) - 1:
            assert event is NEED_DATA
        else:
            events.append(event)
    assert decoder.next_event() is NEED_DATA
    decoder.receive_data(b"")
    assert decoder.next_event() is END_OF_STREAM
    assert len(events) == 1
    _check(example, events[0])  # type: ignore[arg-type]


def test_trailing_bytes(example: Example) -> None:
    data = bytes.fromhex(example.hex)
    trailing = bytes.fromhex("805700051f01")  # the start of another frame
    decoder = DcpDecoder(collections=example.collections, base_offset=100)
    decoder.receive_data(data + trailing)
    _check(example, decoder.next_event(), offset=100)  # type: ignore[arg-type]
    assert decoder.next_event() is NEED_DATA
    assert decoder.trailing_data == trailing
    assert decoder.offset == 100 + len(data)


def test_reencodes_byte_for_byte(example: Example) -> None:
    data = bytes.fromhex(example.hex)
    assert encode(decode_frame(data, collections=example.collections)) == data


def test_columnar_face_agrees(example: Example) -> None:
    data = bytes.fromhex(example.hex)
    batch = decode_batch(data, collections=example.collections)
    assert batch.errors == [] and batch.fatal is None and batch.consumed == len(data)
    (row,) = batch.table.to_pylist()
    expected = {name: None for name, _ in COLUMNS}
    expected.update(event_to_row(decode_frame(data, collections=example.collections)))
    if expected["failover_log"] is not None:
        expected["failover_log"] = [{"vb_uuid": u, "seqno": q} for u, q in expected["failover_log"]]
    if expected["high_seqnos"] is not None:
        expected["high_seqnos"] = [{"vbucket": v, "seqno": q} for v, q in expected["high_seqnos"]]
    assert row == expected
    assert row["op"] == example.op


def test_spec_8_1_fields_at_their_frame_offsets() -> None:
    """The offsets in the §8.1 listing: key at 55..59, value at 60..66."""
    data = bytes.fromhex(EXAMPLES[0].hex)
    assert data[55:60] == b"hello"
    assert data[60:67] == b'{"a":1}'
    assert len(data) == 67


def test_spec_8_8_scope_comes_before_collection() -> None:
    """Errata E6: scope_id at value offset 8, collection_id at 12."""
    event = decode_frame(bytes.fromhex(EXAMPLES[8].hex), collections=True)
    assert (event.scope_id, event.collection_id) == (0, 8)  # type: ignore[union-attr]


ADD_STREAM_SEED = bytes.fromhex("80510000040000050000000400000001000000000000000000000001")
ADD_STREAM_RESPONSE_SEED = bytes.fromhex("81510000040000000000000400000001000000000000000000001000")


def test_add_stream_flags_by_name() -> None:
    """Every stream flag of add-stream.md by name, lowest bit first; an unknown bit by value."""
    data = bytearray(ADD_STREAM_SEED)
    data[24:28] = (0x3FF).to_bytes(4, "big")
    event = decode_frame(bytes(data), collections=False)
    assert event.flag_names == (  # type: ignore[union-attr]
        "takeover",
        "disk_only",
        "to_latest",
        "no_value",
        "active_vb_only",
        "strict_vbuuid",
        "from_latest",
        "ignore_purged_tombstones",
        "cache_transfer",
        "0x200",
    )
    (row,) = decode_batch(bytes(data), collections=False).table.to_pylist()
    assert row["op"] == "add_stream" and row["flags"] == 0x3FF
    assert row["stream_flag_names"] == list(event.flag_names)  # type: ignore[union-attr]
    assert row["vbucket"] == 5 and row["stream_opaque"] is None


def test_add_stream_error_response_without_extras() -> None:
    """An error reply (here NOT_MY_VBUCKET) may come without the 4-byte extras."""
    data = bytes.fromhex("815100000000000700000000000000010000000000000000")
    event = decode_frame(data, collections=False)
    assert (event.op, event.status_name, event.stream_opaque) == (  # type: ignore[union-attr]
        "add_stream_response",
        "not_my_vbucket",
        None,
    )
    (row,) = decode_batch(data, collections=False).table.to_pylist()
    assert (row["status"], row["status_name"], row["stream_opaque"]) == (7, "not_my_vbucket", None)


def test_cas_time_of_the_spec_8_1_cas() -> None:
    """Spec §1.5 and §8.1: CAS 0x17a8b0d8e6f40000 is HLC nanoseconds (low 16 bits a counter),
    ~2024-01-09T13:28:24.59Z; to the microsecond, truncated."""
    cas = decode_frame(bytes.fromhex(EXAMPLES[0].hex), collections=False).header.cas
    assert cas == 0x17A8B0D8E6F40000
    assert cas_time(cas) == dt.datetime(2024, 1, 9, 13, 28, 24, 593907, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("cas", "expected"),
    [
        # the counter bits are not time: a CAS whose clock stood still reads the same
        (0x17A8B0D8E6F4FFFF, dt.datetime(2024, 1, 9, 13, 28, 24, 593907, tzinfo=dt.UTC)),
        # one more clock tick (65,536 ns) is 65 or 66 µs later
        (0x17A8B0D8E6F50000, dt.datetime(2024, 1, 9, 13, 28, 24, 593973, tzinfo=dt.UTC)),
        (1 << 16, dt.datetime(1970, 1, 1, 0, 0, 0, 65, tzinfo=dt.UTC)),
        ((1 << 63) - 1, dt.datetime(2262, 4, 11, 23, 47, 16, 854710, tzinfo=dt.UTC)),
        (0, None),  # markers, system events: no CAS
        (1 << 63, None),  # past 2262: not a clock reading
        ((1 << 64) - 1, None),
    ],
)
def test_cas_time(cas: int, expected: dt.datetime | None) -> None:
    assert cas_time(cas) == expected
