"""The silver apply job: bronze events → one current-state Delta table per collection.

Per run and bucket:

1. read the bronze frames no run has consumed yet (from the oldest run holding an unfinished
   snapshot of some vbucket) and walk each vbucket's frames in session order
   (:mod:`pipelines.silver.walk`, inside ``applyInArrow``): only complete snapshots commit;
2. register collections from committed system events (``silver.<bucket>__collections``);
3. retract rolled-back changes: every key of vbucket V with ``_seqno > R`` returns to its last
   state at or before R on the surviving branch, rebuilt from bronze;
4. apply drops and flushes: rows of the collection in V below the event's seqno go;
5. MERGE the newest committed change per key into its collection's table, only where it is
   newer than the row (replays and reordered batches are harmless); deletions and expirations
   become tombstones;
6. save each vbucket's position and state (``silver.<bucket>__stream_state``).

The table a user queries, ``silver.<bucket>__<scope>__<collection>``, is a view of live
documents (no tombstones, nothing past its expiry) over ``..._all``, which keeps tombstones
(names: :mod:`pipelines.tables`). This module orders the steps; the registry and the tables'
lifecycle are :mod:`pipelines.silver.registry`'s, the stream state and what to walk
:mod:`pipelines.silver.state`'s, the MERGEs and deletes :mod:`pipelines.silver.store`'s, the
DataFrames they run :mod:`pipelines.silver.transforms`'.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.errors import ConfigError
from dcp_cdc.logs import log_context
from pipelines import schemas, tables
from pipelines.errors import CommitConflictError
from pipelines.lake import delta_rs
from pipelines.lake.delta_io import vanished_table
from pipelines.lake.spark_session import session_for
from pipelines.observe.batch_metrics import RunMetrics, pushed
from pipelines.observe.freshness import ChangeTimes
from pipelines.silver import arrow_rows, live, state, store, transforms, walk_staged
from pipelines.silver.batch import Batch, Found
from pipelines.silver.memory import ApplyMemory, Recall
from pipelines.silver.registry import (
    Registry,
    ensure_projections,
    ensure_support_tables,
    history_properties,
    read_registry,
    retire_dropped,
)
from pipelines.silver.walk import VERSION_KINDS, RowKind
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.silver")


@dataclass
class ApplySummary:
    bucket: str
    frames: int = 0
    changes: int = 0
    rollbacks: list[tuple[int, int]] = field(default_factory=list)
    rebuilt_keys: int = 0
    dropped_rows: int = 0
    ignored: int = 0
    tables: dict[str, int] = field(default_factory=dict)  # table -> rows merged
    history: dict[str, int] = field(default_factory=dict)  # history table -> versions added
    open_snapshots: int = 0
    positions: dict[int, int] = field(default_factory=dict)
    """vbucket -> the consistent seqno silver reached in it, for the vbuckets this run walked."""
    seconds: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds of each step (:data:`pipelines.silver.steps.STEPS`), in the order they ran (where a run's time goes)."""
    change_times: ChangeTimes | None = None
    """The CAS times of the changes this run committed and when its MERGEs had committed them
    (freshness); None when it committed none."""

    def step(self, name: str, since: float) -> float:
        """Record the step that ran from ``since`` until now; returns now."""
        now = time.perf_counter()
        self.steps[name] = round(now - since, 3)
        return now

    def walked(self, found: Found) -> None:
        """Record what the walk's collected rows say of the run."""
        self.frames = found.frames
        self.ignored = found.ignored
        self.open_snapshots = sum(1 for s in found.states.values() if s["open_snapshot"])
        self.positions = {vb: s["consistent_seqno"] for vb, s in found.states.items()}
        self.rollbacks = found.rollbacks

    def render(self) -> str:
        lines = [
            f"silver apply of bucket {self.bucket!r}: {self.frames} frames read, {self.changes} "
            f"committed changes into {len(self.tables)} tables, {len(self.rollbacks)} rollbacks "
            f"({self.rebuilt_keys} keys rebuilt), {self.dropped_rows} rows removed by drops and "
            f"flushes, {self.ignored} changes to dropped collections ignored, "
            f"{self.open_snapshots} vbuckets with an open snapshot, {self.seconds:.1f} s"
        ]
        if self.steps:
            lines.append("  steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.steps.items()))
        lines += [f"  {t}: {n} changes" for t, n in sorted(self.tables.items())]
        lines += [f"  {t}: {n} versions added" for t, n in sorted(self.history.items())]
        return "\n".join(lines)


@dataclass(frozen=True)
class Compaction:
    """How an apply compacts the live layer (:mod:`pipelines.silver.live`): ``in_run``, when
    due, after its append (follow mode compacts in a thread of its own instead); ``lock`` is
    held by every compaction and by an apply's steps that need the tables complete."""

    in_run: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)


# --- the run -----------------------------------------------------------------------------


def apply_bucket(
    spark: SparkSession,
    config: AppConfig,
    bucket: BucketConfig,
    *,
    collection: str | None = None,
    rebuild: bool = False,
    memory: ApplyMemory | None = None,
    compaction: Compaction | None = None,
) -> ApplySummary:
    """One run for one bucket. ``collection`` (``SCOPE.NAME``) alone merges only that
    collection's changes; with ``rebuild`` (a backfill) it names the one table to rebuild.
    ``memory``: what the previous run of this process left (follow mode), used where the
    tables are still at the versions it wrote, and updated; forgotten if the run fails.
    ``compaction``: how the live layer is compacted (default: in the run, when due).
    A run (not a rebuild) that finds nothing new since the last apply saved the stream state,
    under the same settings, returns before any Spark job (:func:`state.nothing_new`)."""
    try:
        return _apply(
            spark, config, bucket, collection, rebuild, memory, compaction or Compaction()
        )
    except BaseException as exc:
        if memory is not None:
            memory.forget()
        gone = vanished_table(exc)
        if gone is not None and BucketTables(bucket.name).holds(gone):
            raise CommitConflictError(
                f"{gone}: gone from the catalog while this apply of bucket {bucket.name!r} "
                "ran (a concurrent run retired or renamed it, or it was dropped by hand); the "
                "steps done are kept, the rest is not: run again"
            ) from exc
        raise


def _apply(
    spark: SparkSession,
    config: AppConfig,
    bucket: BucketConfig,
    collection: str | None,
    rebuild: bool,
    memory: ApplyMemory | None,
    compaction: Compaction,
) -> ApplySummary:
    """The steps of the module's docstring, in order, each timed in the summary."""
    started = time.perf_counter()
    summary = ApplySummary(bucket.name)
    name = bucket.name
    names = BucketTables(name)
    recall = Recall(spark, names, memory)
    if not _support_tables(spark, config, names, recall):
        return summary
    at = summary.step("tables", started)
    mark = state.consumed_mark(spark, names, config, bucket)
    if not rebuild and state.nothing_new(spark, names, mark):
        log.info("nothing new to apply to bucket %s (%s)", name, mark)
        summary.seconds = time.perf_counter() - started
        return summary
    states = recall.read_states()
    at = summary.step("read_states", at)
    if rebuild:
        _empty_for_rebuild(spark, name, collection)
        # Every vbucket is walked from its first frame again; the tables not emptied see
        # only changes they already hold, which the MERGE guard leaves alone.
        states = {}
    log_rows = recall.log_rows()
    unconsumed = state.unconsumed_frames(
        spark, names, states, log_rows=log_rows, run_files=recall.run_files
    )
    at = summary.step("unconsumed", at)
    walked, table, rows, read_through, staged = _walk(
        spark, config, names, states, unconsumed, log_rows
    )
    held: list[threading.Lock] = []
    try:
        at = summary.step("walk", at)
        found = Found.of(rows)
        if not found.states:
            if bucket.projections:  # a projection added since the last run with changes
                ensure_projections(spark, read_registry(spark, name), bucket.projections)
            summary.seconds = time.perf_counter() - started
            return summary
        summary.walked(found)
        registry = recall.update_registry(config, found.controls, found.change_cids)
        at = summary.step("registry", at)

        def source() -> DataFrame:
            if staged is None:
                assert walked is not None
                return walked
            return staged.frame(spark)

        scope = None if rebuild else collection
        batch = Batch.of(found, registry, source, scope, table, staged)
        empty = live.holds_nothing(spark, name, registry)
        retract = bool(found.rollbacks) and not empty
        if _through_live_layer(config, bucket, collection, rebuild, batch, retract=retract):
            at = _append_to_live_layer(spark, config, batch, compaction, summary, at)
        else:
            # The steps below need the tables complete, and no compaction beside them: one
            # that MERGEd pending rows after a rollback's rebuild would bring them back.
            compaction.lock.acquire()
            held.append(compaction.lock)
            at = _write_tables(
                spark, config, bucket, batch, summary, at, retract=retract, empty=empty
            )
        if retire_dropped(spark, name, registry, found.states, config):
            recall.tables_moved()
        ensure_projections(spark, registry, bucket.projections)
        idle = state.idle_positions(states, found.states, read_through)
        recall.save_states(states, found.states | idle, mark)
        at = summary.step("save_states", at)
    finally:
        if walked is not None:
            walked.unpersist()
        if staged is not None:
            staged.discard()
        for lock in held:
            lock.release()
    summary.seconds = time.perf_counter() - started
    log.info(summary.render())
    return summary


def _support_tables(
    spark: SparkSession, config: AppConfig, names: BucketTables, recall: Recall
) -> bool:
    """The bucket's support tables made (unless ``recall`` says they are); False while bronze
    has no events table (nothing to apply yet)."""
    if not recall.support_ready:
        name = names.bucket
        ensure_support_tables(spark, name, config.tables.properties, live=config.silver.live_layer)
        if not spark.catalog.tableExists(names.events):
            log.info("no bronze table for bucket %s yet", name)
            return False
        recall.mark_support_ready()
    return True


def _empty_for_rebuild(spark: SparkSession, bucket: str, collection: str | None) -> None:
    """A rebuild's first step: the live layer compacted (none left to overlay the rebuild),
    then the tables it rebuilds emptied (:func:`empty_tables`)."""
    live.compact(spark, bucket, read_registry(spark, bucket))
    emptied = empty_tables(spark, bucket, collection)
    log.info("rebuilding %s of bucket %s from all of bronze", ", ".join(emptied), bucket)


def _through_live_layer(
    config: AppConfig,
    bucket: BucketConfig,
    collection: str | None,
    rebuild: bool,
    batch: Batch,
    *,
    retract: bool,
) -> bool:
    """Whether this apply's changes go to the live layer (:mod:`pipelines.silver.live`):
    it is on, and nothing of the apply needs the collection tables complete (a rollback that
    has rows to ``retract``, a drop or flush, a collection being retired, history tables, one
    collection's run, a rebuild)."""
    cuts = ("drop_collection", "flush_collection")
    controls = batch.found.controls
    return (
        config.silver.live_layer
        and collection is None
        and not rebuild
        and not bucket.history
        and not retract
        and not any(r["kind"] == RowKind.SYSTEM_EVENT and r["event"] in cuts for r in controls)
        and not any(r["status"] in ("dropped", "retiring") for r in batch.registry)
    )


def _append_to_live_layer(
    spark: SparkSession,
    config: AppConfig,
    batch: Batch,
    compaction: Compaction,
    summary: ApplySummary,
    at: float,
) -> float:
    """Step 5 through the live layer: the batch's changes appended to the pending table, then
    a compaction when one is due and the run compacts (``compaction.in_run``); returns the
    time the last step ended."""
    name, registry = summary.bucket, batch.registry
    summary.tables = _append_pending(spark, name, registry, batch)
    summary.changes = sum(summary.tables.values())
    at = summary.step("append", at)
    summary.change_times = ChangeTimes.from_row(batch.found.times, committed_at=time.time())
    if compaction.in_run and live.compaction_due(spark, name, config.silver):
        with compaction.lock:
            live.compact(spark, name, registry, overlap=batch.overlap)
        return summary.step("compact", at)
    return at


def _write_tables(
    spark: SparkSession,
    config: AppConfig,
    bucket: BucketConfig,
    batch: Batch,
    summary: ApplySummary,
    at: float,
    *,
    retract: bool,
    empty: bool,
) -> float:
    """Steps 3 to 5 on the complete collection tables (any pending rows compacted first):
    rollbacks retracted (when silver held rows before this apply: ``retract``; else there is
    nothing above their points to take back, and the walk already left out what they
    abandoned), drops and flushes applied, the changes MERGEd, then the history tables'
    versions; returns the time the last step ended. When silver held nothing (``empty``),
    drops and flushes have no row to cut (the walk left out the changes they end), and a walk
    in chunks commits its rows straight into the tables, as the MERGE into empty tables would
    write them (:meth:`~pipelines.silver.walk_staged.StagedWalk.commit_to_tables`)."""
    name, registry, found = bucket.name, batch.registry, batch.found
    if live.has_pending(spark, name):
        live.compact(spark, name, registry, overlap=batch.overlap)
        at = summary.step("compact", at)
    if found.rollbacks and retract:
        events = BucketTables(name).events
        summary.rebuilt_keys = store.rebuild_rolled_back(
            spark, name, events, registry, found.rollbacks, found.states, batch.changes
        )
    if not empty:
        summary.dropped_rows = store.apply_drops(spark, name, registry, found.controls)
    at = summary.step("rollbacks_drops", at)
    straight = _commit_straight(spark, batch) if empty else None
    summary.tables = (
        straight
        if straight is not None
        else store.merge_changes(
            spark, name, registry, batch.changes, batch.change_cids, overlap=batch.overlap
        )
    )
    summary.changes = sum(summary.tables.values())
    at = summary.step("merge" if straight is None else "append", at)
    summary.change_times = ChangeTimes.from_row(found.times, committed_at=time.time())
    if bucket.history:
        summary.history = store.apply_history(
            spark,
            registry,
            batch.versions,
            batch.version_cids,
            found.controls,
            bucket.keeps_history,
            history_properties(config),
        )
        at = summary.step("history", at)
    return at


def _commit_straight(spark: SparkSession, batch: Batch) -> dict[str, int] | None:
    """A walk in chunks' rows committed straight into the collection tables of a silver that
    holds nothing yet; the rows per view, or None when the walk was not in chunks or its rows
    are not for this way (:func:`_append_staged`)."""
    keys, staged = batch.found.keys, batch.staged
    views = {
        r["collection_id"]: r["table_name"]
        for r in batch.registry
        if r["status"] in tables.WITH_TABLES and keys.get(r["collection_id"])
    }
    if staged is None or not views or staged.collections != set(views):
        return None
    if not staged.commit_to_tables(spark, {cid: tables.all_rows(v) for cid, v in views.items()}):
        return None
    return {views[cid]: keys[cid] for cid in sorted(views)}


def _append_pending(
    spark: SparkSession, bucket: str, registry: Registry, batch: Batch
) -> dict[str, int]:
    """The newest change per key of the batch's changes (walked rows) of each collection with
    a table, appended to the live layer in one commit: written from the driver's walk in
    chunks (:func:`_append_staged`, straight into the collection tables when silver holds
    nothing yet) or from its walk in one table (:func:`live.append_from_driver`), in both
    cases no Spark job; else by Spark. Returns rows appended per view (the collection's
    changed keys, which the walk counted)."""
    keys = batch.found.keys
    views = {
        r["collection_id"]: r["table_name"]
        for r in registry
        if r["status"] in tables.WITH_TABLES and keys.get(r["collection_id"])
    }
    if not views:
        return {}
    staged = batch.staged
    if staged is not None and _append_staged(spark, bucket, staged, views, registry):
        return {views[cid]: keys[cid] for cid in sorted(views)}
    local = None
    if batch.table is not None:
        local = arrow_rows.silver_rows(batch.table, views, dt.datetime.now(dt.UTC))
    if local is None or not live.append_from_driver(spark, bucket, local):
        rows = transforms.silver_rows(batch.changes)
        wanted = rows.where(F.col("_collection_id").isin(sorted(views)))
        live.append_pending(spark, bucket, wanted, sum(keys[cid] for cid in views))
    return {views[cid]: keys[cid] for cid in sorted(views)}


def _append_staged(
    spark: SparkSession,
    bucket: str,
    staged: walk_staged.StagedWalk,
    views: Mapping[int, str],
    registry: Registry,
) -> bool:
    """The silver rows of a walk in chunks (:mod:`pipelines.silver.walk_staged`) committed by
    the driver: when silver holds nothing yet (an initial load), into the collection tables,
    a MERGE into empty tables being an append; else into the pending table. False when they
    are not for this way (other collections than ``views``, rows not UTF-8, a table not of
    silver's plain columns): Spark appends them then."""
    if staged.collections != set(views):
        return False
    all_rows = {cid: tables.all_rows(view) for cid, view in views.items()}
    if live.holds_nothing(spark, bucket, registry) and staged.commit_to_tables(spark, all_rows):
        return True
    pending = staged.write_pending(spark, bucket)
    return pending is not None and staged.commit_pending(spark, bucket, pending)


def _walk(
    spark: SparkSession,
    config: AppConfig,
    names: BucketTables,
    states: dict[int, dict[str, Any]],
    unconsumed: state.Unconsumed,
    log_rows: list[dict[str, Any]] | None = None,
) -> tuple[
    DataFrame | None,
    pa.Table | None,
    list[dict[str, Any]],
    int | None,
    walk_staged.StagedWalk | None,
]:
    """The vbuckets walked (cached, or in Arrow too when the driver walked them) and, in one
    job (none when the driver walked), the rows :class:`Found` reads: the control rows, the
    ``state`` rows with their vbucket's versions summed up; the newest run read
    (:attr:`state.Unconsumed.read_through`); and the staged walk when the driver walked them
    in chunks (its files are the caller's to discard). A vbucket whose walk met
    frames of an older session that arrived late (:func:`state.late_vbuckets`) is walked again
    from its start, with the others, until none is late (once, unless a run finishes in
    between)."""
    again: set[int] = set()
    while True:
        walked, table, found, staged = _walked(
            spark, config, names.bucket, states, again, unconsumed
        )
        try:
            if found is None:
                assert walked is not None
                controls = walked.where(~F.col("kind").isin(*VERSION_KINDS))
                found = [r.asDict(recursive=True) for r in controls.collect()]
        except BaseException:
            if walked is not None:
                walked.unpersist()
            if staged is not None:
                staged.discard()
            raise
        late = state.late_vbuckets(found)
        if not late:
            return walked, table, found, unconsumed.read_through, staged
        if walked is not None:
            walked.unpersist()
        if staged is not None:
            staged.discard()
        again |= late
        log.info("vbuckets %s got frames of an older session late: walked again", sorted(again))
        unconsumed = state.unconsumed_frames(spark, names, states, again, log_rows=log_rows)


def _walked(
    spark: SparkSession,
    config: AppConfig,
    bucket: str,
    states: dict[int, dict[str, Any]],
    again: set[int],
    unconsumed: state.Unconsumed,
) -> tuple[
    DataFrame | None, pa.Table | None, list[dict[str, Any]] | None, walk_staged.StagedWalk | None
]:
    """The vbuckets walked (:func:`state.walk_vbuckets`), and, when the driver walked them
    from the runs' files, the same rows in Arrow and their control rows (read from that
    table: no Spark job; None: collect them). From the runs' files, a walk of
    ``walk_on_driver_below`` frames or more is the driver's too, in chunks
    (:func:`state.walked_in_chunks`), unless ``[silver] walk_in_chunks`` is off; when the
    driver does not walk them (or their rows are not for its way), Spark walks them without
    counting them again."""
    late_after, read_through = unconsumed.late_after, unconsumed.read_through
    eager, below = config.silver.eager_apply, config.silver.walk_on_driver_below
    if unconsumed.files is not None and not again:
        table = state.walked_from_files(
            spark,
            unconsumed.files,
            states,
            eager=eager,
            late_after=late_after,
            read_through=read_through,
            on_driver_below=below,
        )
        if table is not None:
            controls = table.filter(pc.invert(pc.is_in(table["kind"], pa.array(VERSION_KINDS))))
            walked = spark.createDataFrame(table, schema=schemas.WALKED)
            return walked, table, delta_rs.spark_rows(controls), None
        if config.silver.walk_in_chunks and below > 0:
            staged = state.walked_in_chunks(
                spark,
                config,
                bucket,
                unconsumed.files,
                states,
                late_after=late_after,
                read_through=read_through,
            )
            if staged is not None:
                return None, None, staged.controls, staged
        below = 0
    walked = state.walk_vbuckets(
        spark,
        unconsumed.frames,
        states,
        again,
        eager=eager,
        late_after=late_after,
        read_through=read_through,
        on_driver_below=below,
    )
    return walked.cache(), None, None, None


def applied_positions(spark: SparkSession, bucket: str) -> dict[int, int]:
    """vbucket -> the consistent seqno silver reached in it (what a run's
    :attr:`ApplySummary.positions` adds to); ``{}`` before the first apply."""
    table = BucketTables(bucket).stream_state
    if not spark.catalog.tableExists(table):
        return {}
    return {vb: s["state"]["consistent_seqno"] for vb, s in state.read_states(spark, table).items()}


def empty_tables(spark: SparkSession, bucket: str, collection: str | None) -> list[str]:
    """Delete every row of the bucket's collection tables (or of ``SCOPE.NAME``'s alone) and
    their tombstone-purge marks, the first step of a rebuild; returns the tables emptied."""
    live = [r for r in read_registry(spark, bucket) if r["status"] in tables.WITH_TABLES]
    if collection is not None:
        chosen = [r for r in live if f"{r['scope']}.{r['name']}" == collection]
        if not chosen:
            known = ", ".join(sorted(f"{r['scope']}.{r['name']}" for r in live)) or "none"
            raise ConfigError(
                f"collection {collection!r} is not a live collection of bucket {bucket!r} "
                f"(known: {known})"
            )
        live = chosen
    emptied = [tables.all_rows(r["table_name"]) for r in live]
    store.delete_rows(spark, bucket, emptied)
    return emptied


def purge_tombstones(
    spark: SparkSession, config: AppConfig, bucket: BucketConfig
) -> dict[str, int]:
    """Maintenance: tombstones older than ``silver.tombstone_retention_hours`` leave every
    collection table of ``bucket``; returns rows removed per table (the user-facing name)."""
    if not spark.catalog.tableExists(BucketTables(bucket.name).registry):
        return {}
    ensure_support_tables(spark, bucket.name, config.tables.properties)
    registry = read_registry(spark, bucket.name)
    live.compact(spark, bucket.name, registry)  # a pending change below a purged tombstone
    purged = store.purge_tombstones(
        spark, bucket.name, registry, config.silver.tombstone_retention_hours
    )
    log.info("tombstone purge of bucket %s: %s", bucket.name, purged or "nothing to purge")
    return purged


def run(
    config: AppConfig,
    bucket: str | None = None,
    *,
    collection: str | None = None,
    rebuild: bool = False,
    spark: SparkSession | None = None,
    memories: Mapping[str, ApplyMemory] | None = None,
) -> list[ApplySummary]:
    """Apply every configured bucket (or one); builds the Spark session if none is given.
    ``memories``: bucket -> what this process's ingest of it left (:class:`ApplyMemory`),
    so that the apply reads the run it wrote from its files. Each bucket's run pushes its
    metrics when ``[pushgateway] url`` is set."""
    buckets = config.bucket(bucket)
    session = spark or session_for(config, "dcp-cdc-silver")
    summaries = []
    for b in buckets:
        with log_context(bucket=b.name), pushed(config.pushgateway, "apply", b.name) as report:
            summary = apply_bucket(
                session,
                config,
                b,
                collection=collection,
                rebuild=rebuild,
                memory=(memories or {}).get(b.name),
            )
            report(
                RunMetrics(
                    steps={f"apply_{step}": s for step, s in summary.steps.items()},
                    merged=summary.tables,
                    change_times=summary.change_times,
                )
            )
            summaries.append(summary)
    return summaries


# ``python -m pipelines.silver.job`` and ``spark-submit pipelines/silver/job.py``: the ``apply`` verb of the command line
# (imported here only, so that the job module does not import the command line).
if __name__ == "__main__":
    from pipelines.app.cli import job_main

    raise SystemExit(job_main("apply"))
