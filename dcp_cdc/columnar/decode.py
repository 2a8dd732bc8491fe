"""The columnar decoder's entry points: a buffer of frames in, one Arrow table out.

Used by the bronze ingest inside ``mapInArrow``. The hot path touches no frame from Python:

1. framing (:mod:`dcp_cdc.columnar.framing`);
2. the hot messages (:mod:`dcp_cdc.columnar.hot`) are decoded for all rows at once, by
   gathering each layout of :mod:`dcp_cdc.layouts` as a structured array straight from the
   buffer;
3. Snappy values and XATTR sections (:mod:`dcp_cdc.columnar.values`); keys, values and xattrs
   become Arrow columns (:mod:`dcp_cdc.columnar.columns`);
4. every other frame (system events, responses, anything malformed, ...) goes through the
   iterator face's reader for its opcode, and its event is turned into a row.

Steps 1 to 3 have a compiled form (:mod:`dcp_cdc.columnar.native`): one pass over the frames
that writes the header and hot-message columns, decompresses Snappy values into one buffer and
splits XATTR sections, and one copy of every key and value into its Arrow column. It decides
nothing the numpy path would decide otherwise, and tests check the two give the same table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from dcp_cdc import layouts, snappy
from dcp_cdc.columnar.columns import INT32_LE, Columns, gathered, pooled
from dcp_cdc.columnar.framing import byte_view, frame_starts
from dcp_cdc.columnar.hot import (
    ALT,
    DOC_OPCODES,
    FAST,
    RESPONSE,
    SERVER_REQUEST,
    SNAPPY,
    UNKNOWN_DATATYPE_BITS,
    XATTR,
)
from dcp_cdc.columnar.native import (
    ALWAYS_VALID,
    NATIVE_COLUMNS,
    allocate,
    native_module,
    use_native,
)
from dcp_cdc.columnar.schema import NP_TYPES, NUMERIC, OP_INDEX, DecodedBatch, raw_row
from dcp_cdc.columnar.values import decode_values
from dcp_cdc.decoder import _read
from dcp_cdc.errors import DecoderUsageError, MalformedFrameError
from dcp_cdc.header import parse_header
from dcp_cdc.layouts import Layout
from dcp_cdc.protocol import (
    HEADER_LEN,
    STREAM_ID_LEN,
    STREAM_ID_TAG,
    Datatype,
    Opcode,
)
from dcp_cdc.varint import CONTINUATION, read_uleb128_many

_HEADER_DTYPE = layouts.HEADER.numpy_dtype()
_LAYOUT_DTYPES: dict[str, Any] = {}


def _records(buf: bytes, at: Any, layout: Layout) -> Any:
    """The ``layout`` section at each offset ``at``, as a structured array (one gather)."""
    dtype = _LAYOUT_DTYPES.get(layout.name)
    if dtype is None:
        dtype = _LAYOUT_DTYPES[layout.name] = layout.numpy_dtype()
    return byte_view(buf, f"V{layout.length}")[at].view(dtype)


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
    native = use_native(native)
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
    head = byte_view(buf, f"V{HEADER_LEN}")[starts].view(_HEADER_DTYPE)
    rows = np.flatnonzero((head["datatype"] & SNAPPY) != 0)
    if not len(rows):
        return sizes
    head = head[rows]
    alt = np.isin(head["magic"], ALT)
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
    native = use_native(native)
    cols = Columns(n, buf, native=native)
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
    cols: Columns, buf: bytes, starts: Any, *, collections: bool, base_offset: int
) -> Any:
    """:func:`_hot_numpy` by the compiled pass."""
    n = len(starts)
    columns = [
        pooled(n, NP_TYPES[NUMERIC[name]], zeroed=name not in ALWAYS_VALID)
        for name in NATIVE_COLUMNS
    ]
    valid = [None if name in ALWAYS_VALID else pooled(n, np.bool_) for name in NATIVE_COLUMNS]
    fast, xattr = pooled(n, np.bool_), pooled(n, np.bool_)
    value_src = pooled(n, np.int64, zeroed=False)
    value_src.fill(-1)  # no key or value; where it is set, so are the four ranges
    key_start, key_len = pooled(n, np.int64, zeroed=False), pooled(n, np.int64, zeroed=False)
    value_start = pooled(n, np.int64, zeroed=False)
    value_len = pooled(n, np.int64, zeroed=False)
    xattr_offsets = np.empty(n + 1, dtype=INT32_LE)
    expanded, entries = native_module().decode(
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
        allocate,
    )
    for name, values, ok in zip(NATIVE_COLUMNS, columns, valid, strict=True):
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
        keys = gathered(pa.string(), sources, src, pairs[:, 1], pairs[:, 2])
        items = gathered(pa.string(), sources, src, pairs[:, 3], pairs[:, 4])
        cols.add_xattrs(np.flatnonzero(xattr), entry_rows, keys, items, xattr_offsets)
    return fast


def _hot_numpy(
    cols: Columns, buf: bytes, starts: Any, *, collections: bool, base_offset: int
) -> Any:
    """The header columns of every frame, and every column of the hot messages (``FAST``),
    decoded for all rows at once; returns the rows decoded here (the others go through the
    per-frame path)."""
    n = len(starts)
    u8 = np.frombuffer(buf, dtype=np.uint8)
    head = byte_view(buf, f"V{HEADER_LEN}")[starts].view(_HEADER_DTYPE)
    magic = head["magic"]
    alt = np.isin(magic, ALT)
    keylen16 = head["key_len"].astype(np.int64)
    fe_len = np.where(alt, keylen16 >> 8, 0)
    key_len = np.where(alt, keylen16 & 0xFF, keylen16)
    ext_len = head["ext_len"].astype(np.int64)
    body_len = head["body_len"].astype(np.int64)
    is_response = np.isin(magic, RESPONSE)
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
        cols.set("stream_id", sid_rows[simple], byte_view(buf, ">u2")[at[simple] + 1])
        slow[sid_rows[~simple]] = True

    fast = np.zeros(n, dtype=np.bool_)
    request = ~is_response & (magic != SERVER_REQUEST) & ~slow
    known_datatype = (datatype & UNKNOWN_DATATYPE_BITS) == 0
    for op_code, layout, op, has_key in FAST:
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
        cols.op[idx] = OP_INDEX[op]
        if has_key:
            cols.set_bytes("key", idx, 0, doc_key_start, value_start[idx] - doc_key_start)
            cols.set_bytes("value", idx, 0, value_start[idx], value_len[idx])
            cols.set("is_json", idx, (datatype[idx] & Datatype.JSON) != 0)
        fast[idx] = True

    # Compressed or xattr-carrying values, all at once; what fails goes frame by frame.
    transform = fast & (value_len > 0) & ((datatype & (SNAPPY | XATTR)) != 0)
    transform &= np.isin(opcode, DOC_OPCODES)
    rows = np.flatnonzero(transform)
    if len(rows):
        values = decode_values(buf, value_start[rows], value_len[rows], datatype[rows])
        fast[rows[~values.ok]] = False
        moved = {s: cols.add_source(data) for s, data in enumerate(values.sources) if s}
        for s, source in ((0, 0), *moved.items()):
            sel = values.ok & (values.src == s)
            cols.set_bytes("value", rows[sel], source, values.start[sel], values.length[sel])
        cols.add_xattrs(rows[values.xattr_rows], rows[values.entry_rows], values.keys, values.items)
    return fast
