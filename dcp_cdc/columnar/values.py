"""Document values of many frames at once (docs/protocol/dcp.md §2): Snappy values decompressed into one
buffer (one cramjam call per value), then XATTR sections split for all values at once. A value
that is not exactly what the per-frame path accepts is left to that path, which says why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc import snappy
from dcp_cdc.columnar.columns import INT32_LE, binary_views, numeric
from dcp_cdc.columnar.framing import byte_view
from dcp_cdc.columnar.hot import MAX_XATTR_PAIRS, SNAPPY, XATTR
from dcp_cdc.varint import read_uleb128_many


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


def decode_values(buf: bytes, start: Any, length: Any, datatype: Any) -> _Values:
    """Snappy then XATTRs (the order of docs/protocol/dcp.md §2) for non-empty values of known datatype."""
    m = len(start)
    ok = np.ones(m, dtype=np.bool_)
    src = np.zeros(m, dtype=np.int64)
    start = start.copy()
    length = length.copy()
    sources: list[Any] = [buf]
    compressed = np.flatnonzero((datatype & SNAPPY) != 0)
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
    xattr_rows = np.flatnonzero(ok & ((datatype & XATTR) != 0))
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
            mask = numeric(pa.bool_(), keep)
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
    be32 = byte_view(source, ">u4")
    ok = length >= 4
    total = np.zeros(m, dtype=np.int64)
    total[ok] = be32[start[ok]]
    end = start + 4 + total
    ok &= end <= start + length
    # Pair by pair, every value at once: u32 pair length, then key NUL value NUL.
    rows = np.flatnonzero(ok)
    pos, stop = start[rows] + 4, end[rows]
    found: list[tuple[Any, Any, Any]] = []
    for _ in range(MAX_XATTR_PAIRS):
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
    indices = numeric(pa.int64(), order)
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
    pairs = binary_views([source], zero, start, length).cast(pa.binary())
    offsets = np.frombuffer(pairs.buffers()[1], dtype=INT32_LE)[: n + 1].astype(np.int64)
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
    key_views = binary_views(sources, zero, offsets[:-1], sep)
    value_views = binary_views(sources, zero, offsets[:-1] + sep + 1, value_len)
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
        key_views = binary_views(sources, zero, offsets[:-1], sep)
        value_views = binary_views(sources, zero, offsets[:-1] + sep + 1, value_len)
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
    for d in range(1, MAX_XATTR_PAIRS):
        at = np.flatnonzero(entry_rows[d:] == entry_rows[:-d])
        if not len(at):
            break
        same = pc.equal(keys.take(at + d), keys.take(at)).to_numpy(zero_copy_only=False)
        repeated[at[same] + d] = True
    return entry_rows[repeated]
