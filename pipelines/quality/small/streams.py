"""The small check's streams: bronze's frames placed in their session, stream and snapshot,
the snapshots, the repeated seqnos and the ``snapshot_completeness`` metric frame, by the
rules of :mod:`pipelines.quality.frames` and :mod:`pipelines.quality.streams` (whose
docstrings say them, citing docs/protocol/dcp.md), here over rows in the driver.

A frame is a dict of :func:`pipelines.quality.frames.base_frames`' columns; each function
adds or derives the columns the Spark one does, with Spark's nulls (:mod:`.sql`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dcp_cdc.events import (
    DATA_OPS,
    Mutation,
    OsoSnapshot,
    SnapshotMarker,
    StreamEnd,
    StreamRequest,
    StreamRequestResponse,
)
from pipelines.quality.frames import ITEM_OPS, OSO_END, OSO_START, STREAM_OPS
from pipelines.quality.small.sql import (
    any_true,
    both,
    coalesce,
    concat,
    greatest,
    group,
    largest,
    min_by,
    order_key,
    smallest,
)
from pipelines.quality.streams import HISTORY_FLAGS, NO_END_SEQNO

Row = dict[str, Any]
_DATA = frozenset(DATA_OPS)
_ITEMS = frozenset(ITEM_OPS)
_STREAM = frozenset(STREAM_OPS)


def stream_frames(base: Sequence[Row]) -> list[Row]:
    """:func:`pipelines.quality.frames.stream_frames` without seeds: per (session, vbucket),
    in session order, each frame's stream and snapshot numbers, the request it answers, and
    whether its seqno regresses or lies outside its snapshot."""
    frames = [dict(f) for f in base if f["op"] in _STREAM and f["vbucket"] is not None]
    pairs = group(frames, lambda f: (f["session_id"], f["vbucket"]))
    for pair in pairs.values():
        pair.sort(key=lambda f: order_key((f["file_sequence"], f["offset"])))
        _place(pair)
    return frames


def _place(pair: list[Row]) -> None:
    opened = requests = snapshot_no = rollback_no = 0
    rollback_floor = requested_start = requested_end = answered = None
    highest: dict[int, int | None] = {}  # rollback_no → highest item seqno so far
    for f in pair:
        op = f["op"]
        status_ok = None if f["status"] is None else f["status"] == 0
        opens = both(op == StreamRequestResponse.op, status_ok)
        oso_flags = coalesce(f["oso_flags"], 0)
        opens_snapshot = (
            op == SnapshotMarker.op
            or (op == OsoSnapshot.op and oso_flags & OSO_START != 0)
            or opens is True
        )
        rollback = op == StreamRequestResponse.op and f["rollback_seqno"] is not None
        request = op == StreamRequest.op
        is_item = op in _ITEMS and f["seqno"] is not None
        opened += opens is True
        requests += request
        snapshot_no += opens_snapshot
        rollback_no += rollback
        if rollback:
            rollback_floor = f["rollback_seqno"]
        if request:
            requested_start = coalesce(f["start_seqno"], requested_start)
            requested_end = coalesce(f["end_seqno"], requested_end)
        if opens is True:
            answered = requests
        floor = greatest(highest.get(rollback_no), rollback_floor)
        seqno = f["seqno"]
        in_order = is_item and not coalesce(f["in_oso"], False)
        start, end = f["in_snapshot_start"], f["in_snapshot_end"]
        outside: bool | None = True
        if start is not None:
            below = None if seqno is None else seqno < start
            above = None if seqno is None or end is None else seqno > end
            outside = True if below or above else (None if None in (below, above) else False)
        f.update(
            opens_stream=opens,
            is_rollback=rollback,
            is_item=is_item,
            _opened=opened,
            _requests=requests,
            snapshot_no=snapshot_no,
            rollback_no=rollback_no,
            rollback_floor=rollback_floor,
            requested_start=requested_start,
            requested_end=requested_end,
            _answered=answered,
            stream_no=opened + (requests > coalesce(answered, 0)),
            regression=bool(in_order and floor is not None and seqno <= floor),
            seqno_floor=floor,
            out_of_range=both(in_order, outside),
        )
        if is_item:
            highest[rollback_no] = greatest(highest.get(rollback_no), seqno)


def _range(start: Any, end: Any) -> str | None:
    return concat("[", start, ", ", end, "]")


def snapshots(frames: Sequence[Row]) -> list[Row]:
    """:func:`pipelines.quality.streams.snapshots`: one row per snapshot group of a stream,
    its range, what arrived in it, and whether it is complete and committed."""
    groups = group(
        frames,
        lambda f: (
            f["session_started_at"],
            f["session_id"],
            f["vbucket"],
            f["stream_no"],
            f["snapshot_no"],
        ),
    )
    return finish_snapshots([snapshot_row(key, rows) for key, rows in groups.items()])


def finish_snapshots(snaps: list[Row]) -> list[Row]:
    """Each snapshot row of a stream (:func:`snapshot_row`'s) with whether it is complete, is
    committed and is the stream's last, and where its missing items start."""
    for stream in group(snaps, lambda s: (s["session_id"], s["vbucket"], s["stream_no"])).values():
        stream.sort(key=lambda s: s["snapshot_no"])
        last = largest(s["snapshot_no"] for s in stream if s["kind"] is not None)
        later_starts: list[Any] = [None] * len(stream)  # the smallest start after each
        for i in range(len(stream) - 2, -1, -1):
            later_starts[i] = smallest([later_starts[i + 1], stream[i + 1]["start"]])
        for i, s in enumerate(stream):
            kind = s["kind"]
            if kind == "marker":
                first_start = later_starts[i]
                covered = first_start is not None and s["end"] is not None
                complete = s["reached_end"] or (covered and first_start <= s["end"])
            else:
                complete = s["oso_ended"] if kind == "oso" else None
            if kind == "oso":
                committed = s["oso_ended"]
            else:
                committed = s["reached_end"] or i + 1 < len(stream) or s["stream_ended"]
            last_seqno = s["last_seqno"]
            s.update(
                complete=complete,
                committed=committed,
                is_last=kind is not None and s["snapshot_no"] == last,
                missing_from=coalesce(None if last_seqno is None else last_seqno + 1, s["start"]),
            )
    return snaps


def snapshot_row(key: tuple[Any, ...], rows: list[Row]) -> Row:
    """The row of one snapshot group (``key``: session start, session, vbucket, stream and
    snapshot numbers) from its frames."""
    markers = [f for f in rows if f["op"] == SnapshotMarker.op]
    oso = [f for f in rows if f["op"] == OsoSnapshot.op]
    kinds = ["marker" for _ in markers]
    kinds += ["oso" for f in oso if coalesce(f["oso_flags"], 0) & OSO_START != 0]
    items = [f for f in rows if f["is_item"]]
    data = [f for f in rows if f["op"] in _DATA]
    out = [f for f in rows if f["out_of_range"] is True]
    regressions = [f for f in rows if f["regression"]]

    def reached(f: Row) -> bool:
        end = f["in_snapshot_end"]
        in_order = f["is_item"] and not coalesce(f["in_oso"], False)
        return bool(in_order and end is not None and f["seqno"] >= end)

    return {
        "session_started_at": key[0],
        "session_id": key[1],
        "vbucket": key[2],
        "stream_no": key[3],
        "snapshot_no": key[4],
        "kind": largest(kinds),
        "start": largest(f["start_seqno"] for f in markers),
        "end": largest(f["end_seqno"] for f in markers),
        "flags": largest(f["snapshot_flags"] for f in markers),
        "items": len(items),
        "last_seqno": largest(f["seqno"] for f in items),
        "reached_end": any(reached(f) for f in rows),
        "oso_ended": any(coalesce(f["oso_flags"], 0) & OSO_END != 0 for f in oso),
        "stream_ended": any(f["op"] == StreamEnd.op for f in rows),
        "out_of_range": len(out),
        "out_of_range_seqno": min_by((f["seqno"], _position(f)) for f in out),
        "regressions": len(regressions),
        "first_regression": min_by(
            ((f["seqno"], f["seqno_floor"]), _position(f)) for f in regressions
        ),
        "data_events": len(data),
        "distinct_keys": len({(coalesce(f["collection_id"], 0), f["key"]) for f in data}),
    }


def _position(f: Row) -> tuple[Any, Any]:
    return (f["file_sequence"], f["offset"])


def duplicate_seqnos(frames: Sequence[Row]) -> list[Row]:
    """:func:`pipelines.quality.streams.duplicate_seqnos`: the data events whose (vbucket, vb
    uuid, seqno) repeats inside one stream or names different changes."""
    data = [f for f in frames if f["op"] in _DATA]
    found = []
    for (vbucket, _, seqno), rows in group(
        data, lambda f: (f["vbucket"], f["in_vb_uuid"], f["seqno"])
    ).items():
        if vbucket is None or seqno is None:
            continue  # the Spark join's equality never matches a null
        streams = {(f["session_id"], f["stream_no"]) for f in rows}
        versions = {
            (
                coalesce(f["collection_id"], 0),
                f["key"],
                f["rev_seqno"],
                f["cas"],
                f["op"] == Mutation.op,
            )
            for f in rows
        }
        if len(rows) <= len(streams) and len(versions) <= 1:
            continue
        problem = "with different changes" if len(versions) > 1 else "repeated"
        found += [
            {
                "session_started_at": f["session_started_at"],
                "session_id": f["session_id"],
                "vbucket": f["vbucket"],
                "stream_no": f["stream_no"],
                "in_vb_uuid": f["in_vb_uuid"],
                "seqno": f["seqno"],
                "problem": problem,
                "snapshot_no": f.get("snapshot_no"),
            }
            for f in rows
        ]
    return found


STREAM_COLUMNS = (
    "where",
    "vbucket",
    "session_started_at",
    "session_id",
    "stream_no",
    "latest",
    "snapshots",
    "items",
    "out_of_range",
    "out_of_range_detail",
    "incomplete",
    "incomplete_detail",
    "last_snapshot_complete",
    "open_start",
    "open_end",
    "open_last_seqno",
    "open_missing_from",
    "open_detail",
    "regressions",
    "regression_detail",
    "duplicate_seqnos",
    "duplicate_seqno_detail",
    "duplicate_keys",
    "duplicate_key_detail",
    "bounded",
    "requested_start",
    "requested_end",
    "end_reason_code",
    "bounded_end_ok",
    "end_detail",
    "producer_high",
    "complete_end",
)
"""The ``snapshot_completeness`` frame's columns, in the Spark frame's order."""


def _stream_key(r: Row) -> tuple[Any, ...]:
    return (r["session_started_at"], r["session_id"], r["vbucket"], r["stream_no"])


def stream_metrics(
    frames: Sequence[Row],
    snaps: Sequence[Row],
    duplicates: Sequence[Row],
    items: Mapping[tuple[Any, ...], tuple[int, Any, Any]] | None = None,
) -> list[Row]:
    """:func:`pipelines.quality.streams.stream_metrics` over everything: one row per stream
    that opened or sent items, ``latest`` on the newest stream of each vbucket. ``items``:
    per stream key, the count and highest seqno of items and the highest end of snapshot
    markers not among ``frames`` (the columnar check's, :mod:`.item_snapshots`)."""
    return finish_streams(stream_partials(frames, snaps, duplicates, items))


def stream_partials(
    frames: Sequence[Row],
    snaps: Sequence[Row],
    duplicates: Sequence[Row],
    items: Mapping[tuple[Any, ...], tuple[int, Any, Any]] | None = None,
) -> dict[tuple[Any, ...], Row]:
    """Per stream key, what ``frames``, their snapshots, duplicates and ``items`` say of it
    (:func:`stream_partial`): a part that :func:`combine_partials` adds to another part of
    the same stream."""
    items = items or {}
    by_frames = group(frames, _stream_key)
    by_snaps = group(snaps, _stream_key)
    by_duplicates = group(duplicates, _stream_key)
    return {
        key: stream_partial(
            by_frames.get(key, []),
            by_snaps.get(key, []),
            by_duplicates.get(key, []),
            items.get(key, (0, None, None)),
        )
        for key in dict.fromkeys([*by_frames, *by_snaps, *by_duplicates, *items])
    }


_SUMS = (
    "stream_items",
    "snapshots",
    "items",
    "out_of_range",
    "incomplete",
    "regressions",
    "duplicate_keys",
    "duplicate_seqnos",
)
_MINS = (
    "stream_end",
    "out_of_range_first",
    "incomplete_first",
    "regression_first",
    "repeat_first",
    "duplicate_first",
)


def combine_partials(a: Row, b: Row) -> Row:
    """Two parts of one stream (:func:`stream_partial`'s, of disjoint frames) as one: counts
    summed, first problems and the end the earliest, the rest the highest (Spark's
    :func:`pipelines.quality.streams.combine`)."""
    return {
        c: a[c] + b[c]
        if c in _SUMS
        else smallest([a[c], b[c]])
        if c in _MINS
        else largest([a[c], b[c]])
        for c in a
    }


def finish_streams(partials: Mapping[tuple[Any, ...], Row]) -> list[Row]:
    """The ``snapshot_completeness`` rows of the streams that opened or sent items, from
    their whole parts, ``latest`` on the newest stream of each vbucket."""
    streams = []
    names = ("session_started_at", "session_id", "vbucket", "stream_no")
    for key, stream in partials.items():
        if stream["opened"] is True or stream["stream_items"] > 0:
            streams.append({**dict(zip(names, key, strict=True)), **stream})
    for vbucket in group(streams, lambda s: s["vbucket"]).values():
        newest = max(
            vbucket,
            key=lambda s: order_key((s["session_started_at"], s["session_id"], s["stream_no"])),
        )
        for s in vbucket:
            s["latest"] = s is newest
    return [stream_report(s) for s in streams]


def _first(rows: Sequence[Row], text: Any) -> tuple[Any, Any] | None:
    """The (snapshot number, text) of the first of ``rows`` (Spark's ``min`` of the struct)."""
    return smallest((r["snapshot_no"], text(r)) for r in rows)


def stream_partial(
    frames: list[Row], snaps: list[Row], duplicates: list[Row], more: tuple[int, Any, Any]
) -> Row:
    marked = [s for s in snaps if s["kind"] is not None]
    incomplete = [s for s in marked if not s["is_last"] and s["complete"] is False]
    repeats = [
        s
        for s in marked
        if s["data_events"] > s["distinct_keys"] and coalesce(s["flags"], 0) & HISTORY_FLAGS == 0
    ]
    opening = [f for f in frames if f["opens_stream"] is True]
    ends = [f for f in frames if f["op"] == StreamEnd.op]
    items = [f for f in frames if f["is_item"]]

    def missing(s: Row) -> str | None:
        end = "its end marker" if s["end"] is None else str(s["end"])
        return concat(_range(s["start"], s["end"]), " missing ", s["missing_from"], "..", end)

    def repeat(s: Row) -> str | None:
        return concat(
            _range(s["start"], s["end"]),
            ": ",
            s["data_events"],
            " data events for ",
            s["distinct_keys"],
            " keys",
        )

    def out_of_range(s: Row) -> str | None:
        where = coalesce(_range(s["start"], s["end"]), "any snapshot")
        return concat("seqno ", s["out_of_range_seqno"], " outside ", where)

    def regression(s: Row) -> str | None:
        seqno, floor = s["first_regression"]
        return concat("seqno ", seqno, " after ", floor)

    last = None
    if marked:  # the snapshot numbers of a stream are unique: the newest is the largest tuple
        s = max(marked, key=lambda s: s["snapshot_no"])
        fields = ("snapshot_no", "kind", "start", "end", "last_seqno", "complete", "missing_from")
        last = tuple(s[c] for c in fields)
    return {
        "opened": any_true(f["opens_stream"] for f in frames),
        "stream_items": len(items) + more[0],
        "requested_start": largest(f["requested_start"] for f in opening),
        "requested_end": largest(f["requested_end"] for f in opening),
        "stream_end": smallest(
            ((f["file_sequence"], f["offset"]), f["reason_code"], f["reason"]) for f in ends
        ),
        "max_item_seqno": largest([*(f["seqno"] for f in items), more[1]]),
        "max_marker_end": largest(
            [*(f["end_seqno"] for f in frames if f["op"] == SnapshotMarker.op), more[2]]
        ),
        "snapshots": len(marked),
        "items": sum(s["items"] for s in snaps),
        "out_of_range": sum(s["out_of_range"] for s in snaps),
        "out_of_range_first": _first([s for s in snaps if s["out_of_range"] > 0], out_of_range),
        "incomplete": len(incomplete),
        "incomplete_first": _first(incomplete, missing),
        "last": last,
        "regressions": sum(s["regressions"] for s in snaps),
        "regression_first": _first([s for s in snaps if s["regressions"] > 0], regression),
        "duplicate_keys": len(repeats),
        "repeat_first": _first(repeats, repeat),
        "complete_end": largest(
            coalesce(s["end"], s["last_seqno"]) for s in snaps if s["complete"] is True
        ),
        "duplicate_seqnos": len(duplicates),
        "duplicate_first": smallest(
            (d["seqno"], concat("seqno ", d["seqno"], " ", d["problem"])) for d in duplicates
        ),
    }


def stream_report(s: Row) -> Row:
    """:func:`pipelines.quality.streams._stream_report`'s columns of one stream."""
    requested_end = s["requested_end"]
    bounded = requested_end is not None and requested_end != NO_END_SEQNO
    last = s["last"]
    last_open = last is not None and not coalesce(last[5], False)
    _, _, start, end, last_seqno, _, missing_from = last if last is not None else (None,) * 7
    stream_end = s["stream_end"]
    reason_code = None if stream_end is None else stream_end[1]
    end_ok = bool(reason_code == 0) or not s["latest"]
    ended = None if stream_end is None else concat("ended ", stream_end[2], " (", reason_code, ")")
    detail = None
    if last_open:
        detail = concat(
            coalesce(_range(start, end), "OSO backfill"),
            " received up to ",
            "nothing" if last_seqno is None else str(last_seqno),
            ", missing ",
            missing_from,
            "..",
            "its end marker" if end is None else str(end),
        )

    def text(first: tuple[Any, Any] | None) -> str | None:
        return None if first is None else first[1]

    return {
        "where": concat(
            "vb ", s["vbucket"], " · session ", s["session_id"], " · stream ", s["stream_no"]
        ),
        "vbucket": s["vbucket"],
        "session_started_at": s["session_started_at"],
        "session_id": s["session_id"],
        "stream_no": s["stream_no"],
        "latest": s["latest"],
        "snapshots": s["snapshots"],
        "items": s["items"],
        "out_of_range": s["out_of_range"],
        "out_of_range_detail": text(s["out_of_range_first"]),
        "incomplete": s["incomplete"],
        "incomplete_detail": text(s["incomplete_first"]),
        "last_snapshot_complete": not last_open if s["latest"] and last is not None else None,
        "open_start": start if last_open else None,
        "open_end": end if last_open else None,
        "open_last_seqno": last_seqno if last_open else None,
        "open_missing_from": missing_from if last_open else None,
        "open_detail": detail,
        "regressions": s["regressions"],
        "regression_detail": text(s["regression_first"]),
        "duplicate_seqnos": s["duplicate_seqnos"],
        "duplicate_seqno_detail": text(s["duplicate_first"]),
        "duplicate_keys": s["duplicate_keys"],
        "duplicate_key_detail": text(s["repeat_first"]),
        "bounded": bounded,
        "requested_start": s["requested_start"],
        "requested_end": requested_end if bounded else None,
        "end_reason_code": reason_code,
        "bounded_end_ok": end_ok if bounded else None,
        "end_detail": concat(
            "asked to end at ", requested_end, ", ", coalesce(ended, "no stream end")
        )
        if bounded and not end_ok
        else None,
        "producer_high": greatest(s["max_item_seqno"], s["max_marker_end"], s["requested_start"]),
        "complete_end": greatest(s["complete_end"], s["requested_start"]),
    }
