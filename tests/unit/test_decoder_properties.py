"""Properties of both decoder faces over generated frames (Hypothesis).

- every event survives encode → decode unchanged, whole and chunked;
- the columnar face gives, row for row, what the iterator face gives;
- random or mutated input either decodes or raises MalformedFrameError, nothing else;
- framing a buffer as segments walked at once finds the frames of one walk from byte 0, and
  so does the compiled pass's walk.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dcp_cdc.columnar import NATIVE, decode_batch, frame_starts
from dcp_cdc.decoder import END_OF_STREAM, NEED_DATA, DcpDecoder, decode_frame, iter_decode
from dcp_cdc.encoder import encode
from dcp_cdc.errors import MalformedFrameError
from dcp_cdc.events import Event, SystemEvent
from tests.support.fuzz_decoder import reference_rows
from tests.support.strategies import any_event, frames

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fields(event: Event) -> dict[str, Any]:
    """The event without the header's computed lengths and offset."""
    skip = {"header", "value"} if isinstance(event, SystemEvent) else {"header"}  # raw kept
    out = {f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name not in skip}
    h = event.header
    out["header"] = (
        h.opcode,
        h.datatype,
        h.vbucket_or_status,
        h.opaque,
        h.cas,
        h.stream_id,
        h.is_response,
    )
    return out


@FAST
@given(st.booleans().flatmap(lambda c: st.tuples(st.just(c), any_event(c))))
def test_encode_decode_round_trip(case: tuple[bool, Event]) -> None:
    collections, event = case
    data = encode(event)
    decoded = decode_frame(data, collections=collections)
    assert type(decoded) is type(event)
    expected = _fields(event)
    assert _fields(decoded) == expected
    assert decoded.header.frame_len == len(data)
    assert encode(decoded) == data


@FAST
@given(st.booleans().flatmap(lambda c: st.tuples(st.just(c), frames(c))), st.integers(1, 64))
def test_chunked_stream_equals_whole(case: tuple[bool, list[bytes]], chunk: int) -> None:
    collections, encoded = case
    data = b"".join(encoded)
    whole = list(iter_decode(data, collections=collections, base_offset=12))
    decoder = DcpDecoder(collections=collections, base_offset=12)
    chunked: list[Event] = []
    for i in range(0, len(data), chunk):
        decoder.receive_data(data[i : i + chunk])
        while (event := decoder.next_event()) is not NEED_DATA:
            chunked.append(event)  # type: ignore[arg-type]
    decoder.receive_data(b"")
    assert decoder.next_event() is END_OF_STREAM
    assert chunked == whole
    offsets = [e.header.offset for e in chunked]
    expected_offsets = [12 + sum(len(f) for f in encoded[:i]) for i in range(len(encoded))]
    assert offsets == expected_offsets


def _reference_rows(data: bytes, collections: bool) -> list[dict[str, Any]]:
    return reference_rows(list(iter_decode(data, collections=collections)))


@FAST
@given(st.booleans().flatmap(lambda c: st.tuples(st.just(c), frames(c))))
def test_columnar_face_equals_iterator_face(case: tuple[bool, list[bytes]]) -> None:
    collections, encoded = case
    data = b"".join(encoded)
    batch = decode_batch(data, collections=collections)
    assert batch.errors == [] and batch.fatal is None and batch.consumed == len(data)
    assert batch.table.to_pylist() == _reference_rows(data, collections)


@FAST
@given(
    st.booleans().flatmap(lambda c: st.tuples(st.just(c), frames(c, max_size=8))),
    st.data(),
)
def test_mutated_frames_decode_or_raise_typed_error(
    case: tuple[bool, list[bytes]], data: st.DataObject
) -> None:
    collections, encoded = case
    buf = bytearray(b"".join(encoded))
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del buf[data.draw(st.integers(0, len(buf))) :]
    _decode_both_faces(bytes(buf), collections)


@FAST
@given(st.binary(max_size=400), st.booleans())
@example(bytes.fromhex("8057000000000000ffffffff"), True)
# alternative magic, empty body, last in the buffer (once an IndexError in the columnar face)
@example(bytes.fromhex("18" + "00" * 23), True)
@example(bytes.fromhex("085c" + "00" * 22), False)
def test_random_bytes_decode_or_raise_typed_error(data: bytes, collections: bool) -> None:
    _decode_both_faces(data, collections)


def _decode_both_faces(data: bytes, collections: bool) -> None:
    """Only events and MalformedFrameError may come out, and both faces agree on them."""
    items = list(iter_decode(data, collections=collections))
    for item in items:
        assert isinstance(item, MalformedFrameError) or hasattr(item, "op")
    errors = [i for i in items if isinstance(i, MalformedFrameError)]
    batch = decode_batch(data, collections=collections)
    assert batch.table.to_pylist() == _reference_rows(data, collections)
    recoverable = [e for e in errors if e.recoverable]
    assert [(e.offset, e.reason) for e in batch.errors] == [
        (e.offset, e.reason) for e in recoverable
    ]
    fatal = [e for e in errors if not e.recoverable]
    assert (batch.fatal is None) == (not fatal)
    if fatal:
        assert batch.fatal is not None and batch.fatal.offset == fatal[0].offset


@FAST
@given(
    st.booleans().flatmap(lambda c: st.tuples(st.just(c), frames(c, max_size=60))),
    st.data(),
)
def test_segmented_framing_equals_one_walk(
    case: tuple[bool, list[bytes]], data: st.DataObject
) -> None:
    """Small segments, so that guesses land inside frames, on bytes that look like headers,
    after the last frame, or past a frame that cannot be framed."""
    _, encoded = case
    buf = bytearray(b"".join(encoded))
    for _ in range(data.draw(st.integers(0, 3))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.sampled_from([0x80, 0xFF, 0]))
    if data.draw(st.booleans()):
        del buf[data.draw(st.integers(0, len(buf))) :]
    segment = data.draw(st.integers(24, 200))
    final = data.draw(st.booleans())
    one_walk = frame_starts(bytes(buf), final=final, segment=len(buf) + 1, native=False)
    segmented = frame_starts(bytes(buf), final=final, segment=segment, native=False)
    assert segmented[0].tolist() == one_walk[0].tolist()
    assert segmented[1] == one_walk[1]
    if NATIVE:  # the compiled pass walks one frame at a time: the same starts, the same stop
        compiled = frame_starts(bytes(buf), final=final, native=True)
        assert compiled[0].tolist() == one_walk[0].tolist()
        assert compiled[1] == one_walk[1]
        assert (compiled[2] is None) == (one_walk[2] is None)
        if compiled[2] is not None and one_walk[2] is not None:
            assert (compiled[2].offset, compiled[2].reason) == (
                one_walk[2].offset,
                one_walk[2].reason,
            )
    assert repr(segmented[2]) == repr(one_walk[2])
