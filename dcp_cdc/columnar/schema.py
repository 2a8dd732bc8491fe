"""What a decoded frame becomes: the columns of the columnar face, in order, and an event's row.

:func:`event_to_row` is the reference the columnar path must equal, row for row (the iterator
face's event turned into the same columns). Unsigned 64-bit wire fields are stored as int64
with the same bits (Spark has no unsigned types): ``0xFFFFFFFFFFFFFFFF`` ("stream forever")
reads as -1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from dcp_cdc.errors import MalformedFrameError
from dcp_cdc.events import (
    OPS,
    AddStream,
    Event,
    StreamRequest,
    UnknownFrame,
)
from dcp_cdc.protocol import (
    HEADER_LEN,
)

I64 = pa.int64()
I32 = pa.int32()
I16 = pa.int16()
FAILOVER_ENTRY_TYPE = pa.struct([("vb_uuid", I64), ("seqno", I64)])
HIGH_SEQNO_TYPE = pa.struct([("vbucket", I32), ("seqno", I64)])
"""An entry of ``high_seqnos`` (a GET_ALL_VB_SEQNOS reply)."""
XATTRS_TYPE = pa.map_(pa.string(), pa.string())
FLAG_NAMES_TYPE = pa.list_(pa.string())

# The decoded-frame columns, in order. Bronze adds lineage and session-order columns.
COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("offset", I64),
    ("frame_len", I32),
    ("op", pa.string()),
    ("magic", I16),
    ("opcode", I16),
    ("vbucket", I32),
    ("status", I32),
    ("opaque", I64),
    ("cas", I64),
    ("datatype", I16),
    ("stream_id", I32),
    ("by_seqno", I64),
    ("rev_seqno", I64),
    ("flags", I64),
    ("expiration", I64),
    ("lock_time", I64),
    ("nru", I16),
    ("delete_time", I64),
    ("collection_id", I64),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("xattrs", XATTRS_TYPE),
    ("is_json", pa.bool_()),
    ("marker_version", pa.string()),
    ("start_seqno", I64),
    ("end_seqno", I64),
    ("snapshot_flags", I64),
    ("max_visible_seqno", I64),
    ("high_completed_seqno", I64),
    ("purge_seqno", I64),
    ("high_prepared_seqno", I64),
    ("event", pa.string()),
    ("event_id", I64),
    ("version", I16),
    ("manifest_uid", I64),
    ("scope_id", I64),
    ("name", pa.string()),
    ("max_ttl", I64),
    ("flush_uid", I64),
    ("history", pa.bool_()),
    ("oso_flags", I64),
    ("reason_code", I64),
    ("reason", pa.string()),
    ("prepared_seqno", I64),
    ("commit_seqno", I64),
    ("abort_seqno", I64),
    ("deleted", I16),
    ("durability_level", I16),
    ("vbucket_state", I16),
    ("vb_uuid", I64),
    ("snap_start_seqno", I64),
    ("snap_end_seqno", I64),
    ("stream_flag_names", FLAG_NAMES_TYPE),
    ("status_name", pa.string()),
    ("failover_log", pa.list_(FAILOVER_ENTRY_TYPE)),
    ("high_seqnos", pa.list_(HIGH_SEQNO_TYPE)),
    ("rollback_seqno", I64),
    ("stream_opaque", I64),
    ("buffer_bytes", I64),
    ("raw", pa.binary()),
)
ARROW_SCHEMA = pa.schema([pa.field(n, t) for n, t in COLUMNS])

PAIR_LISTS = ("failover_log", "high_seqnos")
"""Columns that are lists of pairs of u64 wire values (stored as int64)."""
NUMERIC = {n: t for n, t in COLUMNS if pa.types.is_integer(t) or pa.types.is_boolean(t)}
STRINGS = [n for n, t in COLUMNS if pa.types.is_string(t) and n != "op"]
BINARIES = [n for n, t in COLUMNS if pa.types.is_binary(t)]
NP_TYPES: dict[pa.DataType, Any] = {
    I64: np.int64,
    I32: np.int32,
    I16: np.int16,
    pa.bool_(): np.bool_,
}

OP_INDEX = {op: i for i, op in enumerate(OPS)}
_U64_SIGN = 1 << 63


def to_signed64(value: int) -> int:
    """Reinterpret an unsigned 64-bit wire value as the int64 stored in columns."""
    return value - (1 << 64) if value >= _U64_SIGN else value


_FIELDS_CACHE: dict[type, tuple[str, ...]] = {}


def raw_row(event: Event) -> dict[str, Any]:
    """The column values of one event, unsigned as on the wire (see :func:`event_to_row`)."""
    h = event.header
    row: dict[str, Any] = {
        "offset": h.offset,
        "frame_len": HEADER_LEN + h.body_len,
        "op": event.op,
        "magic": h.magic,
        "opcode": h.opcode,
        "opaque": h.opaque,
        "cas": h.cas,
        "datatype": h.datatype,
        "stream_id": h.stream_id,
    }
    row["status" if h.is_response else "vbucket"] = h.vbucket_or_status
    if isinstance(event, UnknownFrame):
        row["raw"] = event.raw
        return row
    names = _FIELDS_CACHE.get(type(event))
    if names is None:
        names = tuple(n for n in event.__slots__ if n not in ("header", "nmeta"))
        _FIELDS_CACHE[type(event)] = names
    for name in names:
        value = getattr(event, name)
        if value is not None:
            row[name] = value
    if "xattrs" in names:
        row["is_json"] = h.is_json
    if isinstance(event, (StreamRequest, AddStream)):
        row["stream_flag_names"] = list(event.flag_names)
    value = row.get("value")
    if isinstance(value, str):  # a stream request's JSON text
        row["value"] = value.encode()
    return row


def event_to_row(event: Event) -> dict[str, Any]:
    """The column values of one event: the reference the columnar path must equal."""
    row = raw_row(event)
    for name, value in row.items():
        if name in PAIR_LISTS:
            row[name] = [(to_signed64(u), to_signed64(s)) for u, s in value]
        elif isinstance(value, int) and not isinstance(value, bool):
            row[name] = to_signed64(value)
    return row


@dataclass
class DecodedBatch:
    """The frames of one buffer.

    ``table`` holds the well-formed frames in order; ``errors`` the malformed frames that were
    skipped (their boundary was known); ``consumed`` how many bytes of the buffer were framed;
    ``fatal`` an error after which the buffer cannot be framed (or, when ``final``, the
    truncated tail), starting at ``consumed``.
    """

    table: pa.Table
    errors: list[MalformedFrameError] = field(default_factory=list)
    consumed: int = 0
    fatal: MalformedFrameError | None = None
