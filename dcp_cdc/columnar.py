"""The DCP decoder, columnar face: a buffer of frames in, one Arrow table out.

Used by the bronze ingest inside ``mapInArrow``. The hot path touches no frame from Python:

1. framing: lengths chain, so it is serial by nature; numpy walks many segments of the
   buffer at once from guessed starts, and a guess counts only once the walk before it
   lands on it (:func:`frame_starts`);
2. the hot messages (plain mutations, deletions, expirations, V1 snapshot markers,
   seqno-advanced) are decoded for all rows at once, by gathering each layout of
   :mod:`dcp_cdc.layouts` as a structured array straight from the buffer;
3. Snappy values are decompressed into one buffer (one cramjam call per value) and XATTR
   sections are split for all values at once; keys, values and xattrs become Arrow views
   onto those buffers, copied once into plain columns;
4. every other frame (system events, responses, anything malformed, ...) goes through the
   iterator face's reader for its opcode, and its event is turned into a row.

Steps 1 to 3 have a compiled form, :mod:`dcp_cdc._native` (``dcp_cdc/_native.c``, built by
``pip install``): one pass over the frames that writes the header and hot-message columns,
decompresses Snappy values into one buffer and splits XATTR sections, and one copy of every
key and value into its Arrow column. It is configured from the same layout tables and decides
nothing the numpy path would decide otherwise; where it is not built (a zip of the sources on
a cluster), the numpy path runs, and tests check the two give the same table.

So both faces read the same layout tables, and a test checks that they agree row for row.
Unsigned 64-bit wire fields are stored as int64 with the same bits (Spark has no unsigned
types): ``0xFFFFFFFFFFFFFFFF`` ("stream forever") reads as -1.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc import layouts, snappy, varint
from dcp_cdc.decoder import _read, parse_header
from dcp_cdc.errors import DecoderUsageError, MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import (
    OPS,
    AddStream,
    Deletion,
    Event,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamRequest,
    UnknownFrame,
)
from dcp_cdc.layouts import Layout
from dcp_cdc.protocol import (
    ALT_MAGICS,
    DATATYPE_MASK,
    HEADER_LEN,
    KNOWN_MAGICS,
    MAX_BODY_LEN,
    RESPONSE_MAGICS,
    STREAM_ID_LEN,
    STREAM_ID_TAG,
    Datatype,
    Magic,
    Opcode,
)
from dcp_cdc.varint import CONTINUATION, read_uleb128_many

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

_PAIR_LISTS = ("failover_log", "high_seqnos")
"""Columns that are lists of pairs of u64 wire values (stored as int64)."""
_NUMERIC = {n: t for n, t in COLUMNS if pa.types.is_integer(t) or pa.types.is_boolean(t)}
_STRINGS = [n for n, t in COLUMNS if pa.types.is_string(t) and n != "op"]
_BINARIES = [n for n, t in COLUMNS if pa.types.is_binary(t)]
_NP_TYPES: dict[pa.DataType, Any] = {
    I64: np.int64,
    I32: np.int32,
    I16: np.int16,
    pa.bool_(): np.bool_,
}

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
        if name in _PAIR_LISTS:
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


# --- framing (spec §1) ---------------------------------------------------------------------

SEGMENT_BYTES = 1 << 15
"""Framing walks a buffer as segments of about this many bytes, all at once (see
:func:`frame_starts`)."""
_SEED_WINDOW = 512  # where a segment's first frame is looked for, from its nominal start
_MIN_LOCKSTEP = 32  # below this many segments still walking, the rest walk one by one
_KNOWN_MAGIC = np.zeros(256, dtype=np.bool_)
_KNOWN_MAGIC[sorted(KNOWN_MAGICS)] = True
_BODY_LEN_AT = layouts.BODY_LEN_OFFSET
_BODY_LEN = struct.Struct(">I").unpack_from  # the u32 at _BODY_LEN_AT


def _body_len(buf: bytes, pos: int) -> int:
    """The body length in the header at ``buf[pos:]`` (spec §1.1)."""
    return int(_BODY_LEN(buf, pos + _BODY_LEN_AT)[0])


def _byte_view(buf: Any, fmt: str) -> Any:
    """A no-copy view holding, at index ``p``, the ``fmt`` value that starts at byte ``p``.

    Fields of frames sit at arbitrary byte offsets; indexing this view with an array of
    offsets reads them all in one gather (unaligned reads are numpy's business).
    """
    dtype = np.dtype(fmt)
    count = max(len(buf) - dtype.itemsize + 1, 0)
    return np.ndarray((count,), dtype=dtype, buffer=buf, strides=(1,))


def _walk(buf: bytes, pos: int, stop: int) -> tuple[list[int], int, bool]:
    """Frames one by one from ``pos`` while they start before ``stop``.

    Returns the starts, where the walk ended (the first start at or after ``stop``, or the
    frame that could not be framed) and whether it halted there (unknown magic, impossible
    length, or a frame that does not fit in ``buf``).
    """
    found: list[int] = []
    append = found.append
    n = len(buf)
    known = KNOWN_MAGICS
    body_len, at = _BODY_LEN, _BODY_LEN_AT
    while pos < stop:
        if pos + HEADER_LEN > n:
            return found, pos, True
        end = pos + HEADER_LEN + body_len(buf, pos + at)[0]
        if buf[pos] not in known or end - pos - HEADER_LEN > MAX_BODY_LEN or end > n:
            return found, pos, True
        append(pos)
        pos = end
    return found, pos, False


def frame_starts(
    buf: bytes,
    *,
    final: bool,
    base_offset: int = 0,
    segment: int = SEGMENT_BYTES,
    native: bool | None = None,
) -> tuple[npt.NDArray[np.int64], int, MalformedFrameError | None]:
    """Start of every whole frame, the bytes they span, and the error that stopped framing.

    Lengths chain, so framing is serial by nature: the compiled pass walks the buffer frame
    by frame. Without it (``native=False``, or not built), a long buffer is cut into segments
    of ``segment`` bytes; each segment's first frame is guessed and all segments are walked at
    once with numpy. A guess is kept only when the walk of the segment before it lands on it
    exactly; a segment whose guess was wrong is walked again, one frame at a time, from where
    the previous walk landed. So the starts are always those of one walk from byte 0.
    """
    n = len(buf)
    if _use_native(native):
        walked, pos, halted = _native_module().walk(buf, 0, n)
        starts = np.frombuffer(walked, dtype=np.int64)
    elif n >= 4 * segment:
        starts, pos, halted = _walk_segments(buf, segment)
    else:
        found, pos, halted = _walk(buf, 0, n)
        starts = np.array(found, dtype=np.int64)
    fatal: MalformedFrameError | None = None
    unframeable = (
        halted
        and pos + HEADER_LEN <= n
        and (buf[pos] not in KNOWN_MAGICS or _body_len(buf, pos) > MAX_BODY_LEN)
    )
    if unframeable:
        try:
            parse_header(buf, pos, base_offset=base_offset)
        except MalformedFrameError as exc:
            fatal = exc
    if fatal is None and final and pos < n:
        opcode = buf[pos + 1] if n - pos > 1 else None
        needed = HEADER_LEN + _body_len(buf, pos) if n - pos >= HEADER_LEN else None
        fatal = TruncatedFrameError(
            offset=base_offset + pos, available=n - pos, needed=needed, opcode=opcode
        )
    return starts, pos, fatal


def _is_magic(values: Any) -> Any:
    return _KNOWN_MAGIC[values]


def _segment_seeds(buf: bytes, segment: int) -> Any:
    """A guess of the first frame start in each segment after the first (sorted, unique).

    The guess is the first byte of the segment's window with a known magic whose length
    leads to another known magic (or exactly to the end of the buffer).
    """
    n = len(buf)
    window = min(_SEED_WINDOW, segment)
    bounds = np.arange(segment, n - window - HEADER_LEN + 1, segment, dtype=np.int64)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    flat = np.flatnonzero(_is_magic(u8[bounds[:, None] + np.arange(window, dtype=np.int64)]))
    seg = flat // window
    cand = bounds[seg] + flat % window
    body = _byte_view(buf, ">u4")[cand + _BODY_LEN_AT].astype(np.int64)
    nxt = cand + HEADER_LEN + body
    ok = (body <= MAX_BODY_LEN) & ((nxt == n) | (nxt + HEADER_LEN <= n))
    inner = np.flatnonzero(ok & (nxt < n))
    ok[inner] = _is_magic(u8[nxt[inner]])
    _, first = np.unique(seg[ok], return_index=True)
    return cand[ok][first]


def _walk_segments(buf: bytes, segment: int) -> tuple[npt.NDArray[np.int64], int, bool]:
    n = len(buf)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    be32 = _byte_view(buf, ">u4")
    seeds = _segment_seeds(buf, segment)
    seg_start = np.concatenate([np.zeros(1, dtype=np.int64), seeds])
    seg_end = np.concatenate([seeds, np.array([n], dtype=np.int64)])
    k = len(seg_start)
    # Walk every segment at once; a segment stops where it crosses its end or halts.
    ids, pos, end = np.arange(k), seg_start.copy(), seg_end.copy()
    landed = np.zeros(k, dtype=np.int64)
    halted = np.zeros(k, dtype=np.bool_)
    resume = np.full(k, -1, dtype=np.int64)  # where a segment's walk goes on one by one
    steps: list[tuple[Any, Any]] = []
    while len(ids):
        if len(ids) < min(_MIN_LOCKSTEP, k // 2):  # a step costs as much for few as for many
            resume[ids] = pos
            break
        fits = pos + HEADER_LEN <= n
        at = pos if fits.all() else np.where(fits, pos, 0)
        frame_end = at + HEADER_LEN + be32[at + _BODY_LEN_AT].astype(np.int64)
        ok = fits & _is_magic(u8[at]) & (frame_end - at - HEADER_LEN <= MAX_BODY_LEN)
        ok &= frame_end <= n
        if not ok.all():
            landed[ids[~ok]] = pos[~ok]
            halted[ids[~ok]] = True
            ids, pos, end, frame_end = ids[ok], pos[ok], end[ok], frame_end[ok]
        steps.append((ids, pos))
        crossed = frame_end >= end
        if crossed.any():
            landed[ids[crossed]] = frame_end[crossed]
            ids, pos, end = ids[~crossed], frame_end[~crossed], end[~crossed]
        else:
            pos = frame_end
    # Segment i's j-th frame goes to first[i] + j: the frames in walk order, no sort.
    counts = np.zeros(k, dtype=np.int64)
    for step_ids, _ in steps:
        counts[step_ids] += 1
    first = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    walked = np.empty(int(first[-1]), dtype=np.int64)
    for j, (step_ids, step_pos) in enumerate(steps):
        walked[first[step_ids] + j] = step_pos
    # Keep the segments whose guess the previous walk landed on; re-walk the others.
    parts: list[Any] = []
    expected = 0
    for i in range(k):
        if int(seg_start[i]) == expected:
            parts.append(walked[first[i] : first[i + 1]])
            stop, halt = int(landed[i]), bool(halted[i])
            if resume[i] >= 0:
                found, stop, halt = _walk(buf, int(resume[i]), int(seg_end[i]))
                parts.append(np.array(found, dtype=np.int64))
        elif expected >= seg_end[i]:
            continue  # a frame spans the whole segment
        else:
            found, stop, halt = _walk(buf, expected, int(seg_end[i]))
            parts.append(np.array(found, dtype=np.int64))
        if halt:
            return np.concatenate(parts), stop, True
        expected = stop
    return np.concatenate(parts), expected, False


# --- columns -------------------------------------------------------------------------------

_I32 = np.dtype("<i4")


def _bitmap(mask: Any) -> pa.Buffer:
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def _numeric(arrow_type: pa.DataType, values: Any, valid: Any = None) -> pa.Array:
    """An Arrow array over a numpy array (no copy for numbers); ``valid`` None = no nulls."""
    data = _bitmap(values) if arrow_type == pa.bool_() else pa.py_buffer(values)
    validity = None if valid is None or valid.all() else _bitmap(valid)
    return pa.Array.from_buffers(arrow_type, len(values), [validity, data])


_AR12 = np.arange(12, dtype=np.int64)


def _views(sources: list[Any], src: Any, start: Any, length: Any) -> pa.Array:
    """A binary view array of byte ranges: row i is ``sources[src[i]][start[i]:][:length[i]]``,
    null where ``src[i] < 0``. No byte is copied except the 12 a short value holds inline."""
    n = len(src)
    null = src < 0
    lens = np.where(null, 0, length).astype(_I32)
    views = np.zeros((n, 4), dtype=_I32)
    views[:, 0] = lens
    short = np.flatnonzero((lens > 0) & (lens <= 12))
    long = np.flatnonzero(lens > 12)
    for s, source in enumerate(sources):
        sel = short[src[short] == s]
        if len(sel):
            data = np.frombuffer(source, dtype=np.uint8)
            inline = data[np.minimum(start[sel, None] + _AR12, len(data) - 1)]
            inline[_AR12[None, :] >= lens[sel, None]] = 0  # inline values are zero-padded
            views[sel, 1:4] = np.ascontiguousarray(inline).view(_I32)
        sel = long[src[long] == s]
        if len(sel):
            views[sel, 1] = _byte_view(source, "<i4")[start[sel]]  # the 4-byte prefix
    views[long, 2] = src[long]
    views[long, 3] = start[long]
    validity = _bitmap(~null) if null.any() else None
    buffers = [validity, pa.py_buffer(views), *(_buffer(s) for s in sources)]
    return pa.Array.from_buffers(pa.binary_view(), n, buffers)


def _buffer(data: Any) -> pa.Buffer:
    return data if isinstance(data, pa.Buffer) else pa.py_buffer(data)


def _gathered(
    arrow_type: pa.DataType, sources: list[Any], src: Any, start: Any, length: Any
) -> pa.Array:
    """:func:`_views` copied into a plain binary (or, of text known to be UTF-8, string)
    column by the compiled pass: one copy, no views."""
    n = len(src)
    offsets = np.empty(n + 1, dtype=_I32)
    src = np.ascontiguousarray(src, dtype=np.int64)
    data = _native_module().gather(
        tuple(sources),
        src,
        np.ascontiguousarray(start, dtype=np.int64),
        np.ascontiguousarray(length, dtype=np.int64),
        offsets,
        _allocate,
    )
    null = src < 0
    validity = _bitmap(~null) if null.any() else None
    return pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(offsets), data])


def _pooled(n: int, dtype: Any, *, zeroed: bool = True) -> Any:
    """A numpy array in a pyarrow memory pool (the default, mimalloc, keeps some pages; see
    :func:`keep_freed_memory`). Not ``zeroed``: for what the compiled pass writes in full, or
    reads only where it wrote."""
    itemsize = np.dtype(dtype).itemsize
    values = np.frombuffer(_allocate(n * itemsize), dtype=dtype, count=n)
    if zeroed:
        values.fill(0)
    return values


class _Columns:
    """Column arrays for n rows, filled by the vectorised paths and by per-frame rows.

    Numbers live in numpy arrays (allocated when first set); binary columns are byte ranges
    into ``sources`` (the frames' buffer, decompressed values, per-frame bytes) that become
    Arrow binary views, copied into plain binary columns once at the end.
    """

    def __init__(self, n: int, buf: bytes, *, native: bool) -> None:
        self.n = n
        self.native = native
        self.values: dict[str, Any] = {}
        self.valid: dict[str, Any] = {}  # absent: every row valid
        self.op = np.zeros(n, dtype=np.int8)
        self.strings: dict[str, tuple[list[int], list[str]]] = {c: ([], []) for c in _STRINGS}
        self.constant_texts: dict[str, tuple[Any, str]] = {}  # rows (a mask) and their text
        self.sources: list[Any] = [buf]
        self.bin_src: dict[str, Any] = {}
        self.bin_start: dict[str, Any] = {}
        self.bin_len: dict[str, Any] = {}
        self.xattr_rows = np.zeros(n, dtype=np.bool_)
        # (entry rows, keys, items, the map offsets of these entries alone if known)
        self.xattr_entries: list[tuple[Any, pa.Array, pa.Array, Any]] = []
        self.failover: list[tuple[int, list[tuple[int, int]]]] = []
        self.high_seqnos: list[tuple[int, list[tuple[int, int]]]] = []
        self.flag_names: tuple[list[int], list[list[str]]] = ([], [])
        self.extra = bytearray()
        self.pending: dict[str, tuple[list[int], list[Any]]] = {
            name: ([], []) for name, _ in COLUMNS
        }
        self.bin_pending_len: dict[str, list[int]] = {name: [] for name in _BINARIES}

    def full(self, name: str, values: Any) -> None:
        """Every row's value of a numeric column."""
        self.values[name] = np.ascontiguousarray(values, dtype=_NP_TYPES[_NUMERIC[name]])

    def set(self, name: str, rows: Any, values: Any) -> None:
        if name not in self.values:
            self.values[name] = np.zeros(self.n, dtype=_NP_TYPES[_NUMERIC[name]])
            self.valid[name] = np.zeros(self.n, dtype=np.bool_)
        elif name not in self.valid:
            self.valid[name] = np.ones(self.n, dtype=np.bool_)
        self.values[name][rows] = values
        self.valid[name][rows] = True

    def set_bytes(self, name: str, rows: Any, source: int, start: Any, length: Any) -> None:
        if name not in self.bin_src:
            self.bin_src[name] = np.full(self.n, -1, dtype=np.int64)
            self.bin_start[name] = np.zeros(self.n, dtype=np.int64)
            self.bin_len[name] = np.zeros(self.n, dtype=np.int64)
        self.bin_src[name][rows] = source
        self.bin_start[name][rows] = start
        self.bin_len[name][rows] = length

    def add_source(self, data: Any) -> int:
        self.sources.append(data)
        return len(self.sources) - 1

    def put_row(self, i: int, row: dict[str, Any]) -> None:
        """Queue one per-frame row; :meth:`flush` writes the queue column by column."""
        self.op[i] = _OP_INDEX[row["op"]]
        pending = self.pending
        for name, value in row.items():
            if value is None or name == "op":
                continue
            rows, values = pending[name]
            rows.append(i)
            if name in self.bin_pending_len:
                values.append(len(self.extra))
                self.bin_pending_len[name].append(len(value))
                self.extra += value
            else:
                values.append(value)

    def flush(self) -> None:
        source = self.add_source(bytes(self.extra))  # per-frame bytes (maybe none)
        for name, (rows, values) in self.pending.items():
            if not rows:
                continue
            if name in _NUMERIC:
                dtype = _NP_TYPES[_NUMERIC[name]]
                if dtype is np.int64:
                    arr = np.array(values, dtype=np.uint64).view(np.int64)
                else:
                    arr = np.array(values, dtype=dtype)
                self.set(name, rows, arr)
            elif name in self.strings:
                self.strings[name][0].extend(rows)
                self.strings[name][1].extend(values)
            elif name in self.bin_pending_len:
                self.set_bytes(name, rows, source, values, self.bin_pending_len[name])
            elif name == "xattrs":
                self._add_xattr_dicts(rows, values)
            elif name in _PAIR_LISTS:
                signed = [[(to_signed64(u), to_signed64(s)) for u, s in log] for log in values]
                pairs = self.failover if name == "failover_log" else self.high_seqnos
                pairs.extend(zip(rows, signed, strict=True))
            elif name == "stream_flag_names":
                self.flag_names[0].extend(rows)
                self.flag_names[1].extend(values)

    def _add_xattr_dicts(self, rows: list[int], mappings: list[dict[str, str]]) -> None:
        entry_rows = np.repeat(np.array(rows, dtype=np.int64), [len(m) for m in mappings])
        keys = pa.array([k for m in mappings for k in m], type=pa.string())
        items = pa.array([v for m in mappings for v in m.values()], type=pa.string())
        self.add_xattrs(np.array(rows, dtype=np.int64), entry_rows, keys, items)

    def add_xattrs(
        self, rows: Any, entry_rows: Any, keys: pa.Array, items: pa.Array, offsets: Any = None
    ) -> None:
        """``rows`` carry xattrs (perhaps none); entry j is ``keys[j]: items[j]`` of row
        ``entry_rows[j]``, in the order of the row's pairs; ``offsets``, if given, are the map
        offsets of these entries (n + 1: where each row's entries start)."""
        self.xattr_rows[rows] = True
        if len(entry_rows):
            self.xattr_entries.append((entry_rows, keys, items, offsets))

    def to_table(self, keep: Any) -> pa.Table:
        n = self.n
        arrays: dict[str, pa.Array] = {}
        arrays["op"] = _OPS_ARRAY.take(_numeric(pa.int8(), self.op))
        nulls = _Nulls(n)
        for name, arrow_type in _NUMERIC.items():
            if name in self.values:
                arrays[name] = _numeric(arrow_type, self.values[name], self.valid.get(name))
            else:
                arrays[name] = nulls.of(arrow_type)
        for name, (rows, texts) in self.strings.items():
            if name in self.constant_texts:
                mask, text = self.constant_texts[name]
                if not rows:
                    arrays[name] = _constant_text(mask, text)
                    continue
                more = np.flatnonzero(mask).tolist()
                rows, texts = rows + more, texts + [text] * len(more)
            arrays[name] = _sparse(n, rows, texts) if rows else nulls.of(pa.string())
        for name in _BINARIES:
            if name not in self.bin_src:
                arrays[name] = nulls.of(pa.binary())
                continue
            ranges = (self.sources, self.bin_src[name], self.bin_start[name], self.bin_len[name])
            if self.native:
                arrays[name] = _gathered(pa.binary(), *ranges)
            else:
                arrays[name] = _views(*ranges).cast(pa.binary())
        arrays["xattrs"] = self._xattrs()
        arrays["failover_log"] = _sparse_list(n, self.failover, FAILOVER_ENTRY_TYPE)
        arrays["high_seqnos"] = _sparse_list(n, self.high_seqnos, HIGH_SEQNO_TYPE)
        arrays["stream_flag_names"] = _sparse_names(n, *self.flag_names)
        table = pa.table([arrays[c] for c, _ in COLUMNS], schema=ARROW_SCHEMA)
        return table if keep.all() else table.filter(_numeric(pa.bool_(), keep))

    def _xattrs(self) -> pa.Array:
        n = self.n
        if not self.xattr_rows.any():
            return pa.nulls(n, XATTRS_TYPE)
        if len(self.xattr_entries) == 1 and self.xattr_entries[0][3] is not None:
            _, keys, items, offsets = self.xattr_entries[0]
        elif self.xattr_entries:
            offsets = np.zeros(n + 1, dtype=_I32)
            entry_rows = np.concatenate([e[0] for e in self.xattr_entries])
            keys = pa.concat_arrays([e[1] for e in self.xattr_entries])
            items = pa.concat_arrays([e[2] for e in self.xattr_entries])
            if (np.diff(entry_rows) < 0).any():  # in row order (a row's pairs keep theirs)
                order = np.argsort(entry_rows, kind="stable")
                keys, items = keys.take(order), items.take(order)
            np.cumsum(np.bincount(entry_rows, minlength=n), out=offsets[1:])
        else:
            offsets = np.zeros(n + 1, dtype=_I32)
            keys = items = pa.array([], type=pa.string())
        return pa.MapArray.from_arrays(
            _numeric(pa.int32(), offsets),
            keys,
            items,
            type=XATTRS_TYPE,
            mask=_numeric(pa.bool_(), ~self.xattr_rows),
        )


_OPS_ARRAY = pa.array(OPS, type=pa.string())


class _Nulls:
    """All-null columns of n rows that share one zeroed buffer (``pa.nulls`` zeroes one per
    column, and a batch of hot messages leaves some thirty columns null)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.zeros: pa.Buffer | None = None

    def of(self, arrow_type: pa.DataType) -> pa.Array:
        flat = pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type)
        if not (flat or pa.types.is_string(arrow_type) or pa.types.is_binary(arrow_type)):
            return pa.nulls(self.n, arrow_type)
        if self.zeros is None:  # enough for validity, int64 values or int32 offsets
            self.zeros = pa.py_buffer(np.zeros(8 * self.n + 8, dtype=np.uint8))
        buffers = [self.zeros] * (2 if flat else 3)
        return pa.Array.from_buffers(arrow_type, self.n, buffers, null_count=self.n)


def _constant_text(mask: Any, text: str) -> pa.Array:
    """A string column holding ``text`` where ``mask`` is set and nulls elsewhere."""
    encoded = text.encode()
    offsets = np.zeros(len(mask) + 1, dtype=_I32)
    np.cumsum(mask, out=offsets[1:])
    count = int(offsets[-1])
    offsets *= len(encoded)
    data = pa.py_buffer(encoded * count)
    return pa.Array.from_buffers(
        pa.string(), len(mask), [_bitmap(mask), pa.py_buffer(offsets), data]
    )


def _sparse(n: int, rows: list[int], texts: list[str]) -> pa.Array:
    """An n-row string column holding ``texts`` at ``rows`` and nulls elsewhere."""
    if not rows:
        return pa.nulls(n, pa.string())
    indices = np.zeros(n, dtype=_I32)
    indices[rows] = np.arange(len(rows), dtype=_I32)
    valid = np.zeros(n, dtype=np.bool_)
    valid[rows] = True
    values = pa.array(texts, type=pa.string())
    return values.take(_numeric(pa.int32(), indices, valid))


def _sparse_names(n: int, rows: list[int], names: list[list[str]]) -> pa.Array:
    """An n-row list-of-strings column holding ``names`` at ``rows`` and nulls elsewhere."""
    if not rows:
        return pa.nulls(n, FLAG_NAMES_TYPE)
    counts = np.zeros(n, dtype=_I32)
    counts[rows] = [len(v) for v in names]
    valid = np.zeros(n, dtype=np.bool_)
    valid[rows] = True
    offsets = np.zeros(n + 1, dtype=_I32)
    np.cumsum(counts, out=offsets[1:])
    order = np.argsort(np.array(rows, dtype=np.int64), kind="stable")
    values = pa.array([name for i in order.tolist() for name in names[i]], type=pa.string())
    return pa.ListArray.from_arrays(
        _numeric(pa.int32(), offsets), values, mask=_numeric(pa.bool_(), ~valid)
    )


def _sparse_list(
    n: int, entries: Iterable[tuple[int, list[tuple[int, int]]]], entry: pa.StructType
) -> pa.Array:
    """A list column of ``n`` rows of pairs (``entry``'s two fields), null but at ``entries``."""
    counts = np.zeros(n, dtype=_I32)
    mask = np.ones(n, dtype=np.bool_)
    firsts: list[int] = []
    seconds: list[int] = []
    for i, log in sorted(entries, key=lambda e: e[0]):
        counts[i] = len(log)
        mask[i] = False
        firsts.extend(u for u, _ in log)
        seconds.extend(s for _, s in log)
    if mask.all():
        return pa.nulls(n, pa.list_(entry))
    offsets = np.zeros(n + 1, dtype=_I32)
    np.cumsum(counts, out=offsets[1:])
    fields = list(entry)
    values = pa.StructArray.from_arrays(
        [pa.array(firsts, fields[0].type), pa.array(seconds, fields[1].type)], fields=fields
    )
    return pa.ListArray.from_arrays(
        _numeric(pa.int32(), offsets), values, mask=_numeric(pa.bool_(), mask)
    )


# --- values: Snappy and XATTRs for many frames at once (spec §2) ----------------------------

_MAX_XATTR_PAIRS = 64  # more pairs than this in one value: that frame is decoded alone


@dataclass
class _Values:
    """Decoded document values of m frames: ``ok`` those decoded here (the others go through
    the per-frame path); body ``i`` is ``sources[src[i]][start[i]:][:length[i]]``."""

    ok: Any
    src: Any
    start: Any
    length: Any
    sources: list[Any]
    xattr_rows: Any
    entry_rows: Any
    keys: pa.Array
    items: pa.Array


def _decode_values(buf: bytes, start: Any, length: Any, datatype: Any) -> _Values:
    """Snappy then XATTRs (the order of spec §2) for non-empty values of known datatype."""
    m = len(start)
    ok = np.ones(m, dtype=np.bool_)
    src = np.zeros(m, dtype=np.int64)
    start = start.copy()
    length = length.copy()
    sources: list[Any] = [buf]
    compressed = np.flatnonzero((datatype & _SNAPPY) != 0)
    if len(compressed):
        # The declared length of each block, judged as snappy.decompress judges it.
        declared, _, plausible = read_uleb128_many(buf, start[compressed], length[compressed])
        plausible &= snappy.plausible(declared, length[compressed])
        ok[compressed[~plausible]] = False
        rows = compressed[plausible]
        sizes = declared[plausible]
        at = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(sizes, out=at[1:])
        out, written = snappy.decompress_many(
            buf,
            start[rows].tolist(),
            length[rows].tolist(),
            at[:-1].tolist(),
            sizes.tolist(),
            int(at[-1]),
        )
        ok[rows[np.array(written, dtype=np.int64) != sizes]] = False
        sources.append(out)
        src[rows], start[rows], length[rows] = 1, at[:-1], sizes
    xattr_rows = np.flatnonzero(ok & ((datatype & _XATTR) != 0))
    entries: list[tuple[Any, pa.Array, pa.Array]] = []
    for s, source in enumerate(sources):
        rows = xattr_rows[src[xattr_rows] == s]
        if not len(rows):
            continue
        split = _split_xattrs(source, start[rows], length[rows])
        ok[rows[~split.ok]] = False
        start[rows], length[rows] = split.start, split.length
        entries.append((rows[split.entry_rows], split.keys, split.items))
    has_xattrs = np.zeros(m, dtype=np.bool_)
    has_xattrs[xattr_rows] = True
    has_xattrs &= ok
    if entries:
        entry_rows = np.concatenate([e[0] for e in entries])
        keys = pa.concat_arrays([e[1] for e in entries])
        items = pa.concat_arrays([e[2] for e in entries])
        keep = ok[entry_rows]
        if not keep.all():
            mask = _numeric(pa.bool_(), keep)
            entry_rows, keys, items = entry_rows[keep], keys.filter(mask), items.filter(mask)
    else:
        entry_rows = np.zeros(0, dtype=np.int64)
        keys = items = pa.array([], type=pa.string())
    return _Values(ok, src, start, length, sources, has_xattrs, entry_rows, keys, items)


@dataclass
class _Split:
    ok: Any
    start: Any
    length: Any
    entry_rows: Any
    keys: pa.Array
    items: pa.Array


def _split_xattrs(source: Any, start: Any, length: Any) -> _Split:
    """:func:`dcp_cdc.xattrs.split_xattrs` for many values of one buffer: where a value is
    not exactly what it accepts, ``ok`` is False and the per-frame path reports why."""
    m = len(start)
    be32 = _byte_view(source, ">u4")
    ok = length >= 4
    total = np.zeros(m, dtype=np.int64)
    total[ok] = be32[start[ok]]
    end = start + 4 + total
    ok &= end <= start + length
    # Pair by pair, every value at once: u32 pair length, then key NUL value NUL.
    rows = np.flatnonzero(ok)
    pos, stop = start[rows] + 4, end[rows]
    found: list[tuple[Any, Any, Any]] = []
    for _ in range(_MAX_XATTR_PAIRS):
        live = pos < stop
        rows, pos, stop = rows[live], pos[live], stop[live]
        if not len(rows):
            break
        fits = pos + 4 <= stop
        ok[rows[~fits]] = False
        rows, pos, stop = rows[fits], pos[fits], stop[fits]
        size = be32[pos].astype(np.int64)
        fits = (pos + 4 + size <= stop) & (size >= 2)
        ok[rows[~fits]] = False
        rows, pos, stop, size = rows[fits], pos[fits], stop[fits], size[fits]
        found.append((rows, pos + 4, size))
        pos = pos + 4 + size
    ok[rows[pos < stop]] = False  # more pairs than the vectorised walk takes
    if found:
        entry_rows = np.concatenate([f[0] for f in found])
        pair_start = np.concatenate([f[1] for f in found])
        pair_len = np.concatenate([f[2] for f in found])
    else:
        entry_rows = pair_start = pair_len = np.zeros(0, dtype=np.int64)
    keys, items, good = _pair_texts(source, entry_rows, pair_start, pair_len)
    ok[entry_rows[~good]] = False
    keep = ok[entry_rows]
    order = np.flatnonzero(keep)
    order = order[np.argsort(entry_rows[order], kind="stable")]  # row order, pairs in order
    entry_rows = entry_rows[order]
    indices = _numeric(pa.int64(), order)
    keys, items = keys.take(indices), items.take(indices)
    if len(entry_rows) > 1 and (np.diff(entry_rows) == 0).any():
        ok[_duplicate_key_rows(entry_rows, keys)] = False
    return _Split(ok, end, start + length - end, entry_rows, keys, items)


def _pair_texts(source: Any, rows: Any, start: Any, length: Any) -> tuple[Any, Any, Any]:
    """Key and value text of each ``key NUL value NUL`` pair; ``good`` False where a pair is
    not that (or not UTF-8); keys and values are then empty strings for those pairs."""
    n = len(rows)
    if n == 0:
        empty = pa.array([], type=pa.string())
        return empty, empty, np.zeros(0, dtype=np.bool_)
    # The pairs side by side in one buffer (one copy); NUL bytes are found for all at once.
    zero = np.zeros(n, dtype=np.int64)
    pairs = _views([source], zero, start, length).cast(pa.binary())
    offsets = np.frombuffer(pairs.buffers()[1], dtype=_I32)[: n + 1].astype(np.int64)
    data = pairs.buffers()[2]  # every pair has at least 2 bytes: never empty
    raw = np.frombuffer(data, dtype=np.uint8)
    nuls = np.flatnonzero(raw[: offsets[-1]] == 0)
    first = np.searchsorted(nuls, offsets[:-1])
    count = np.searchsorted(nuls, offsets[1:]) - first
    sep = nuls[np.minimum(first, max(len(nuls) - 1, 0))] - offsets[:-1] if len(nuls) else zero
    last = raw[offsets[1:] - 1]
    good = (count == 2) & (last == 0) & (sep >= 1)  # exactly: key (non-empty) NUL value NUL
    sep = np.where(good, sep, 0)
    value_len = np.where(good, length - sep - 2, 0)
    sources = [data]
    key_views = _views(sources, zero, offsets[:-1], sep)
    value_views = _views(sources, zero, offsets[:-1] + sep + 1, value_len)
    try:
        return key_views.cast(pa.string()), value_views.cast(pa.string()), good
    except pa.ArrowInvalid:  # some pair is not UTF-8: find which, per pair (rare)
        utf8 = np.array(
            [
                _is_utf8(k) and _is_utf8(v)
                for k, v in zip(
                    key_views.cast(pa.binary()).to_pylist(),
                    value_views.cast(pa.binary()).to_pylist(),
                    strict=True,
                )
            ],
            dtype=np.bool_,
        )
        good &= utf8
        sep = np.where(good, sep, 0)
        value_len = np.where(good, value_len, 0)
        key_views = _views(sources, zero, offsets[:-1], sep)
        value_views = _views(sources, zero, offsets[:-1] + sep + 1, value_len)
        return key_views.cast(pa.string()), value_views.cast(pa.string()), good


def _is_utf8(data: bytes | None) -> bool:
    try:
        (data or b"").decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _duplicate_key_rows(entry_rows: Any, keys: pa.Array) -> Any:
    """Rows whose key repeats; ``entry_rows`` is sorted, so a row's keys are side by side:
    compare each with the one ``d`` entries back, for growing ``d`` while rows are that long."""
    repeated = np.zeros(len(entry_rows), dtype=np.bool_)
    for d in range(1, _MAX_XATTR_PAIRS):
        at = np.flatnonzero(entry_rows[d:] == entry_rows[:-d])
        if not len(at):
            break
        same = pc.equal(keys.take(at + d), keys.take(at)).to_numpy(zero_copy_only=False)
        repeated[at[same] + d] = True
    return entry_rows[repeated]


# --- decoding ------------------------------------------------------------------------------

_HEADER_DTYPE = layouts.HEADER.numpy_dtype()
_LAYOUT_DTYPES: dict[str, Any] = {}


def _records(buf: bytes, at: Any, layout: Layout) -> Any:
    """The ``layout`` section at each offset ``at``, as a structured array (one gather)."""
    dtype = _LAYOUT_DTYPES.get(layout.name)
    if dtype is None:
        dtype = _LAYOUT_DTYPES[layout.name] = layout.numpy_dtype()
    return _byte_view(buf, f"V{layout.length}")[at].view(dtype)


_SNAPPY = int(Datatype.SNAPPY)
_XATTR = int(Datatype.XATTR)
_DOC_OPCODES = [int(Opcode.DCP_MUTATION), int(Opcode.DCP_DELETION), int(Opcode.DCP_EXPIRATION)]
_ALT = sorted(int(m) for m in ALT_MAGICS)
_SERVER_REQUEST = int(Magic.SERVER_REQUEST)  # duplex, server-initiated: the per-frame path
_UNKNOWN_DATATYPE_BITS = 0xFF & ~DATATYPE_MASK
_RESPONSE = sorted(int(m) for m in RESPONSE_MAGICS)

# Hot messages decoded for all rows at once: (opcode, extras layout, op, has a document key).
_FAST = (
    (Opcode.DCP_MUTATION, layouts.MUTATION, Mutation.op, True),
    (Opcode.DCP_DELETION, layouts.DELETION_V1, Deletion.op, True),
    (Opcode.DCP_DELETION, layouts.DELETION_V2, Deletion.op, True),
    (Opcode.DCP_EXPIRATION, layouts.EXPIRATION, Expiration.op, True),
    (Opcode.DCP_SNAPSHOT_MARKER, layouts.SNAPSHOT_MARKER_V1, SnapshotMarker.op, False),
    (Opcode.DCP_SEQNO_ADVANCED, layouts.SEQNO_ADVANCED, SeqnoAdvanced.op, False),
)


# --- the compiled pass --------------------------------------------------------------------

_compiled: Any
try:
    _compiled = importlib.import_module("dcp_cdc._native")
except ImportError:  # not built (e.g. the sources shipped as a zip): the numpy path
    _compiled = None

NATIVE = _compiled is not None
"""Whether the compiled pass is built; :func:`decode_batch` uses it unless told not to."""

_NATIVE_FIXED = (
    "offset", "frame_len", "magic", "opcode", "vbucket", "status", "opaque", "cas",
    "datatype", "stream_id", "collection_id", "is_json",
)  # fmt: skip
"""The compiled pass's column slots, in the order of its enum (``C_OFFSET`` ...)."""
_ALWAYS_VALID = frozenset(("offset", "frame_len", "magic", "opcode", "opaque", "cas", "datatype"))
"""Header columns every frame has (the compiled pass is given no validity for them)."""
_NATIVE_COLUMNS = _NATIVE_FIXED + tuple(
    dict.fromkeys(f.name for _, layout, _, _ in _FAST for f in layout.fields if f.name != "nmeta")
)
_HEADER_FIELDS = (
    "magic", "opcode", "key_len", "ext_len", "datatype", "vbucket_or_status", "body_len",
    "opaque", "cas",
)  # fmt: skip
"""The header fields in the order of the compiled pass's enum (``H_MAGIC`` ...)."""


def _table256(members: Iterable[int]) -> bytes:
    table = bytearray(256)
    for m in members:
        table[int(m)] = 1
    return bytes(table)


def _native_rules() -> bytes:
    """:data:`_FAST` as the compiled pass reads it: per rule opcode, extras length, has a key,
    where ``nmeta`` is (-1: none), op index, field count, then (offset, size, column slot)."""
    rules: list[int] = []
    for op_code, layout, op, has_key in _FAST:
        fields = [f for f in layout.fields if f.name != "nmeta"]
        nmeta_at = layout.offset_of("nmeta") if "nmeta" in layout.names else -1
        rules += [int(op_code), layout.length, int(has_key), nmeta_at, _OP_INDEX[op], len(fields)]
        for f in fields:
            rules += [f.offset, f.size, _NATIVE_COLUMNS.index(f.name)]
    return struct.pack(f"={len(rules)}i", *rules)


def _header_field(name: str) -> tuple[int, int]:
    found = next(f for f in layouts.HEADER.fields if f.name == name)
    return found.offset, found.size


def _configure_native(native: Any) -> None:
    """Hand the compiled pass the header layout, the hot messages' layouts and the protocol
    constants: it holds no table of its own."""
    header = [v for name in _HEADER_FIELDS for v in _header_field(name)]
    native.configure(
        header_len=HEADER_LEN,
        header=struct.pack(f"={len(header)}i", *header),
        known_magic=_table256(KNOWN_MAGICS),
        alt_magic=_table256(ALT_MAGICS),
        response_magic=_table256(RESPONSE_MAGICS),
        doc_opcode=_table256(_DOC_OPCODES),
        server_request=_SERVER_REQUEST,
        stream_id_tag=STREAM_ID_TAG,
        stream_id_frame_len=1 + STREAM_ID_LEN,
        max_body_len=MAX_BODY_LEN,
        snappy_bit=_SNAPPY,
        xattr_bit=_XATTR,
        json_bit=int(Datatype.JSON),
        unknown_datatype_bits=_UNKNOWN_DATATYPE_BITS,
        max_uncompressed=snappy.MAX_UNCOMPRESSED,
        max_ratio=snappy.MAX_RATIO,
        max_ratio_slack=snappy.RATIO_SLACK,
        varint_max_bytes=varint.MAX_BYTES,
        varint_max_value=varint.MAX_VALUE,
        varint_continuation=CONTINUATION,
        max_xattr_pairs=_MAX_XATTR_PAIRS,
        rules=_native_rules(),
    )


if _compiled is not None:
    _configure_native(_compiled)


_pool: pa.MemoryPool | None = None  # where the compiled pass's columns are allocated


def keep_freed_memory() -> bool:
    """Keep this process's freed memory for reuse rather than handing it back to the system.

    A batch is a 64 MiB buffer decoded into some 100 MiB of fresh columns, and fresh memory
    costs a page fault per page when first written: on a virtual machine that is more than
    the decode itself (a 1M-frame capture: 0.26 s with the faults, 0.20 s without). With
    this, glibc keeps freed blocks (no ``mmap`` for large ones, no trim of the heap) and the
    compiled pass allocates through pyarrow's system pool, so each batch reuses the pages of
    the one before. The cost: the process keeps its peak memory. For decode workers (the
    bronze tasks call it); process-wide, so a library leaves the choice to its caller.
    Returns whether it applied (the compiled pass is built and the C library is glibc).
    """
    global _pool
    if _compiled is None or not _compiled.keep_freed_memory():
        return False
    _pool = pa.system_memory_pool()
    return True


def _allocate(size: int) -> pa.Buffer:
    return pa.allocate_buffer(size, memory_pool=_pool)


def _use_native(native: bool | None) -> bool:
    if native is None:
        return NATIVE
    if native and not NATIVE:
        raise DecoderUsageError("the compiled decoder (dcp_cdc._native) is not built")
    return native


def _native_module() -> Any:
    assert _compiled is not None, "checked by _use_native"
    return _compiled


def decode_batch(
    buf: bytes,
    *,
    collections: bool,
    base_offset: int = 0,
    final: bool = True,
    file: str | None = None,
    max_expanded: int | None = None,
    native: bool | None = None,
) -> DecodedBatch:
    """Decode every whole frame of ``buf`` (offsets reported as ``base_offset + position``).

    With ``final=False`` an incomplete last frame is left for the next call (``consumed``
    stops before it); with ``final=True`` it is reported as a truncated tail in ``fatal``.

    ``max_expanded`` bounds what the batch decompresses: the Snappy values it decodes expand
    to at most that many bytes in all, except that the first frame is always decoded (one
    value expands to at most :data:`dcp_cdc.snappy.MAX_UNCOMPRESSED`). The frames past the
    bound are left for the next call like an incomplete last frame (``consumed`` stops
    before them, ``fatal`` is None). So the batch's memory is about ``2 * (len(buf) +
    max(max_expanded, MAX_UNCOMPRESSED))``: its buffer, the decompressed values, and the
    table's copy of both. None (the default): no bound.

    ``native``: decode with the compiled pass (True), with numpy alone (False), or with the
    compiled pass where it is built (None, the default).
    """
    if len(buf) >= 1 << 31:  # binary views address their buffers with int32 offsets
        raise DecoderUsageError(f"decode_batch takes at most 2 GiB at once, got {len(buf)} bytes")
    buf = bytes(buf)
    native = _use_native(native)
    starts, consumed, fatal = frame_starts(buf, final=final, base_offset=base_offset, native=native)
    if max_expanded is not None and len(starts):
        cut = _expansion_cut(expanded_sizes(buf, starts), max_expanded)
        if cut < len(starts):
            starts, consumed, fatal = starts[:cut], int(starts[cut]), None
    if fatal is not None and file:
        fatal = fatal.with_file(file)
    table, errors = decode_frames(
        buf, starts, collections=collections, base_offset=base_offset, file=file, native=native
    )
    return DecodedBatch(table, errors, consumed, fatal)


def expanded_sizes(buf: bytes, starts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """How many bytes the value of each whole frame at ``starts`` decompresses to: the
    declared length of a Snappy value whose preamble is plausible (what decoding it will
    allocate, :func:`dcp_cdc.snappy.preamble`), else 0."""
    sizes = np.zeros(len(starts), dtype=np.int64)
    head = _byte_view(buf, f"V{HEADER_LEN}")[starts].view(_HEADER_DTYPE)
    rows = np.flatnonzero((head["datatype"] & _SNAPPY) != 0)
    if not len(rows):
        return sizes
    head = head[rows]
    alt = np.isin(head["magic"], _ALT)
    keylen16 = head["key_len"].astype(np.int64)
    fe_len = np.where(alt, keylen16 >> 8, 0)
    key_len = np.where(alt, keylen16 & 0xFF, keylen16)
    frame_end = starts[rows] + HEADER_LEN + head["body_len"].astype(np.int64)
    value_start = starts[rows] + HEADER_LEN + fe_len + head["ext_len"].astype(np.int64) + key_len
    value_len = frame_end - value_start
    has_value = value_len > 0
    rows, value_start, value_len = rows[has_value], value_start[has_value], value_len[has_value]
    declared, _, ok = read_uleb128_many(buf, value_start, value_len)
    ok &= snappy.plausible(declared, value_len)
    sizes[rows] = np.where(ok, declared, 0)
    return sizes


def _expansion_cut(sizes: npt.NDArray[np.int64], limit: int) -> int:
    """How many leading frames expand to at most ``limit`` bytes in all (at least one)."""
    over = np.flatnonzero(np.cumsum(sizes) > limit)
    return max(int(over[0]), 1) if len(over) else len(sizes)


def decode_frames(
    buf: bytes,
    starts: npt.NDArray[np.int64],
    *,
    collections: bool,
    base_offset: int = 0,
    file: str | None = None,
    native: bool | None = None,
) -> tuple[pa.Table, list[MalformedFrameError]]:
    """The rows of the whole frames at ``starts`` (from :func:`frame_starts`), and the
    malformed ones among them, which have no row. ``native`` as for :func:`decode_batch`."""
    n = len(starts)
    native = _use_native(native)
    cols = _Columns(n, buf, native=native)
    keep = np.ones(n, dtype=np.bool_)
    errors: list[MalformedFrameError] = []
    if n == 0:
        return cols.to_table(keep), errors
    hot = _hot_native if native else _hot_numpy
    fast = hot(cols, buf, starts, collections=collections, base_offset=base_offset)
    for i in np.flatnonzero(~fast).tolist():
        pos = int(starts[i])
        try:
            h = parse_header(buf, pos, base_offset=base_offset)
            event = _read(h, buf, pos, collections)
        except MalformedFrameError as exc:
            errors.append(exc.with_file(file) if file else exc)
            keep[i] = False
            continue
        cols.put_row(i, raw_row(event))
    cols.flush()
    marker_v1 = fast & (cols.values["opcode"] == Opcode.DCP_SNAPSHOT_MARKER)
    if marker_v1.any():
        cols.constant_texts["marker_version"] = (marker_v1, "1")
    return cols.to_table(keep), errors


def _hot_native(
    cols: _Columns, buf: bytes, starts: Any, *, collections: bool, base_offset: int
) -> Any:
    """:func:`_hot_numpy` by the compiled pass."""
    n = len(starts)
    columns = [
        _pooled(n, _NP_TYPES[_NUMERIC[name]], zeroed=name not in _ALWAYS_VALID)
        for name in _NATIVE_COLUMNS
    ]
    valid = [None if name in _ALWAYS_VALID else _pooled(n, np.bool_) for name in _NATIVE_COLUMNS]
    fast, xattr = _pooled(n, np.bool_), _pooled(n, np.bool_)
    value_src = _pooled(n, np.int64, zeroed=False)
    value_src.fill(-1)  # no key or value; where it is set, so are the four ranges
    key_start, key_len = _pooled(n, np.int64, zeroed=False), _pooled(n, np.int64, zeroed=False)
    value_start = _pooled(n, np.int64, zeroed=False)
    value_len = _pooled(n, np.int64, zeroed=False)
    xattr_offsets = np.empty(n + 1, dtype=_I32)
    expanded, entries = _native_module().decode(
        buf,
        np.ascontiguousarray(starts, dtype=np.int64),
        base_offset,
        collections,
        tuple(columns),
        tuple(valid),
        cols.op,
        fast,
        xattr,
        key_start,
        key_len,
        value_src,
        value_start,
        value_len,
        xattr_offsets,
        _allocate,
    )
    for name, values, ok in zip(_NATIVE_COLUMNS, columns, valid, strict=True):
        if ok is None or ok.all():
            cols.values[name] = values
        elif ok.any():
            cols.values[name], cols.valid[name] = values, ok
    expanded_source = cols.add_source(expanded)
    assert expanded_source == 1, "the compiled pass's value_src 1 is the expanded values"
    has_key = value_src >= 0  # the documents' frames
    if has_key.any():
        cols.bin_src["key"] = np.where(has_key, 0, -1)
        cols.bin_start["key"], cols.bin_len["key"] = key_start, key_len
        cols.bin_src["value"] = value_src
        cols.bin_start["value"], cols.bin_len["value"] = value_start, value_len
    if xattr.any():
        pairs = np.frombuffer(entries, dtype=np.int64).reshape(-1, 5)
        entry_rows = pairs[:, 0]
        src = value_src[entry_rows]
        sources = cols.sources[:2]
        keys = _gathered(pa.string(), sources, src, pairs[:, 1], pairs[:, 2])
        items = _gathered(pa.string(), sources, src, pairs[:, 3], pairs[:, 4])
        cols.add_xattrs(np.flatnonzero(xattr), entry_rows, keys, items, xattr_offsets)
    return fast


def _hot_numpy(
    cols: _Columns, buf: bytes, starts: Any, *, collections: bool, base_offset: int
) -> Any:
    """The header columns of every frame, and every column of the hot messages (``_FAST``),
    decoded for all rows at once; returns the rows decoded here (the others go through the
    per-frame path)."""
    n = len(starts)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    head = _byte_view(buf, f"V{HEADER_LEN}")[starts].view(_HEADER_DTYPE)
    magic = head["magic"]
    alt = np.isin(magic, _ALT)
    keylen16 = head["key_len"].astype(np.int64)
    fe_len = np.where(alt, keylen16 >> 8, 0)
    key_len = np.where(alt, keylen16 & 0xFF, keylen16)
    ext_len = head["ext_len"].astype(np.int64)
    body_len = head["body_len"].astype(np.int64)
    is_response = np.isin(magic, _RESPONSE)
    frame_end = starts + HEADER_LEN + body_len
    ext_start = starts + HEADER_LEN + fe_len
    key_start = ext_start + ext_len
    value_start = key_start + key_len
    value_len = frame_end - value_start
    opcode = head["opcode"]
    datatype = head["datatype"]

    cols.full("offset", starts + base_offset)
    cols.full("frame_len", HEADER_LEN + body_len)
    cols.full("magic", magic)
    cols.full("opcode", opcode)
    cols.full("opaque", head["opaque"])
    cols.full("cas", head["cas"].astype(np.uint64).view(np.int64))
    cols.full("datatype", datatype)
    vb_or_status = head["vbucket_or_status"]
    cols.set("vbucket", ~is_response, vb_or_status[~is_response])
    cols.set("status", is_response, vb_or_status[is_response])

    # Stream ids: the usual alt frame is exactly one stream-id FrameInfo (tag + u16).
    slow = value_len < 0  # impossible lengths are reported by the per-frame path
    sid_rows = np.flatnonzero(alt & ~slow)
    if len(sid_rows):
        at = starts[sid_rows] + HEADER_LEN
        # only a frame-info section of that size has its tag inside the frame (an empty
        # body's tag would lie past the buffer's end)
        simple = fe_len[sid_rows] == 1 + STREAM_ID_LEN
        simple[simple] = u8[at[simple]] == STREAM_ID_TAG
        cols.set("stream_id", sid_rows[simple], _byte_view(buf, ">u2")[at[simple] + 1])
        slow[sid_rows[~simple]] = True

    fast = np.zeros(n, dtype=np.bool_)
    request = ~is_response & (magic != _SERVER_REQUEST) & ~slow
    known_datatype = (datatype & _UNKNOWN_DATATYPE_BITS) == 0
    for op_code, layout, op, has_key in _FAST:
        sel = request & (opcode == op_code) & (ext_len == layout.length)
        if has_key:
            sel &= known_datatype & (key_len > 0)
        else:
            sel &= (key_len == 0) & (value_len == 0)
        idx = np.flatnonzero(sel)
        if not len(idx):
            continue
        rec = _records(buf, ext_start[idx], layout)
        if "nmeta" in layout.names:  # legacy extended meta is always 0 (errata E14)
            ok = rec["nmeta"] == 0
            idx, rec = idx[ok], rec[ok]
        if has_key and collections:
            first = u8[key_start[idx]]
            ok = first < CONTINUATION  # one-byte LEB128; longer ones take the per-frame path
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
            cols.set_bytes("key", idx, 0, doc_key_start, value_start[idx] - doc_key_start)
            cols.set_bytes("value", idx, 0, value_start[idx], value_len[idx])
            cols.set("is_json", idx, (datatype[idx] & Datatype.JSON) != 0)
        fast[idx] = True

    # Compressed or xattr-carrying values, all at once; what fails goes frame by frame.
    transform = fast & (value_len > 0) & ((datatype & (_SNAPPY | _XATTR)) != 0)
    transform &= np.isin(opcode, _DOC_OPCODES)
    rows = np.flatnonzero(transform)
    if len(rows):
        values = _decode_values(buf, value_start[rows], value_len[rows], datatype[rows])
        fast[rows[~values.ok]] = False
        moved = {s: cols.add_source(data) for s, data in enumerate(values.sources) if s}
        for s, source in ((0, 0), *moved.items()):
            sel = values.ok & (values.src == s)
            cols.set_bytes("value", rows[sel], source, values.start[sel], values.length[sel])
        cols.add_xattrs(rows[values.xattr_rows], rows[values.entry_rows], values.keys, values.items)
    return fast
