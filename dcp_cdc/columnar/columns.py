"""The Arrow columns of a batch: numbers in numpy arrays, bytes as ranges into source buffers,
per-frame rows queued, and all of it built into one Arrow table (:class:`Columns`).

Keys, values and xattrs become Arrow views onto their buffers, copied once into plain columns
(by the compiled pass where it is built).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from dcp_cdc.columnar.framing import byte_view
from dcp_cdc.columnar.native import allocate, native_module
from dcp_cdc.columnar.schema import (
    ARROW_SCHEMA,
    BINARIES,
    COLUMNS,
    FAILOVER_ENTRY_TYPE,
    FLAG_NAMES_TYPE,
    HIGH_SEQNO_TYPE,
    NP_TYPES,
    NUMERIC,
    OP_INDEX,
    PAIR_LISTS,
    STRINGS,
    XATTRS_TYPE,
    to_signed64,
)
from dcp_cdc.events import (
    OPS,
)

INT32_LE = np.dtype("<i4")


def _bitmap(mask: Any) -> pa.Buffer:
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def numeric(arrow_type: pa.DataType, values: Any, valid: Any = None) -> pa.Array:
    """An Arrow array over a numpy array (no copy for numbers); ``valid`` None = no nulls."""
    data = _bitmap(values) if arrow_type == pa.bool_() else pa.py_buffer(values)
    validity = None if valid is None or valid.all() else _bitmap(valid)
    return pa.Array.from_buffers(arrow_type, len(values), [validity, data])


_AR12 = np.arange(12, dtype=np.int64)


def binary_views(sources: list[Any], src: Any, start: Any, length: Any) -> pa.Array:
    """A binary view array of byte ranges: row i is ``sources[src[i]][start[i]:][:length[i]]``,
    null where ``src[i] < 0``. No byte is copied except the 12 a short value holds inline."""
    n = len(src)
    null = src < 0
    lens = np.where(null, 0, length).astype(INT32_LE)
    views = np.zeros((n, 4), dtype=INT32_LE)
    views[:, 0] = lens
    short = np.flatnonzero((lens > 0) & (lens <= 12))
    long = np.flatnonzero(lens > 12)
    for s, source in enumerate(sources):
        sel = short[src[short] == s]
        if len(sel):
            data = np.frombuffer(source, dtype=np.uint8)
            inline = data[np.minimum(start[sel, None] + _AR12, len(data) - 1)]
            inline[_AR12[None, :] >= lens[sel, None]] = 0  # inline values are zero-padded
            views[sel, 1:4] = np.ascontiguousarray(inline).view(INT32_LE)
        sel = long[src[long] == s]
        if len(sel):
            views[sel, 1] = byte_view(source, "<i4")[start[sel]]  # the 4-byte prefix
    views[long, 2] = src[long]
    views[long, 3] = start[long]
    validity = _bitmap(~null) if null.any() else None
    buffers = [validity, pa.py_buffer(views), *(_buffer(s) for s in sources)]
    return pa.Array.from_buffers(pa.binary_view(), n, buffers)


def _buffer(data: Any) -> pa.Buffer:
    return data if isinstance(data, pa.Buffer) else pa.py_buffer(data)


def gathered(
    arrow_type: pa.DataType, sources: list[Any], src: Any, start: Any, length: Any
) -> pa.Array:
    """:func:`binary_views` copied into a plain binary (or, of text known to be UTF-8, string)
    column by the compiled pass: one copy, no views."""
    n = len(src)
    offsets = np.empty(n + 1, dtype=INT32_LE)
    src = np.ascontiguousarray(src, dtype=np.int64)
    data = native_module().gather(
        tuple(sources),
        src,
        np.ascontiguousarray(start, dtype=np.int64),
        np.ascontiguousarray(length, dtype=np.int64),
        offsets,
        allocate,
    )
    null = src < 0
    validity = _bitmap(~null) if null.any() else None
    return pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(offsets), data])


def pooled(n: int, dtype: Any, *, zeroed: bool = True) -> Any:
    """A numpy array in a pyarrow memory pool (the default, mimalloc, keeps some pages; see
    :func:`keep_freed_memory`). Not ``zeroed``: for what the compiled pass writes in full, or
    reads only where it wrote."""
    itemsize = np.dtype(dtype).itemsize
    values = np.frombuffer(allocate(n * itemsize), dtype=dtype, count=n)
    if zeroed:
        values.fill(0)
    return values


class Columns:
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
        self.strings: dict[str, tuple[list[int], list[str]]] = {c: ([], []) for c in STRINGS}
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
        self.bin_pending_len: dict[str, list[int]] = {name: [] for name in BINARIES}

    def full(self, name: str, values: Any) -> None:
        """Every row's value of a numeric column."""
        self.values[name] = np.ascontiguousarray(values, dtype=NP_TYPES[NUMERIC[name]])

    def set(self, name: str, rows: Any, values: Any) -> None:
        if name not in self.values:
            self.values[name] = np.zeros(self.n, dtype=NP_TYPES[NUMERIC[name]])
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
        self.op[i] = OP_INDEX[row["op"]]
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
            if name in NUMERIC:
                dtype = NP_TYPES[NUMERIC[name]]
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
            elif name in PAIR_LISTS:
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
        arrays["op"] = _OPS_ARRAY.take(numeric(pa.int8(), self.op))
        nulls = _Nulls(n)
        for name, arrow_type in NUMERIC.items():
            if name in self.values:
                arrays[name] = numeric(arrow_type, self.values[name], self.valid.get(name))
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
        for name in BINARIES:
            if name not in self.bin_src:
                arrays[name] = nulls.of(pa.binary())
                continue
            ranges = (self.sources, self.bin_src[name], self.bin_start[name], self.bin_len[name])
            if self.native:
                arrays[name] = gathered(pa.binary(), *ranges)
            else:
                arrays[name] = binary_views(*ranges).cast(pa.binary())
        arrays["xattrs"] = self._xattrs()
        arrays["failover_log"] = _sparse_list(n, self.failover, FAILOVER_ENTRY_TYPE)
        arrays["high_seqnos"] = _sparse_list(n, self.high_seqnos, HIGH_SEQNO_TYPE)
        arrays["stream_flag_names"] = _sparse_names(n, *self.flag_names)
        table = pa.table([arrays[c] for c, _ in COLUMNS], schema=ARROW_SCHEMA)
        return table if keep.all() else table.filter(numeric(pa.bool_(), keep))

    def _xattrs(self) -> pa.Array:
        n = self.n
        if not self.xattr_rows.any():
            return pa.nulls(n, XATTRS_TYPE)
        if len(self.xattr_entries) == 1 and self.xattr_entries[0][3] is not None:
            _, keys, items, offsets = self.xattr_entries[0]
        elif self.xattr_entries:
            offsets = np.zeros(n + 1, dtype=INT32_LE)
            entry_rows = np.concatenate([e[0] for e in self.xattr_entries])
            keys = pa.concat_arrays([e[1] for e in self.xattr_entries])
            items = pa.concat_arrays([e[2] for e in self.xattr_entries])
            if (np.diff(entry_rows) < 0).any():  # in row order (a row's pairs keep theirs)
                order = np.argsort(entry_rows, kind="stable")
                keys, items = keys.take(order), items.take(order)
            np.cumsum(np.bincount(entry_rows, minlength=n), out=offsets[1:])
        else:
            offsets = np.zeros(n + 1, dtype=INT32_LE)
            keys = items = pa.array([], type=pa.string())
        return pa.MapArray.from_arrays(
            numeric(pa.int32(), offsets),
            keys,
            items,
            type=XATTRS_TYPE,
            mask=numeric(pa.bool_(), ~self.xattr_rows),
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
    offsets = np.zeros(len(mask) + 1, dtype=INT32_LE)
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
    indices = np.zeros(n, dtype=INT32_LE)
    indices[rows] = np.arange(len(rows), dtype=INT32_LE)
    valid = np.zeros(n, dtype=np.bool_)
    valid[rows] = True
    values = pa.array(texts, type=pa.string())
    return values.take(numeric(pa.int32(), indices, valid))


def _sparse_names(n: int, rows: list[int], names: list[list[str]]) -> pa.Array:
    """An n-row list-of-strings column holding ``names`` at ``rows`` and nulls elsewhere."""
    if not rows:
        return pa.nulls(n, FLAG_NAMES_TYPE)
    counts = np.zeros(n, dtype=INT32_LE)
    counts[rows] = [len(v) for v in names]
    valid = np.zeros(n, dtype=np.bool_)
    valid[rows] = True
    offsets = np.zeros(n + 1, dtype=INT32_LE)
    np.cumsum(counts, out=offsets[1:])
    order = np.argsort(np.array(rows, dtype=np.int64), kind="stable")
    values = pa.array([name for i in order.tolist() for name in names[i]], type=pa.string())
    return pa.ListArray.from_arrays(
        numeric(pa.int32(), offsets), values, mask=numeric(pa.bool_(), ~valid)
    )


def _sparse_list(
    n: int, entries: Iterable[tuple[int, list[tuple[int, int]]]], entry: pa.StructType
) -> pa.Array:
    """A list column of ``n`` rows of pairs (``entry``'s two fields), null but at ``entries``."""
    counts = np.zeros(n, dtype=INT32_LE)
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
    offsets = np.zeros(n + 1, dtype=INT32_LE)
    np.cumsum(counts, out=offsets[1:])
    fields = list(entry)
    values = pa.StructArray.from_arrays(
        [pa.array(firsts, fields[0].type), pa.array(seconds, fields[1].type)], fields=fields
    )
    return pa.ListArray.from_arrays(
        numeric(pa.int32(), offsets), values, mask=numeric(pa.bool_(), mask)
    )
