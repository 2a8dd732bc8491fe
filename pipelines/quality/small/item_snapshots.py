"""The columnar check's snapshots, streams, repeated seqnos and files: what the
``snapshot_completeness`` and ``bronze_integrity`` frames take from the items and markers,
aggregated over columns per snapshot (:func:`.streams.snapshot_row`'s columns) and merged
with the control frames' rows of the same snapshot.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.events import DATA_OPS
from pipelines.quality.small.items import Bronze, _flags, _numbers, _present
from pipelines.quality.small.placement import SNAPSHOT_KEY, Placed
from pipelines.quality.small.sql import largest
from pipelines.quality.small.streams import finish_snapshots, snapshot_row

Row = dict[str, Any]
_LOWEST = np.iinfo(np.int64).min


def _first_of(group: np.ndarray, rank: np.ndarray, where: np.ndarray) -> dict[int, int]:
    """Per group, the index of its row of lowest rank among ``where``."""
    at = np.flatnonzero(where)
    if not len(at):
        return {}
    firsts = pd.DataFrame({"g": group[at], "r": rank[at], "i": at}).sort_values("r")
    kept = firsts.drop_duplicates("g")
    return dict(zip(kept["g"].tolist(), kept["i"].tolist(), strict=True))


def _masked_max(frame: pd.DataFrame, where: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per group of ``frame`` (its ``g``, in group order), the largest of ``values`` where
    ``where`` holds, :data:`_LOWEST` where none does."""
    masked = frame.assign(v=np.where(where, values, _LOWEST))
    return np.asarray(masked.groupby("g")["v"].max().to_numpy(), np.int64)


def _aggregates(bronze: Bronze, placed: Placed) -> dict[str, list[Any]]:
    """Per snapshot code (in code order), the snapshot row's columns the items and markers
    give: counts, highest seqno, markers' range and flags, first problems."""
    cols = bronze.items
    seqno = _numbers(cols["seqno"])
    marker, item = bronze.is_marker, ~bronze.is_marker
    end, has_end = _numbers(cols["in_snapshot_end"]), _present(cols["in_snapshot_end"])
    data = _flags(pc.is_in(cols["op"], value_set=pa.array(DATA_OPS)))
    frame = pd.DataFrame(
        {
            "g": placed.snapshot,
            "item": item,
            "marker": marker,
            "reached": placed.in_order & has_end & (seqno >= end),
            "out": placed.out_of_range,
            "reg": placed.regression,
            "data": data,
        }
    )
    counts = frame.groupby("g").agg(
        items=("item", "sum"),
        markers=("marker", "sum"),
        reached=("reached", "any"),
        out=("out", "sum"),
        reg=("reg", "sum"),
        data=("data", "sum"),
    )
    found: dict[str, list[Any]] = {c: counts[c].tolist() for c in counts.columns}

    def highest(where: np.ndarray, values: np.ndarray, present: np.ndarray) -> list[Any]:
        top = _masked_max(frame, where & present, values)
        known = frame.assign(h=where & present).groupby("g")["h"].any().to_numpy()
        return [int(v) if k else None for v, k in zip(top.tolist(), known.tolist(), strict=True)]

    everywhere = np.ones(len(seqno), bool)
    found["last"] = highest(item, seqno, everywhere)
    for name in ("start_seqno", "end_seqno", "snapshot_flags"):
        found[name] = highest(marker, _numbers(cols[name]), _present(cols[name]))
    keycode = np.asarray(
        pc.fill_null(pc.dictionary_encode(cols["key"].combine_chunks()).indices, -1).to_numpy(
            zero_copy_only=False
        ),
        np.int64,
    )
    distinct = (
        pd.DataFrame(
            {
                "g": placed.snapshot[data],
                "c": _numbers(cols["collection_id"])[data],
                "k": keycode[data],
            }
        )
        .drop_duplicates()
        .groupby("g")
        .size()
    )
    of = dict(zip(distinct.index.tolist(), distinct.tolist(), strict=True))
    found["distinct"] = [of.get(g, 0) for g in range(len(counts))]
    rank = bronze.rank[bronze.item_rows]
    out_first = _first_of(placed.snapshot, rank, placed.out_of_range)
    reg_first = _first_of(placed.snapshot, rank, placed.regression)
    found["out_seqno"] = [
        int(seqno[out_first[g]]) if g in out_first else None for g in range(len(counts))
    ]
    found["first_regression"] = [
        (int(seqno[reg_first[g]]), int(placed.floor[reg_first[g]])) if g in reg_first else None
        for g in range(len(counts))
    ]
    return found


Streams = dict[tuple[Any, ...], tuple[int, Any, Any]]


def snapshots(bronze: Bronze, placed: Placed) -> tuple[list[Row], Streams]:
    """:func:`.streams.snapshots` of the control frames and the columns together, and per
    stream key (session start, session, vbucket, stream) the count and highest seqno of the
    columns' items and the highest end of their markers (:func:`.streams.stream_metrics`'s
    ``items``)."""
    rows, streams, _ = snapshot_groups(bronze, placed)
    return rows, streams


def snapshot_groups(bronze: Bronze, placed: Placed) -> tuple[list[Row], Streams, Streams]:
    """:func:`snapshots`, and the same counts per snapshot (key: the stream key and the
    snapshot number)."""
    found = _aggregates(bronze, placed)
    streams: Streams = {}
    groups: Streams = {}
    control: dict[tuple[Any, ...], list[Row]] = {}
    for f in placed.frames:
        stream = (f["session_started_at"], f["session_id"], f["vbucket"], f["stream_no"])
        control.setdefault((*stream, f["snapshot_no"]), []).append(f)
    keys = [placed.snapshot_keys[c].tolist() for c in SNAPSHOT_KEY]
    rows = []
    for g in range(len(found["items"])):
        started, session_id = bronze.sessions[keys[0][g]]
        key = (started, session_id, keys[1][g], keys[2][g], keys[3][g])
        row = snapshot_row(key, control.pop(key)) if key in control else _empty(key)
        markers = found["markers"][g] > 0
        row.update(
            kind=largest([row["kind"], "marker" if markers else None]),
            start=largest([row["start"], found["start_seqno"][g]]),
            end=largest([row["end"], found["end_seqno"][g]]),
            flags=largest([row["flags"], found["snapshot_flags"][g]]),
            items=row["items"] + found["items"][g],
            last_seqno=largest([row["last_seqno"], found["last"][g]]),
            reached_end=row["reached_end"] or found["reached"][g],
            out_of_range=row["out_of_range"] + found["out"][g],
            regressions=row["regressions"] + found["reg"][g],
            data_events=row["data_events"] + found["data"][g],
            distinct_keys=row["distinct_keys"] + found["distinct"][g],
        )
        if found["out_seqno"][g] is not None:
            row["out_of_range_seqno"] = found["out_seqno"][g]
        if found["first_regression"][g] is not None:
            row["first_regression"] = found["first_regression"][g]
        rows.append(row)
        count, high, end = streams.get(key[:4], (0, None, None))
        streams[key[:4]] = (
            count + found["items"][g],
            largest([high, found["last"][g]]),
            largest([end, found["end_seqno"][g]]),
        )
        groups[key] = (found["items"][g], found["last"][g], found["end_seqno"][g])
    rows += [snapshot_row(key, frames) for key, frames in control.items()]
    return finish_snapshots(rows), streams, groups


_NO_FRAME = snapshot_row((None,) * 5, [])


def _empty(key: tuple[Any, ...]) -> Row:
    """:func:`.streams.snapshot_row` of a snapshot with no control frame."""
    names = ("session_started_at", "session_id", "vbucket", "stream_no", "snapshot_no")
    return {**_NO_FRAME, **dict(zip(names, key, strict=True))}


def duplicate_candidates(bronze: Bronze, placed: Placed) -> list[Row]:
    """The data items whose (vbucket, vb uuid, seqno) another data item shares, as rows with
    their ``stream_no`` (:func:`.streams.duplicate_seqnos` judges them)."""
    items = bronze.items
    data = _flags(pc.is_in(items["op"], value_set=pa.array(DATA_OPS)))
    keys = pd.DataFrame(
        {
            "v": _numbers(items["vbucket"]),
            "u": _numbers(items["in_vb_uuid"]),
            "n": _present(items["in_vb_uuid"]),
            "s": _numbers(items["seqno"]),
        }
    )
    shared = np.flatnonzero(data & keys.duplicated(keep=False).to_numpy() & _repeated(keys, data))
    rows = bronze.item_dicts(shared)
    for row, i in zip(rows, shared, strict=True):
        row["stream_no"] = int(placed.stream_no[i])
        row["snapshot_no"] = int(placed.snapshot_no[i])
    return rows


def _repeated(keys: pd.DataFrame, data: np.ndarray) -> np.ndarray:
    """Rows whose key another data row shares (the duplicates among data rows only)."""
    found = np.zeros(len(keys), bool)
    at = np.flatnonzero(data)
    found[at] = keys.iloc[at].duplicated(keep=False).to_numpy()
    return found


def file_frames(items: pa.Table) -> dict[Any, int]:
    """Items per capture file."""
    counted = pc.value_counts(items["file"].combine_chunks())
    return {v["values"].as_py(): v["counts"].as_py() for v in counted}
