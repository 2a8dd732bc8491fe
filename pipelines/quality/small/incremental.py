"""The columnar check from the last one's state (:mod:`.carried`): the metric frames of a
check over everything, computed from the frames of the ingest runs committed since, the
carried tails they continue, and the collection tables' change feed since, not from all of
bronze and silver (docs on quality, "what a check reads").

The new frames and the tails are placed from each pair's seed (:func:`.placement.place`);
each stream's row combines its carried settled part with the part of these frames
(:func:`.streams.combine_partials`). Bronze's live documents change where these frames
commit a change not counted before: each such key's newest change replaces what the key
counted then, which is its silver view row then (the last check found both sides equal); the
view rows then and now of the keys silver changed come from the change feed
(:mod:`.silver_changes`). Expiries that passed since leave both sides (the TTL lists).

A state cannot answer everything: :class:`~pipelines.errors.FullCheckNeeded` names why, and
the check reads everything. That is when the last check found the sides apart; bronze was
written by anything but ingest since; a new frame sits at or before a checked one of its
pair, lands in a settled snapshot, holds a rollback, a failover log other than the one its
vbucket's streams opened with,
a change on a dead branch, a collection dropped, flushed or created again, or a data seqno
at or below a settled one of its vbucket and branch; silver has not applied what it
commits; or what the last check read of silver (a table's change feed, the live layer) is
gone.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from dcp_cdc.events import DATA_OPS, Mutation, SystemEvent
from pipelines.bronze import store
from pipelines.errors import FullCheckNeeded
from pipelines.lake import delta_io
from pipelines.lake.delta_rs import plain_types, spark_rows, table_batches
from pipelines.quality.compute import Metrics
from pipelines.quality.small import history, measures, streams
from pipelines.quality.small.carried import State, apart
from pipelines.quality.small.columnar import collections_paused
from pipelines.quality.small.compute import SmallCheck
from pipelines.quality.small.cuts import carry_streams
from pipelines.quality.small.item_history import (
    committed_snapshots,
    dead_branch,
    outside_cuts,
    with_places,
)
from pipelines.quality.small.item_snapshots import (
    duplicate_candidates,
    file_frames,
    snapshot_groups,
)
from pipelines.quality.small.items import _flags, _numbers, _present, newest_per, split
from pipelines.quality.small.live_sums import (
    add,
    count_tables,
    expire,
    hashes,
    shown,
    without_keys,
)
from pipelines.quality.small.placement import place
from pipelines.quality.small.read import BASE_READ, base_frames_of, side_tables, silver_names
from pipelines.quality.small.silver_changes import SilverChanges, silver_changes
from pipelines.tables import BucketTables

Row = dict[str, Any]
TABLES = ("events", "quarantine")


@dataclass
class _New:
    """The frames this check reads: the new runs' (``new``) and the region placed again
    (the tails and the new frames)."""

    new: pa.Table
    region: pa.Table
    counted_before: np.ndarray


def compute_incremental(
    spark: SparkSession, bucket: str, at: Mapping[str, int], state: State
) -> tuple[SmallCheck, State]:
    """The metric frames of ``bucket`` at ``at`` from ``state``, and the state to carry."""
    with collections_paused():
        return _compute(spark, bucket, at, state)


def _compute(
    spark: SparkSession, bucket: str, at: Mapping[str, int], state: State
) -> tuple[SmallCheck, State]:
    if state.apart is not None:
        raise FullCheckNeeded(f"the last check found bronze and silver apart ({state.apart})")
    txns = _only_ingest_wrote(spark, bucket, at, state)
    now = int(time.time())
    quarantine, ingest_log = side_tables(spark, bucket, at)
    read = _read(spark, bucket, at, state, ingest_log, txns)
    bronze = split(read.region)
    seeds = {pair: cut.seed for pair, cut in state.pairs.items()}
    placed = place(bronze, seeds)
    snaps, per_stream, groups = snapshot_groups(bronze, placed)
    _must_continue(state, bronze, placed)
    state = replace(state, branches={**history.latest_branches(placed.frames), **state.branches})
    cuts = {**state.cuts, **_new_cuts(state, bronze, placed, snaps)}
    candidates = duplicate_candidates(bronze, placed)
    duplicates = streams.duplicate_seqnos(candidates)
    parts = streams.stream_partials(
        placed.frames, snaps, [*duplicates, *state.duplicates], per_stream
    )
    merged = dict(state.streams)
    for k, part in parts.items():
        merged[k] = streams.combine_partials(merged[k], part) if k in merged else part
    stream_rows = streams.finish_streams(merged)
    counted = _counted(bronze, placed, snaps, cuts)
    states, known, sources = silver_names(spark, bucket, at)
    changes = silver_changes(spark, bucket, sources, state.at, at)
    sums = {c: replace(s, tables=dict(s.tables)) for c, s in state.sums.items()}
    before = read.counted_before[bronze.item_rows]
    bronze_ttl = _bronze_side(sums, bronze, counted, before, changes, state, now)
    _caught_up(bronze, counted & ~before, states)
    silver_ttl, rolled, dropped = _silver_side(sums, changes, state, now)
    control = pa.concat_tables([state.control, read.new.filter(_control_mask(read.new))])
    control_rows = base_frames_of(control)
    files = Counter(state.files)
    files.update(file_frames(split(read.new).items))
    metrics = {
        "snapshot_completeness": Metrics(stream_rows, streams.STREAM_COLUMNS),
        "stream_coverage": Metrics(
            measures.coverage_metrics(
                stream_rows,
                states,
                [r["row"] for r in rolled],
                history.cluster_branches(control_rows),
            ),
            measures.COVERAGE_COLUMNS,
        ),
        "silver_reconciliation": Metrics(
            measures.named_collections(_per_collection(sums, dropped, now), known),
            measures.RECONCILIATION_COLUMNS,
        ),
        "bronze_integrity": Metrics(
            measures.file_metrics(control_rows, quarantine, ingest_log, files),
            measures.FILE_COLUMNS,
        ),
    }
    carried = carry_streams(
        read.region, bronze, placed, snaps, groups, duplicates, counted, state.streams
    )
    data_max = dict(state.data_max)
    for k, top in carried.data_max.items():
        data_max[k] = max(top, data_max.get(k, top))
    next_state = State(
        at=dict(at),
        txns=txns,
        now=now,
        apart=apart(metrics["silver_reconciliation"].rows),
        pairs={**state.pairs, **carried.pairs},
        tail=carried.tail,
        control=control,
        streams=carried.streams,
        duplicates=[*state.duplicates, *carried.duplicates],
        data_max=data_max,
        files=dict(files),
        branches=state.branches,
        cuts=cuts,
        dead_changes=state.dead_changes,
        sums=sums,
        rolled=rolled,
        dropped=dropped,
        bronze_ttl=bronze_ttl,
        silver_ttl=silver_ttl,
    )
    return SmallCheck(metrics, ingest_log), next_state


def _only_ingest_wrote(
    spark: SparkSession, bucket: str, at: Mapping[str, int], state: State
) -> dict[str, int | None]:
    """The events and quarantine tables' last ingest run at ``at``; :class:`FullCheckNeeded`
    when anything but ingest wrote them since the last check."""
    names = BucketTables(bucket)
    txns: dict[str, int | None] = {}
    for kind in TABLES:
        table = getattr(names, kind)
        before, now = state.at.get(table), at.get(table)
        txns[kind] = (
            None
            if now is None
            else delta_io.committed_version_at(spark, table, store.TXN_APP_ID, now)
        )
        if before is None or now is None:
            continue
        if now < before:
            raise FullCheckNeeded(f"{table} is older than the last check read it")
        foreign = delta_io.foreign_commits(spark, table, store.TXN_APP_ID, before, now)
        if foreign:
            raise FullCheckNeeded(
                f"{table} was written outside ingest since the last check (version {foreign[0]})"
            )
    return txns


def _read(
    spark: SparkSession,
    bucket: str,
    at: Mapping[str, int],
    state: State,
    ingest_log: list[Row],
    txns: Mapping[str, int | None],
) -> _New:
    """The new runs' frames, and the region: the carried tails and the new frames."""
    events = BucketTables(bucket).events
    old, upto = state.txns.get("events") or 0, txns.get("events")
    runs = sorted(
        {
            r["ingest_run_id"]
            for r in ingest_log
            if r["ingest_run_id"] is not None
            and r["run_version"] is not None
            and old < r["run_version"]
            and (upto is None or r["run_version"] <= upto)
        }
    )
    if runs:
        listed = ", ".join("'" + r.replace("'", "''") + "'" for r in runs)
        where = (
            f"ingest_run_id BETWEEN '{runs[0]}' AND '{runs[-1]}' AND ingest_run_id IN ({listed})"
        )
        batches = table_batches(spark, events, BASE_READ, at.get(events), where=where)
        new = plain_types(batches.read_all())
    else:
        new = state.tail.drop_columns(["counted"]).schema.empty_table()
    tail = state.tail.drop_columns(["counted"])
    new = new.select(tail.column_names).cast(tail.schema)
    _in_order(new, state)
    region = pa.concat_tables([tail, new])
    counted = np.r_[_flags(state.tail["counted"]), np.zeros(new.num_rows, bool)]
    return _New(new, region, counted)


def _pair_vbucket(events: pa.Table) -> np.ndarray:
    """Each frame's vbucket as its pair takes it (a response's opaque)."""
    vbucket = pc.if_else(
        pc.is_valid(events["status"]),
        events["opaque"].cast(pa.int64()),
        events["vbucket"].cast(pa.int64()),
    )
    return np.asarray(pc.fill_null(vbucket, -1).to_numpy(zero_copy_only=False), np.int64)


def _in_order(new: pa.Table, state: State) -> None:
    """:class:`FullCheckNeeded` when a new frame sits at or before the last frame checked of
    its pair (a file ingested after later ones of its session were checked)."""
    if not new.num_rows:
        return
    sessions = new["session_id"].to_pylist()
    vbuckets = _pair_vbucket(new)
    position = np.c_[_numbers(new["file_sequence"]), _numbers(new["offset"])]
    for i, (session, vbucket) in enumerate(zip(sessions, vbuckets.tolist(), strict=True)):
        cut = state.pairs.get((session, vbucket))
        if cut is not None and tuple(position[i]) <= cut.position:
            raise FullCheckNeeded("a file ingested after later ones of its session were checked")


def _new_cuts(state: State, bronze: Any, placed: Any, snaps: list[Row]) -> dict[Any, Any]:
    """The collection cuts of the (collection, vbucket) pairs whose history starts among the
    frames read here; :class:`FullCheckNeeded` when they drop or flush one, or create again
    one the state knows."""
    system = np.flatnonzero(_flags(pc.equal(bronze.items["op"], SystemEvent.op)))
    if not len(system):
        return {}
    rows = with_places(bronze.item_dicts(system), system, placed)
    alive, _ = history.split_history(rows, state.branches, history.rollbacks(placed.frames))
    found = history.collection_cuts(history.committed_items(alive, snaps))
    if any(k in state.cuts or k[1] is None or cut != (False, None) for k, cut in found.items()):
        raise FullCheckNeeded("the new frames hold a collection dropped or created again")
    return found


def _must_continue(state: State, bronze: Any, placed: Any) -> None:
    """:class:`FullCheckNeeded` when the frames placed here change what the state settled."""
    frames = placed.frames
    if any(f["is_rollback"] for f in frames):
        raise FullCheckNeeded("the new frames hold a rollback")
    for vbucket, log in history.latest_branches(frames).items():
        if state.branches.get(vbucket, log) != log:
            raise FullCheckNeeded("the new frames hold a new failover log")
    items = bronze.items
    data = _flags(pc.is_in(items["op"], value_set=pa.array(DATA_OPS)))
    vbucket, seqno = _numbers(items["vbucket"]), _numbers(items["seqno"])
    uuid, has_uuid = _numbers(items["in_vb_uuid"]), _present(items["in_vb_uuid"])
    branches = {**history.latest_branches(frames), **state.branches}
    if (data & dead_branch(vbucket, uuid, has_uuid, seqno, branches)).any():
        raise FullCheckNeeded("the new frames hold a change on a dead branch")
    top = np.array(
        [
            state.data_max.get((v, u if h else None), -1)
            for v, u, h in zip(vbucket[data], uuid[data], has_uuid[data], strict=True)
        ],
        np.int64,
    )
    if (seqno[data] <= top).any():
        raise FullCheckNeeded("a stream sent a seqno at or below one already checked")
    _lands_settled(state, bronze, placed)


def _lands_settled(state: State, bronze: Any, placed: Any) -> None:
    """:class:`FullCheckNeeded` when a frame joins a snapshot the state settled (a pair
    carried with no tail whose frames continue its last group)."""
    settled = {pair: cut.last for pair, cut in state.pairs.items() if cut.group is None}
    found = {
        (f["session_id"], f["vbucket"], f["stream_no"], f["snapshot_no"]) for f in placed.frames
    }
    sessions = [bronze.sessions[s][1] for s in bronze.session[bronze.item_rows]]
    found |= set(
        zip(
            sessions,
            _numbers(bronze.items["vbucket"]).tolist(),
            placed.stream_no.tolist(),
            placed.snapshot_no.tolist(),
            strict=True,
        )
    )
    for session, vbucket, stream, snapshot in found:
        if settled.get((session, vbucket)) == (stream, snapshot):
            raise FullCheckNeeded("a new frame joins a snapshot already settled")


def _counted(bronze: Any, placed: Any, snaps: list[Row], cuts: Mapping[Any, Any]) -> np.ndarray:
    """Per item, whether it is a change the live documents are taken from."""
    items = bronze.items
    data = _flags(pc.is_in(items["op"], value_set=pa.array(DATA_OPS)))
    committed = committed_snapshots(placed, bronze, snaps)[placed.snapshot]
    vbucket, seqno = _numbers(items["vbucket"]), _numbers(items["seqno"])
    cid = _numbers(items["collection_id"])
    return np.asarray(data & committed & outside_cuts(cid, vbucket, seqno, dict(cuts)), bool)


def _bronze_side(
    sums: dict[int, Any],
    bronze: Any,
    counted: np.ndarray,
    before: np.ndarray,
    changes: SilverChanges,
    state: State,
    now: int,
) -> pa.Table:
    """Bronze's side of ``sums`` updated: the keys with a change counted here for the first
    time take their newest counted change, in place of what they counted then (their view
    row then); the expiries passed since leave. The TTL list to carry."""
    items = bronze.items
    fresh = items.filter(pa.array(counted & ~before))
    keys = (
        pa.table(
            {
                "collection_id": pc.cast(pc.fill_null(fresh["collection_id"], 0), pa.int64()),
                "key": fresh["key"],
            }
        )
        .group_by(["collection_id", "key"])
        .aggregate([])
    )
    ttl, _ = without_keys(state.bronze_ttl, "collection_id", keys)
    ttl = expire(sums, ttl, "bronze", now, cid="collection_id", seqno="seqno", expiry="expiration")
    if not keys.num_rows:
        return ttl
    _, then = without_keys(changes.before, "_collection_id", keys)
    was = then.filter(pa.array(shown(then, state.now)))
    add(sums, "bronze", _numbers(was["_collection_id"]), hashes(was["key"], was["_seqno"]), -1)
    changed = items.filter(pa.array(counted))
    changed = changed.set_column(
        changed.schema.get_field_index("collection_id"),
        "collection_id",
        pc.cast(pc.fill_null(changed["collection_id"], 0), pa.int64()),
    )
    _, changed = without_keys(changed, "collection_id", keys)
    newest = newest_per(
        changed.select(["collection_id", "key", "seqno", "rev_seqno", "op", "expiration"]),
        ["collection_id", "key"],
        ["seqno", "rev_seqno"],
    )
    expiry = _numbers(newest["expiration"])
    live = _flags(pc.equal(newest["op"], Mutation.op)) & ((expiry == 0) | (expiry > now))
    newest = newest.filter(pa.array(live))
    add(
        sums, "bronze", _numbers(newest["collection_id"]), hashes(newest["key"], newest["seqno"]), 1
    )
    ahead = newest.filter(pa.array(_numbers(newest["expiration"]) > 0))
    return pa.concat_tables([ttl, ahead.select(ttl.column_names).cast(ttl.schema)])


def _caught_up(bronze: Any, fresh: np.ndarray, states: list[Row]) -> None:
    """:class:`FullCheckNeeded` unless silver applied every change counted here first (its
    stream state's last applied seqno reaches it in each vbucket)."""
    applied = {s["vbucket"]: s["last_applied_seqno"] or 0 for s in states}
    vbucket = _numbers(bronze.items["vbucket"])[fresh]
    seqno = _numbers(bronze.items["seqno"])[fresh]
    for v in np.unique(vbucket):
        if int(seqno[vbucket == v].max()) > applied.get(int(v), 0):
            raise FullCheckNeeded(f"silver has not applied what bronze commits in vb {int(v)}")


def _silver_side(
    sums: dict[int, Any], changes: SilverChanges, state: State, now: int
) -> tuple[pa.Table, list[Row], list[Row]]:
    """Silver's side of ``sums`` updated from the changed keys' view rows then and now, and
    the expiries passed since; the TTL list, the rolled and dropped rows to carry."""
    ttl, _ = without_keys(state.silver_ttl, "_collection_id", changes.keys)
    ttl = expire(sums, ttl, "silver", now, cid="_collection_id", seqno="_seqno", expiry="_expiry")
    changed = {
        (r["cid"], r["key"]) for r in changes.keys.rename_columns(["cid", "key"]).to_pylist()
    }
    drops = {(c, v) for (c, v), (dropped, _) in state.cuts.items() if dropped and v is not None}
    for sign, rows, at in ((-1, changes.before, state.now), (1, changes.after, now)):
        visible = shown(rows, at)
        seen = rows.filter(pa.array(visible))
        add(
            sums,
            "silver",
            _numbers(seen["_collection_id"]),
            hashes(seen["key"], seen["_seqno"]),
            sign,
        )
        cids, views = _numbers(rows["_collection_id"]), rows["table"].to_pylist()
        vbs = _numbers(rows["_vbucket"])
        in_drop = np.array(
            [(int(c), int(v)) in drops for c, v in zip(cids, vbs, strict=True)], bool
        )
        named = visible | in_drop
        count_tables(
            sums, [(int(c), t) for c, t, n in zip(cids, views, named, strict=True) if n], sign
        )
    after = changes.after
    ahead = after.filter(pa.array(shown(after, now) & (_numbers(after["_expiry"]) > 0)))
    ttl = pa.concat_tables([ttl, ahead.select(ttl.column_names).cast(ttl.schema)])
    rows = spark_rows(after)
    rolled = [r for r in state.rolled if (r["cid"], r["key"]) not in changed]
    for r, out in zip(rows, _rolled(rows, state), strict=True):
        if out is not None:
            rolled.append({"cid": r["_collection_id"], "key": r["key"], "row": out})
    dropped = [r for r in state.dropped if (r["_collection_id"], r["key"]) not in changed]
    dropped += [r for r in rows if (r["_collection_id"], r["_vbucket"]) in drops]
    return ttl, rolled, dropped


def _rolled(rows: list[Row], state: State) -> list[Row | None]:
    """Per view row, its :func:`.measures.rolled_rows` row, None where it is not one."""
    found: list[Row | None] = []
    for r in rows:
        out = measures.rolled_rows([r], state.branches, state.dead_changes)
        found.append(out[0] if out else None)
    return found


def _per_collection(sums: dict[int, Any], dropped: list[Row], now: int) -> dict[Any, Row]:
    by_cid: dict[int, list[Row]] = {}
    for r in dropped:
        by_cid.setdefault(r["_collection_id"], []).append(r)
    out = {}
    for cid, got in sums.items():
        if not (got.bronze_live or got.silver_live or by_cid.get(cid)):
            continue
        out[cid] = {
            "bronze_live": got.bronze_live,
            "bronze_checksum": got.bronze_checksum,
            "silver_live": got.silver_live,
            "silver_checksum": got.silver_checksum,
            **measures.described([], by_cid.get(cid, []), now),
            "silver_table": min(got.tables, default=None),
        }
    return out


def _control_mask(events: pa.Table) -> pa.Array:
    from pipelines.quality.small.items import columnar

    return pa.array(~columnar(events))
