"""The DCP decoder, columnar face: a buffer of frames in, one Arrow table out.

Used by the bronze ingest inside ``mapInArrow``. The work is split so that Python touches
each frame at most once:

1. framing: one tight loop finds where each frame starts (lengths chain, so it is serial);
2. the hot messages (plain mutations, deletions, expirations, V1 snapshot markers,
   seqno-advanced) are decoded for all rows at once with numpy, by gathering each layout of
   :mod:`dcp_cdc.layouts` into a structured array;
3. every other frame (system events, compressed or xattr values, responses, …) goes through
   the iterator face's reader for its opcode, and its event is turned into a row.

So both faces read the same layout tables, and a test checks that they agree row for row.
Unsigned 64-bit wire fields are stored as int64 with the same bits (Spark has no unsigned
types): ``0xFFFFFFFFFFFFFFFF`` ("stream forever") reads as -1.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from dcp_cdc import layouts
from dcp_cdc.decoder import _read, decode_value, parse_header
from dcp_cdc.errors import FieldError, MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import Event, UnknownFrame
from dcp_cdc.layouts import Layout
from dcp_cdc.protocol import (
    ALT_MAGICS,
    HEADER_LEN,
    KNOWN_MAGICS,
    MAX_BODY_LEN,
    RESPONSE_MAGICS,
    Datatype,
    Opcode,
)

I64 = pa.int64()
I32 = pa.int32()
I16 = pa.int16()
FAILOVER_ENTRY_TYPE = pa.struct([("vb_uuid", I64), ("seqno", I64)])
XATTRS_TYPE = pa.map_(pa.string(), pa.string())

# The decoded-frame columns, in order. Bronze adds lineage and session-order columns.
COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("offset", I64), ("frame_len", I32), ("op", pa.string()),
    ("magic", I16), ("opcode", I16), ("vbucket", I32), ("status", I32), ("opaque", I64),
    ("cas", I64), ("datatype", I16), ("stream_id", I32),
    ("by_seqno", I64), ("rev_seqno", I64), ("flags", I64), ("expiration", I64),
    ("lock_time", I64), ("nru", I16), ("delete_time", I64),
    ("collection_id", I64), ("key", pa.binary()), ("value", pa.binary()),
    ("xattrs", XATTRS_TYPE), ("is_json", pa.bool_()),
    ("marker_version", pa.string()), ("start_seqno", I64), ("end_seqno", I64),
    ("snapshot_flags", I64), ("max_visible_seqno", I64), ("high_completed_seqno", I64),
    ("purge_seqno", I64), ("high_prepared_seqno", I64),
    ("event", pa.string()), ("event_id", I64), ("version", I16), ("manifest_uid", I64),
    ("scope_id", I64), ("name", pa.string()), ("max_ttl", I64), ("flush_uid", I64),
    ("history", pa.bool_()),
    ("oso_flags", I64), ("reason_code", I64), ("reason", pa.string()),
    ("prepared_seqno", I64), ("commit_seqno", I64), ("abort_seqno", I64),
    ("deleted", I16), ("durability_level", I16), ("vbucket_state", I16),
    ("vb_uuid", I64), ("snap_start_seqno", I64), ("snap_end_seqno", I64),
    ("status_name", pa.string()), ("failover_log", pa.list_(FAILOVER_ENTRY_TYPE)),
    ("rollback_seqno", I64), ("buffer_bytes", I64), ("raw", pa.binary()),
)  # fmt: skip
ARROW_SCHEMA = pa.schema([pa.field(n, t) for n, t in COLUMNS])

_NUMERIC = {n: t for n, t in COLUMNS if pa.types.is_integer(t) or pa.types.is_boolean(t)}
_STRINGS = [n for n, t in COLUMNS if pa.types.is_string(t) and n != "op"]
_BINARIES = [n for n, t in COLUMNS if pa.types.is_binary(t)]
_NP_TYPES: dict[pa.DataType, Any] = {
    I64: np.int64, I32: np.int32, I16: np.int16, pa.bool_(): np.bool_,
}  # fmt: skip

OPS: tuple[str, ...] = (
    "mutation", "deletion", "expiration", "snapshot_marker", "system_event", "seqno_advanced",
    "oso_snapshot", "stream_end", "noop", "prepare", "commit", "abort", "stream_request",
    "stream_request_response", "failover_log_request", "failover_log_response", "buffer_ack",
    "set_vbucket_state", "unknown",
)  # fmt: skip
_OP_INDEX = {op: i for i, op in enumerate(OPS)}
_U64_SIGN = 1 << 63


def to_signed64(value: int) -> int:
    """Reinterpret an unsigned 64-bit wire value as the int64 stored in columns."""
    return value - (1 << 64) if value >= _U64_SIGN else value


_FIELDS_CACHE: dict[type, tuple[str, ...]] = {}


def raw_row(event: Event) -> dict[str, Any]:
    """The column values of one event, unsigned as on the wire (see :func:`event_to_row`)."""
    h = event.header
    row: dict[str, Any] = {
        "offset": h.offset, "frame_len": HEADER_LEN + h.body_len, "op": event.op,
        "magic": h.magic, "opcode": h.opcode, "opaque": h.opaque, "cas": h.cas,
        "datatype": h.datatype, "stream_id": h.stream_id,
    }  # fmt: skip
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
    value = row.get("value")
    if isinstance(value, str):  # a stream request's JSON text
        row["value"] = value.encode()
    return row


def event_to_row(event: Event) -> dict[str, Any]:
    """The column values of one event: the reference the columnar path must equal."""
    row = raw_row(event)
    for name, value in row.items():
        if name == "failover_log":
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


_HEADER_DTYPE = np.dtype(
    {
        "names": ["magic", "opcode", "keylen16", "ext_len", "datatype", "vb_or_status",
                  "body_len", "opaque", "cas"],
        "formats": ["u1", "u1", ">u2", "u1", "u1", ">u2", ">u4", ">u4", ">u8"],
        "offsets": [0, 1, 2, 4, 5, 6, 8, 12, 16],
        "itemsize": HEADER_LEN,
    }
)  # fmt: skip
_BODY_LEN = struct.Struct(">I").unpack_from


def frame_starts(
    buf: bytes, *, final: bool, base_offset: int = 0
) -> tuple[npt.NDArray[np.int64], int, MalformedFrameError | None]:
    """Start of every whole frame, the bytes they span, and the error that stopped framing."""
    starts = array("q")
    append = starts.append
    pos = 0
    n = len(buf)
    known = KNOWN_MAGICS
    fatal: MalformedFrameError | None = None
    while pos + HEADER_LEN <= n:
        body_len = _BODY_LEN(buf, pos + 8)[0]
        if buf[pos] not in known or body_len > MAX_BODY_LEN:
            try:
                parse_header(buf, pos, base_offset=base_offset)
            except MalformedFrameError as exc:
                fatal = exc
            break
        end = pos + HEADER_LEN + body_len
        if end > n:
            break
        append(pos)
        pos = end
    if fatal is None and final and pos < n:
        opcode = buf[pos + 1] if n - pos > 1 else None
        needed = HEADER_LEN + _BODY_LEN(buf, pos + 8)[0] if n - pos >= HEADER_LEN else None
        fatal = TruncatedFrameError(
            offset=base_offset + pos, available=n - pos, needed=needed, opcode=opcode
        )
    return np.frombuffer(starts, dtype=np.int64), pos, fatal


def _gather(src: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], width: int) -> Any:
    """The ``width`` bytes at each start, as a contiguous (n, width) matrix."""
    return src[starts[:, None] + np.arange(width, dtype=np.int64)]


def _as_records(matrix: Any, layout: Layout) -> Any:
    dtype = np.dtype(
        {
            "names": [f.name for f in layout.fields],
            "formats": [f">u{f.size}" for f in layout.fields],
            "offsets": [f.offset for f in layout.fields],
            "itemsize": layout.length,
        }
    )
    return np.ascontiguousarray(matrix).view(dtype).reshape(-1)


_SNAPPY = int(Datatype.SNAPPY)
_XATTR = int(Datatype.XATTR)
_DOC_OPCODES = [int(Opcode.DCP_MUTATION), int(Opcode.DCP_DELETION), int(Opcode.DCP_EXPIRATION)]

# Hot messages decoded for all rows at once: (opcode, extras layout, op, has a document key).
_FAST = (
    (Opcode.DCP_MUTATION, layouts.MUTATION, "mutation", True),
    (Opcode.DCP_DELETION, layouts.DELETION_V1, "deletion", True),
    (Opcode.DCP_DELETION, layouts.DELETION_V2, "deletion", True),
    (Opcode.DCP_EXPIRATION, layouts.EXPIRATION, "expiration", True),
    (Opcode.DCP_SNAPSHOT_MARKER, layouts.SNAPSHOT_MARKER_V1, "snapshot_marker", False),
    (Opcode.DCP_SEQNO_ADVANCED, layouts.SEQNO_ADVANCED, "seqno_advanced", False),
)


class _Columns:
    """Column arrays for n rows, filled by the fast path and by per-frame rows."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.values = {c: np.zeros(n, dtype=_NP_TYPES[t]) for c, t in _NUMERIC.items()}
        self.valid = {c: np.zeros(n, dtype=np.bool_) for c in _NUMERIC}
        self.op = np.zeros(n, dtype=np.int8)
        self.strings: dict[str, tuple[list[int], list[str]]] = {c: ([], []) for c in _STRINGS}
        # binary columns: per row (start, length) into the combined source; -1 = null
        self.bin_start = {c: np.full(n, -1, dtype=np.int64) for c in _BINARIES}
        self.bin_len = {c: np.zeros(n, dtype=np.int64) for c in _BINARIES}
        self.xattrs: list[tuple[int, dict[str, str]]] = []
        self.failover: list[tuple[int, list[tuple[int, int]]]] = []
        self.extra = bytearray()
        self.pending: dict[str, tuple[list[int], list[Any]]] = {
            name: ([], []) for name, _ in COLUMNS
        }
        self.bin_pending_len: dict[str, list[int]] = {name: [] for name in _BINARIES}

    def set(self, name: str, rows: Any, values: Any) -> None:
        self.values[name][rows] = values
        self.valid[name][rows] = True

    def put_row(self, i: int, row: dict[str, Any], base: int) -> None:
        """Queue one per-frame row; :meth:`flush` writes the queue column by column."""
        self.op[i] = _OP_INDEX[row["op"]]
        pending = self.pending
        for name, value in row.items():
            if value is None or name == "op":
                continue
            rows, values = pending[name]
            rows.append(i)
            if name in self.bin_pending_len:
                values.append(base + len(self.extra))
                self.bin_pending_len[name].append(len(value))
                self.extra += value
            else:
                values.append(value)

    def flush(self) -> None:
        for name, (rows, values) in self.pending.items():
            if not rows:
                continue
            if name in self.values:
                target = self.values[name]
                if target.dtype == np.int64:
                    arr = np.array(values, dtype=np.uint64).view(np.int64)
                else:
                    arr = np.array(values, dtype=target.dtype)
                target[rows] = arr
                self.valid[name][rows] = True
            elif name in self.strings:
                self.strings[name][0].extend(rows)
                self.strings[name][1].extend(values)
            elif name in self.bin_start:
                self.bin_start[name][rows] = values
                self.bin_len[name][rows] = self.bin_pending_len[name]
            elif name == "xattrs":
                self.xattrs.extend(zip(rows, values, strict=True))
            elif name == "failover_log":
                signed = [[(to_signed64(u), to_signed64(s)) for u, s in log] for log in values]
                self.failover.extend(zip(rows, signed, strict=True))
        for rows, values in self.pending.values():
            rows.clear()
            values.clear()
        for lengths in self.bin_pending_len.values():
            lengths.clear()

    def to_table(self, buf: bytes, keep: npt.NDArray[np.bool_]) -> pa.Table:
        extra = bytes(self.extra)
        arrays: dict[str, pa.Array] = {}
        op_dict = pa.array(OPS, type=pa.string())
        arrays["op"] = pa.DictionaryArray.from_arrays(pa.array(self.op), op_dict).cast(pa.string())
        for name, values in self.values.items():
            arrays[name] = pa.array(values, type=_NUMERIC[name], mask=~self.valid[name])
        for name, (rows, texts) in self.strings.items():
            arrays[name] = _sparse(self.n, rows, pa.array(texts, type=pa.string()))
        for name in _BINARIES:
            arrays[name] = _binary(buf, extra, self.bin_start[name], self.bin_len[name])
        arrays["xattrs"] = _sparse_map(self.n, self.xattrs)
        arrays["failover_log"] = _sparse_list(self.n, self.failover)
        table = pa.table([arrays[n] for n, _ in COLUMNS], schema=ARROW_SCHEMA)
        return table if keep.all() else table.filter(pa.array(keep))


def _sparse(n: int, rows: list[int], values: pa.Array) -> pa.Array:
    """An n-row column holding ``values`` at ``rows`` and nulls elsewhere."""
    indices = np.full(n, 0, dtype=np.int32)
    mask = np.ones(n, dtype=np.bool_)
    if rows:
        indices[rows] = np.arange(len(rows), dtype=np.int32)
        mask[rows] = False
    else:
        values = pa.array([None], type=values.type)
    return pa.DictionaryArray.from_arrays(pa.array(indices, mask=mask), values).cast(values.type)


_AR12 = np.arange(12, dtype=np.int64)


def _binary(buf: bytes, extra: bytes, starts: Any, lengths: Any) -> pa.Array:
    """A binary column of byte ranges, without a Python loop.

    ``starts`` index ``buf`` (or, from ``len(buf)`` on, ``extra``); -1 is a null. The ranges
    become Arrow binary *views* onto the two buffers, then one C++ cast copies them into a
    plain binary column (Spark reads no view types).
    """
    n = len(starts)
    valid = starts >= 0
    in_extra = starts >= len(buf)
    lens = np.where(valid, lengths, 0).astype("<i4")
    views = np.zeros((n, 16), dtype=np.uint8)
    views[:, 0:4] = lens.view(np.uint8).reshape(n, 4)
    for data, sel, base in ((buf, valid & ~in_extra, 0), (extra, in_extra, len(buf))):
        idx = np.flatnonzero(sel & (lens > 0))
        if not len(idx):
            continue
        arr = np.frombuffer(data, dtype=np.uint8)
        pos = np.minimum(starts[idx, None] - base + _AR12, len(arr) - 1)
        first = arr[pos]
        first[_AR12[None, :] >= lens[idx, None]] = 0  # inline values are zero-padded
        views[idx, 4:16] = first
    long = np.flatnonzero(lens > 12)
    if len(long):
        views[long, 8:12] = in_extra[long].astype("<i4").view(np.uint8).reshape(-1, 4)
        offsets = np.where(in_extra[long], starts[long] - len(buf), starts[long]).astype("<i4")
        views[long, 12:16] = offsets.view(np.uint8).reshape(-1, 4)
    validity = None if valid.all() else pa.array(valid).buffers()[1]
    buffers = [validity, pa.py_buffer(views), pa.py_buffer(buf)]
    if extra:
        buffers.append(pa.py_buffer(extra))
    return pa.Array.from_buffers(pa.binary_view(), n, buffers).cast(pa.binary())


def _sparse_map(n: int, entries: list[tuple[int, dict[str, str]]]) -> pa.Array:
    counts = np.zeros(n, dtype=np.int32)
    mask = np.ones(n, dtype=np.bool_)
    keys: list[str] = []
    items: list[str] = []
    for i, mapping in sorted(entries, key=lambda e: e[0]):  # values must follow row order
        counts[i] = len(mapping)
        mask[i] = False
        keys.extend(mapping)
        items.extend(mapping.values())
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(
        pa.array(offsets), pa.array(keys, pa.string()), pa.array(items, pa.string()),
        type=XATTRS_TYPE, mask=pa.array(mask),
    )  # fmt: skip


def _sparse_list(n: int, entries: Iterable[tuple[int, list[tuple[int, int]]]]) -> pa.Array:
    counts = np.zeros(n, dtype=np.int32)
    mask = np.ones(n, dtype=np.bool_)
    uuids: list[int] = []
    seqnos: list[int] = []
    for i, log in sorted(entries, key=lambda e: e[0]):
        counts[i] = len(log)
        mask[i] = False
        uuids.extend(u for u, _ in log)
        seqnos.extend(s for _, s in log)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    values = pa.StructArray.from_arrays(
        [pa.array(uuids, I64), pa.array(seqnos, I64)], fields=list(FAILOVER_ENTRY_TYPE)
    )
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(mask))


def decode_batch(
    buf: bytes,
    *,
    collections: bool,
    base_offset: int = 0,
    final: bool = True,
    file: str | None = None,
) -> DecodedBatch:
    """Decode every whole frame of ``buf`` (offsets reported as ``base_offset + position``).

    With ``final=False`` an incomplete last frame is left for the next call (``consumed``
    stops before it); with ``final=True`` it is reported as a truncated tail in ``fatal``.
    """
    starts, consumed, fatal = frame_starts(buf, final=final, base_offset=base_offset)
    if fatal is not None and file:
        fatal = fatal.with_file(file)
    n = len(starts)
    src = np.frombuffer(buf, dtype=np.uint8)
    cols = _Columns(n)
    keep = np.ones(n, dtype=np.bool_)
    errors: list[MalformedFrameError] = []
    if n == 0:
        return DecodedBatch(cols.to_table(buf, keep), errors, consumed, fatal)

    head = _as_header(_gather(src, starts, HEADER_LEN))
    magic = head["magic"]
    alt = np.isin(magic, list(ALT_MAGICS))
    fe_len = np.where(alt, head["keylen16"] >> 8, 0).astype(np.int64)
    key_len = np.where(alt, head["keylen16"] & 0xFF, head["keylen16"]).astype(np.int64)
    ext_len = head["ext_len"].astype(np.int64)
    body_len = head["body_len"].astype(np.int64)
    is_response = np.isin(magic, list(RESPONSE_MAGICS))
    frame_end = starts + HEADER_LEN + body_len
    ext_start = starts + HEADER_LEN + fe_len
    key_start = ext_start + ext_len
    value_start = key_start + key_len
    value_len = frame_end - value_start
    opcode = head["opcode"]
    datatype = head["datatype"]

    rows = np.arange(n)
    cols.set("offset", rows, starts + base_offset)
    cols.set("frame_len", rows, HEADER_LEN + body_len)
    cols.set("magic", rows, magic)
    cols.set("opcode", rows, opcode)
    cols.set("opaque", rows, head["opaque"])
    cols.set("cas", rows, head["cas"].astype(np.int64))
    cols.set("datatype", rows, datatype)
    cols.set("vbucket", rows[~is_response], head["vb_or_status"][~is_response])
    cols.set("status", rows[is_response], head["vb_or_status"][is_response])

    # Stream ids: the usual alt frame is exactly one stream-id FrameInfo (0x22 + u16).
    slow = value_len < 0  # impossible lengths are reported by the per-frame path
    sid_rows = rows[alt & ~slow]
    if len(sid_rows):
        fe = _gather(src, starts[sid_rows] + HEADER_LEN, 3)
        simple = (fe_len[sid_rows] == 3) & (fe[:, 0] == 0x22)
        cols.set(
            "stream_id", sid_rows[simple], (fe[simple, 1].astype(np.int32) << 8) | fe[simple, 2]
        )
        slow[sid_rows[~simple]] = True

    fast = np.zeros(n, dtype=np.bool_)
    request = ~is_response & (magic != 0x82) & ~slow
    known_datatype = (datatype & 0xF8) == 0
    for op_code, layout, op, has_key in _FAST:
        sel = request & (opcode == op_code) & (ext_len == layout.length)
        if has_key:
            sel &= known_datatype & (key_len > 0)
        else:
            sel &= (key_len == 0) & (value_len == 0)
        idx = rows[sel]
        if not len(idx):
            continue
        rec = _as_records(_gather(src, ext_start[idx], layout.length), layout)
        if "nmeta" in layout.names:  # legacy extended meta is always 0 (errata E14)
            ok = rec["nmeta"] == 0
            idx, rec = idx[ok], rec[ok]
        if has_key and collections:
            first = src[key_start[idx]]
            ok = first < 0x80  # one-byte LEB128; longer prefixes take the per-frame path
            idx, rec, first = idx[ok], rec[ok], first[ok]
            cols.set("collection_id", idx, first)
            doc_key_start = key_start[idx] + 1
        else:
            doc_key_start = key_start[idx]
        for f in layout.fields:
            if f.name != "nmeta":
                cols.set(f.name, idx, rec[f.name].astype(np.int64))
        cols.op[idx] = _OP_INDEX[op]
        if has_key:
            cols.bin_start["key"][idx] = doc_key_start
            cols.bin_len["key"][idx] = value_start[idx] - doc_key_start
            cols.bin_start["value"][idx] = value_start[idx]
            cols.bin_len["value"][idx] = value_len[idx]
            cols.set("is_json", idx, (datatype[idx] & Datatype.JSON) != 0)
        fast[idx] = True

    # Compressed or xattr-carrying values: only the value itself is decoded frame by frame.
    transform = fast & (value_len > 0) & ((datatype & (_SNAPPY | _XATTR)) != 0)
    transform &= np.isin(opcode, _DOC_OPCODES)
    extra = cols.extra
    base = len(buf)
    value_start_col, value_len_col = cols.bin_start["value"], cols.bin_len["value"]
    xattr_rows = cols.xattrs
    for i, dt, vs, vl in zip(
        *(a.tolist() for a in (np.flatnonzero(transform), datatype[transform],
                               value_start[transform], value_len[transform])),
        strict=True,
    ):  # fmt: skip
        try:
            body, xattrs = decode_value(dt, buf[vs : vs + vl])
        except FieldError:
            fast[i] = False  # the per-frame path reports it, exactly as the iterator does
            continue
        value_start_col[i] = base + len(extra)
        value_len_col[i] = len(body)
        extra += body
        if xattrs is not None:
            xattr_rows.append((i, xattrs))

    for i in np.flatnonzero(~fast).tolist():
        pos = int(starts[i])
        try:
            h = parse_header(buf, pos, base_offset=base_offset)
            event = _read(h, buf, pos, collections)
        except MalformedFrameError as exc:
            errors.append(exc.with_file(file) if file else exc)
            keep[i] = False
            continue
        cols.put_row(i, raw_row(event), base)
    cols.flush()
    marker_v1 = fast & (opcode == Opcode.DCP_SNAPSHOT_MARKER)
    if marker_v1.any():
        rows_v1 = np.flatnonzero(marker_v1).tolist()
        cols.strings["marker_version"][0].extend(rows_v1)
        cols.strings["marker_version"][1].extend(["1"] * len(rows_v1))
    return DecodedBatch(cols.to_table(buf, keep), errors, consumed, fatal)


def _as_header(matrix: Any) -> Any:
    return np.ascontiguousarray(matrix).view(_HEADER_DTYPE).reshape(-1)
