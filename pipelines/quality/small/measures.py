"""The small check's ``stream_coverage``, ``silver_reconciliation`` and ``bronze_integrity``
metric frames, by the rules of :mod:`pipelines.quality.measures` (whose docstrings say them),
here over rows in the driver.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pipelines.quality.measures import CHECKSUM_MODULUS
from pipelines.quality.small.history import on_branch, with_branch
from pipelines.quality.small.sql import (
    any_true,
    coalesce,
    concat,
    group,
    largest,
    lower_hex,
    min_by,
    smallest,
    xxhash64,
)

Row = dict[str, Any]

COVERAGE_COLUMNS = (
    "where",
    "vbucket",
    "latest_session",
    "bounded",
    "requested_end",
    "producer_high",
    "complete_end",
    "applied_consistent",
    "applied_last",
    "rolled_back_rows",
    "rolled_back_detail",
    "on_cluster_branch",
    "cluster_branch_detail",
)
RECONCILIATION_COLUMNS = (
    "where",
    "collection_id",
    "collection",
    "silver_table",
    "bronze_live",
    "silver_live",
    "bronze_checksum",
    "silver_checksum",
    "dropped_rows",
    "dropped_detail",
    "expired_live_rows",
    "expired_detail",
)
FILE_COLUMNS = (
    "where",
    "file",
    "session_id",
    "file_sequence",
    "frames",
    "null_required",
    "null_detail",
    "unknown_opcodes",
    "unknown_detail",
    "malformed",
    "malformed_detail",
    "truncated",
    "truncated_mid_session",
    "truncated_detail",
)


def _utf8(key: bytes | str | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


def checksum(pairs: Iterable[tuple[bytes | str | None, int | None]]) -> int:
    """:func:`pipelines.quality.measures.checksum`: Spark's ``xxhash64`` of each (key,
    seqno), summed exactly and reduced modulo :data:`CHECKSUM_MODULUS`."""
    return sum(xxhash64(_utf8(key), seqno) for key, seqno in pairs) % CHECKSUM_MODULUS


def rolled_rows(
    silver_rows: Sequence[Row],
    branches: dict[Any, list[tuple[Any, Any]]],
    dead_changes: set[tuple[Any, Any, Any]],
) -> list[Row]:
    """The rows of silver that bronze's history rolled back (of a dead branch, or a dead
    change): per row its ``vbucket``, ``rolled_seqno`` and the ``rolled`` text."""
    rows = with_branch(silver_rows, branches, vbucket="_vbucket", uuid="_vb_uuid", seqno="_seqno")
    return [
        {
            "vbucket": r["_vbucket"],
            "rolled_seqno": r["_seqno"],
            "rolled": concat(
                r["table"],
                " key ",
                r["key"],
                " seqno ",
                r["_seqno"],
                " of vb uuid ",
                r["_vb_uuid"],
            ),
        }
        for r in rows
        if r["dead_branch"] is True or _dead_change(r, dead_changes)
    ]


def coverage_metrics(
    streams: Sequence[Row], states: Sequence[Row], rolled: Sequence[Row], cluster: dict[Any, Row]
) -> list[Row]:
    """:func:`pipelines.quality.measures.coverage_metrics`: one row per vbucket of bronze
    (``rolled``: :func:`rolled_rows`)."""
    latest = [s for s in streams if s["latest"]]
    parts = group([*latest, *states, *rolled, *on_branch(states, cluster)], lambda r: r["vbucket"])
    out = []
    for vbucket, p in parts.items():
        latest_session = largest(r.get("session_id") for r in p)
        if latest_session is None:
            continue
        out.append(
            {
                "where": concat("vb ", vbucket),
                "vbucket": vbucket,
                "latest_session": latest_session,
                "bounded": any_true(r.get("bounded") for r in p),
                "requested_end": largest(r.get("requested_end") for r in p),
                "producer_high": largest(r.get("producer_high") for r in p),
                "complete_end": coalesce(largest(r.get("complete_end") for r in p), 0),
                "applied_consistent": coalesce(largest(r.get("consistent_seqno") for r in p), 0),
                "applied_last": coalesce(largest(r.get("last_applied_seqno") for r in p), 0),
                "rolled_back_rows": sum(1 for r in p if r.get("rolled") is not None),
                "rolled_back_detail": min_by((r.get("rolled"), r.get("rolled_seqno")) for r in p),
                "on_cluster_branch": smallest(r.get("on_cluster_branch") for r in p),
                "cluster_branch_detail": largest(r.get("cluster_branch_detail") for r in p),
            }
        )
    return out


def _dead_change(r: Row, dead: set[tuple[Any, Any, Any]]) -> bool:
    key = (r["_vbucket"], r["_vb_uuid"], r["_seqno"])
    return None not in key and key in dead


def reconciliation_metrics(
    bronze_live: Sequence[Row],
    silver_live: Sequence[Row],
    silver_rows: Sequence[Row],
    cuts: dict[tuple[Any, Any], tuple[bool, Any]],
    names: Sequence[Row],
    now: int | None = None,
) -> list[Row]:
    """:func:`pipelines.quality.measures.reconciliation_metrics`: one row per collection id
    (of bronze, of silver's rows or of its registry)."""
    now = int(time.time()) if now is None else now
    drops = {k for k, (dropped, _) in cuts.items() if dropped}
    in_dropped = [
        r
        for r in silver_rows
        if r["_collection_id"] is not None
        and r["_vbucket"] is not None
        and (r["_collection_id"], r["_vbucket"]) in drops
    ]
    bronze = group(bronze_live, lambda r: r["collection_id"])
    silver = group(silver_live, lambda r: r["_collection_id"])
    dropped = group(in_dropped, lambda r: r["_collection_id"])
    per_collection = {}
    for cid in dict.fromkeys([*bronze, *silver, *dropped]):
        b, s, d = bronze.get(cid, []), silver.get(cid, []), dropped.get(cid, [])
        per_collection[cid] = {
            "bronze_live": len(b),
            "bronze_checksum": checksum((r["key"], r["seqno"]) for r in b),
            "silver_live": len(s),
            "silver_checksum": checksum((r["key"], r["_seqno"]) for r in s),
            **described(s, d, now),
        }
    return named_collections(per_collection, names)


def described(silver_live: Sequence[Row], dropped: Sequence[Row], now: int) -> Row:
    """A collection's reconciliation columns that name rows: its live rows of silver that are
    expired, its rows in dropped vbuckets, its table."""
    expired = [r for r in silver_live if r["_expiry"] is not None and 0 < r["_expiry"] <= now]
    return {
        "expired_live_rows": len(expired),
        "expired_detail": min_by(
            (concat(r["table"], " key ", r["key"]), r["key"]) for r in expired
        ),
        "silver_table": smallest(r["table"] for r in [*silver_live, *dropped]),
        "dropped_rows": len(dropped),
        "dropped_detail": min_by(
            (concat(r["table"], " key ", r["key"], " in vb ", r["_vbucket"]), r["key"])
            for r in dropped
        ),
    }


EMPTY_COLLECTION = {
    "bronze_live": 0,
    "bronze_checksum": 0,
    "silver_live": 0,
    "silver_checksum": 0,
    **described([], [], 0),
}
"""The reconciliation columns of a collection only the registry names."""


def named_collections(per_collection: dict[Any, Row], names: Sequence[Row]) -> list[Row]:
    """One reconciliation row per collection id of ``per_collection`` (its measured columns)
    or of the registry's ``names``, each named as the registry names it."""
    known = group(names, lambda r: r["collection_id"])
    out = []
    for cid in dict.fromkeys([*per_collection, *known]):
        grouped = per_collection.get(cid, EMPTY_COLLECTION)
        for named in known.get(cid, [None]) if cid is not None else [None]:
            name = None if named is None else named["name"]
            where = coalesce(name, grouped["silver_table"], "(no silver table)")
            out.append(
                {
                    "where": concat("collection 0x", lower_hex(cid), " ", where),
                    "collection_id": cid,
                    "collection": name,
                    **grouped,
                }
            )
    return out


def file_metrics(
    base: Sequence[Row],
    quarantine: Sequence[Row],
    ingest_log: Sequence[Row],
    more_frames: Mapping[Any, int] | None = None,
) -> list[Row]:
    """:func:`pipelines.quality.measures.file_parts` and ``file_metrics``: one row per capture
    file of bronze, of the quarantine or of the ingest log's ingested files. ``more_frames``:
    per file, the frames not among ``base`` (the columnar check's items, all regular)."""
    files: dict[Any, Row] = {}

    def part(name: Any) -> Row:
        return files.setdefault(
            name,
            {
                "frames": 0,
                "null_required": 0,
                "unknown_opcodes": 0,
                "truncated": 0,
                "malformed": 0,
                "null_columns": set(),
                "unknowns": set(),
                "first_bad": None,
                "truncated_offset": None,
            },
        )

    for f in base:
        p = part(f["file"])
        p["frames"] += 1
        p["null_required"] += len(f["null_columns"])
        p["null_columns"].update(f["null_columns"])
        if f["unknown_opcode"]:
            p["unknown_opcodes"] += 1
            unknown = concat(f["op"], " 0x", lower_hex(f["opcode"]))
            if unknown is not None:
                p["unknowns"].add(unknown)
    for name, count in (more_frames or {}).items():
        part(name)["frames"] += count
    for q in quarantine:
        p = part(q["file"])
        if q["truncated"]:
            p["truncated"] += 1
            p["truncated_offset"] = smallest([p["truncated_offset"], q["offset"]])
        else:
            p["malformed"] += 1
            p["first_bad"] = smallest([p["first_bad"], (q["offset"], q["reason"])])
    logged = [r for r in ingest_log if r["status"] == "ingested"]
    last = {
        session: largest(r["file_sequence"] for r in rows)
        for session, rows in group(logged, lambda r: r["session_id"]).items()
    }
    joined: list[tuple[Any, Row | None, Row | None]] = []
    by_file = group(logged, lambda r: r["file"])
    for name, p in files.items():
        matches = by_file.get(name, []) if name is not None else []
        joined += [(name, p, m) for m in matches] or [(name, p, None)]
    joined += [(r["file"], None, r) for r in logged if r["file"] is None or r["file"] not in files]
    return [_file_row(name, p, m, last) for name, p, m in joined]


def _file_row(name: Any, p: Row | None, logged: Row | None, last: dict[Any, Any]) -> Row:
    session = None if logged is None else logged["session_id"]
    sequence = None if logged is None else logged["file_sequence"]
    last_of_session = None
    if logged is not None and sequence is not None and last.get(session) is not None:
        last_of_session = sequence == last[session]
    counts = {
        c: 0 if p is None else p[c]
        for c in ("frames", "null_required", "unknown_opcodes", "malformed", "truncated")
    }
    null_columns = [] if p is None else sorted(p["null_columns"])
    unknowns = [] if p is None else sorted(p["unknowns"])
    bad = None if p is None else p["first_bad"]
    offset = None if p is None else p["truncated_offset"]
    mid_session = 0 if last_of_session else counts["truncated"]
    return {
        "where": concat(
            None if name is None else name.split("/")[-1],
            " (session ",
            coalesce(session, "?"),
            " #",
            "?" if sequence is None else str(sequence),
            ")",
        ),
        "file": name,
        "session_id": session,
        "file_sequence": sequence,
        "frames": counts["frames"],
        "null_required": counts["null_required"],
        "null_detail": ", ".join(null_columns) if counts["null_required"] > 0 else None,
        "unknown_opcodes": counts["unknown_opcodes"],
        "unknown_detail": ", ".join(unknowns) if counts["unknown_opcodes"] > 0 else None,
        "malformed": counts["malformed"],
        "malformed_detail": None if bad is None else concat("offset ", bad[0], ": ", bad[1]),
        "truncated": counts["truncated"],
        "truncated_mid_session": mid_session,
        "truncated_detail": concat(
            "cut tail at offset ", offset, ", but later files of the session exist"
        )
        if mid_session > 0
        else None,
    }
