"""Where a (session, vbucket) pair's frames settle, for the columnar check's carried state
(:mod:`.carried`): its *cut* is the first snapshot group of its last stream that later frames
may still change (one not complete, or the last one unless it is complete: docs on quality,
"what a check reads"); everything before it is settled and carried as per-stream parts
(:func:`.streams.stream_partial`), the frames from it are carried whole (the *tail*) and
placed again with the next check's frames, from the :class:`~.placement.Seed` at the cut.

A group's frames are contiguous in session order and both its numbers only grow there, so
"before the cut" is "(stream, snapshot) numbers below the cut's".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.events import DATA_OPS
from pipelines.quality.small.carried import Cut
from pipelines.quality.small.item_snapshots import Streams
from pipelines.quality.small.items import Bronze, _flags, _numbers, _present
from pipelines.quality.small.placement import Placed
from pipelines.quality.small.sql import largest
from pipelines.quality.small.streams import combine_partials, stream_partials

Row = dict[str, Any]
Pair = tuple[str, int]


@dataclass
class StreamCarry:
    """What the streams of a check carry: per pair its cut, the frames from the cuts
    (``tail``: the events' rows, with ``counted``), per stream its settled part (the last
    state's combined with this check's), the settled repeated seqnos and per (vbucket, vb
    uuid) the highest settled data seqno."""

    pairs: dict[Pair, Cut]
    tail: pa.Table
    streams: dict[tuple[Any, ...], Row]
    duplicates: list[Row]
    data_max: dict[tuple[int, int | None], int]


def _tail_groups(snaps: Sequence[Row], last: Mapping[Pair, tuple[int, int]]) -> dict[Pair, Any]:
    """Per pair, the (stream, snapshot) numbers of its first group that may still change."""
    cut: dict[Pair, Any] = {}
    for s in snaps:
        pair = (s["session_id"], s["vbucket"])
        stream, snapshot = last[pair]
        if s["stream_no"] != stream:
            continue
        open_group = s["complete"] is not True and (
            s["kind"] is not None or s["snapshot_no"] == snapshot
        )
        if open_group:
            cut[pair] = min(cut.get(pair, (stream, snapshot)), (stream, s["snapshot_no"]))
    return cut


def carry_streams(
    events: pa.Table,
    bronze: Bronze,
    placed: Placed,
    snaps: Sequence[Row],
    groups: Streams,
    duplicates: Sequence[Row],
    counted: np.ndarray,
    before: Mapping[tuple[Any, ...], Row] | None = None,
) -> StreamCarry:
    """The carry of the frames ``events`` (split: ``bronze``, placed: ``placed``, their
    finished snapshots, per-group item counts (:func:`.item_snapshots.snapshot_groups`),
    repeated seqnos and per item whether it was ``counted`` among the live documents);
    ``before``: the settled parts the last state carried for these streams."""
    trail = placed.trail
    assert trail is not None
    n = len(trail.order)
    snapshot_no = trail.values["snapshot_no"][0]
    frame_rows = np.concatenate(
        [np.array([f["_i"] for f in placed.frames], np.int64), bronze.item_rows]
    )[trail.order]
    file_sequence, offset = _numbers(events["file_sequence"]), _numbers(events["offset"])
    ends = np.flatnonzero(np.r_[trail.pair[1:] != trail.pair[:-1], True]) if n else trail.order
    starts = np.r_[0, ends[:-1] + 1] if n else trail.order
    pairs = [(bronze.sessions[c][1], v) for c, v in trail.pairs]
    last = {
        pair: (int(trail.stream_no[e]), int(snapshot_no[e]))
        for pair, e in zip(pairs, ends, strict=True)
    }
    tail_group = _tail_groups(snaps, last)
    settled = np.zeros(n, bool)
    cuts: dict[Pair, Cut] = {}
    key = trail.stream_no * (1 << 32) + snapshot_no
    for p, (pair, start, end) in enumerate(zip(pairs, starts, ends, strict=True)):
        group = tail_group.get(pair)
        at = end + 1
        if group is not None:
            at = start + int(np.searchsorted(key[start : end + 1], group[0] * (1 << 32) + group[1]))
        settled[start:at] = True
        seed = trail.first[p] if at == start else trail.seed_after(at - 1)
        position = (int(file_sequence[frame_rows[end]]), int(offset[frame_rows[end]]))
        cuts[pair] = Cut(group, seed, last[pair], position)
    in_tail = frame_rows[~settled]
    flags = np.zeros(events.num_rows, bool)
    flags[bronze.item_rows] = counted
    tail = events.take(pa.array(np.sort(in_tail), pa.int64()))
    tail = tail.append_column("counted", pa.array(flags[np.sort(in_tail)]))
    unsort = np.empty(n, np.int64)
    unsort[trail.order] = np.arange(n)
    settled_frames = settled[unsort]
    n_c = len(placed.frames)
    return StreamCarry(
        cuts,
        tail,
        _settled_parts(placed, snaps, groups, settled_frames[:n_c], tail_group, before or {}),
        [d for d in duplicates if _before_cut(d, tail_group)],
        _data_max(bronze, settled_frames[n_c:]),
    )


def _before_cut(row: Row, tail_group: Mapping[Pair, Any]) -> bool:
    group = tail_group.get((row["session_id"], row["vbucket"]))
    return group is None or (row["stream_no"], row["snapshot_no"]) < group


def _settled_parts(
    placed: Placed,
    snaps: Sequence[Row],
    groups: Streams,
    settled_control: np.ndarray,
    tail_group: Mapping[Pair, Any],
    before: Mapping[tuple[Any, ...], Row],
) -> dict[tuple[Any, ...], Row]:
    """Per stream, the part of its settled frames, combined with the part ``before``."""
    frames = [f for f, s in zip(placed.frames, settled_control, strict=True) if s]
    items: dict[tuple[Any, ...], tuple[int, Any, Any]] = {}
    for (started, session, vbucket, stream, snapshot), (count, high, end) in groups.items():
        group = tail_group.get((session, vbucket))
        if group is not None and (stream, snapshot) >= group:
            continue
        k = (started, session, vbucket, stream)
        c, h, e = items.get(k, (0, None, None))
        items[k] = (c + count, largest([h, high]), largest([e, end]))
    parts = stream_partials(frames, [s for s in snaps if _before_cut(s, tail_group)], [], items)
    combined = dict(before)
    for k, part in parts.items():
        combined[k] = combine_partials(combined[k], part) if k in combined else part
    return combined


def _data_max(bronze: Bronze, settled: np.ndarray) -> dict[tuple[int, int | None], int]:
    """Per (vbucket, vb uuid), the highest seqno of the settled data items."""
    items = bronze.items
    data = settled & _flags(pc.is_in(items["op"], value_set=pa.array(DATA_OPS)))
    frame = pd.DataFrame(
        {
            "v": _numbers(items["vbucket"])[data],
            "u": _numbers(items["in_vb_uuid"])[data],
            "h": _present(items["in_vb_uuid"])[data],
            "s": _numbers(items["seqno"])[data],
        }
    )
    top = frame.groupby(["v", "u", "h"])["s"].max()
    return {(int(v), int(u) if h else None): int(s) for (v, u, h), s in top.items()}
