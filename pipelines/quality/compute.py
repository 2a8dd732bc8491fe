"""The metric frames of a check: over all of bronze, or over what arrived since the last
check and what that check carried (:mod:`pipelines.quality.carry`), the same rows either way.

A check that starts from the last one's state reads the bronze frames of the ingest runs
committed since (by the events table's ``txnVersion``, filtered by run id so that Delta skips
the other runs' files), and, for each (session, vbucket) those frames continue, the frames
from its *cut*: the first snapshot of its last stream that can still change (the last
snapshot, or one found incomplete while a later marker might still cover it). Everything
before a cut is settled, and is carried as per-stream partial aggregates
(:func:`pipelines.quality.streams.stream_partials`), the windows' values at the cut
(:func:`pipelines.quality.frames.seeds_after`), and per-vbucket or per-file rows.

The bronze side of ``silver_reconciliation`` follows the keys the new frames change: the
live documents bronze implies are the last check's silver view rows (which then equalled
bronze's, per collection, by count and checksum) minus those keys, plus those keys' newest
committed change. Silver's side is read whole, as in a full check.

The carried state cannot answer everything. A check runs full, and says why, when:
there is no state (or it is of another format); the last check found bronze and silver
apart; the new frames hold a rollback, a new failover log, a change on a dead branch, a
collection dropped or created again, or a frame placed before one already checked (a file
ingested out of order); or bronze was written by anything but ingest since the last check;
or silver as the last check read it is gone (vacuumed).
A stream that resends changes (it resumed below what it had sent) has the (session,
vbucket) pairs whose checked seqnos reach that far read again whole, not all of bronze.
``dcp-cdc check --full`` asks for a full check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dcp_cdc.events import DATA_OPS
from pipelines.bronze import store
from pipelines.errors import FullCheckNeeded
from pipelines.lake import delta_io, table_entries
from pipelines.quality import tails
from pipelines.quality.branches import (
    branch_logs,
    cluster_branches,
    cluster_parts,
    collection_cuts,
    committed_items,
    cut_parts,
    dead_changes,
    history_items,
    latest_branches,
    live_of,
    newest_changes,
    rollbacks,
    split_history,
)
from pipelines.quality.carry import Carried
from pipelines.quality.frames import (
    STREAM_OPS,
    base_frames,
    stream_frames,
)
from pipelines.quality.measures import (
    combine_files,
    coverage_metrics,
    file_metrics,
    file_parts,
    reconciliation_metrics,
)
from pipelines.quality.silver_side import read_at, silver_frames, view_rows
from pipelines.quality.streams import (
    combine,
    duplicate_seqnos,
    snapshots,
    stream_metrics,
    stream_partials,
)
from pipelines.silver.state import of_runs
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.quality")

PAIR, SEEDS = tails.PAIR, tails.SEEDS
_GONE = (
    "FILE_NOT_EXIST",
    "FileNotFoundException",
    "DELTA_FILE_NOT_FOUND",
    "VERSION_NOT_FOUND",
    "DELTA_VERSIONS_NOT_CONTIGUOUS",
    "Cannot time travel",
)
"""What Spark says when the last check's versions of silver can no longer be read."""
DATA_KEY = ["vbucket", "in_vb_uuid", "seqno"]
TABLES = ("events", "quarantine")
"""The bronze tables whose runs a check follows, by their ``txnVersion``."""


@dataclass(frozen=True)
class Metrics:
    """A metric frame: its rows (for the report and, as a pandas frame, for GE), its
    ``columns`` in order, and, when Spark computed it, a local Spark DataFrame of them (for
    the frames computed from it)."""

    rows: list[dict[str, Any]]
    columns: tuple[str, ...]
    df: DataFrame | None = None

    def pandas(self) -> pd.DataFrame:
        """The rows as pandas holds them for GE: every column of Python objects as collected
        (ints stay ints, nulls stay None), so GE's pandas engine reads the values Spark's
        would. Validating a frame of a few hundred rows so takes milliseconds; GE's Spark
        engine ran several Spark jobs per expectation."""
        return pd.DataFrame(
            {n: pd.Series([r[n] for r in self.rows], dtype=object) for n in self.columns},
            columns=list(self.columns),
        )

    @property
    def frame(self) -> DataFrame:
        """The Spark DataFrame of the rows (computed by Spark)."""
        assert self.df is not None, "a metric frame computed in the driver has no DataFrame"
        return self.df


def _collect(spark: SparkSession, df: DataFrame) -> Metrics:
    rows = df.collect()
    return Metrics(
        [r.asDict() for r in rows],
        tuple(df.columns),
        spark.createDataFrame(rows, schema=df.schema),
    )


@dataclass
class Computed:
    """A check's metric frames (all but ``landing_continuity``), the state to carry to the
    next check (its frames are lazy: computed when saved, while the run's are at hand), and
    why it ran full (None: it started from the last check's state)."""

    metrics: dict[str, Metrics]
    carried: Carried
    full_because: str | None


def compute(
    spark: SparkSession,
    bucket: str,
    at: Mapping[str, int],
    previous: Carried | None,
    *,
    full: bool = False,
    save: Callable[[Carried], None] | None = None,
) -> Computed:
    """The metric frames of ``bucket`` with its tables read at ``at``
    (:func:`pipelines.quality.job.pinned_versions`), from ``previous`` when it can answer;
    ``save`` is given the state to carry to the next check (while its frames are at hand)."""
    names = BucketTables(bucket)
    txns = {
        t: delta_io.committed_version_at(
            spark, getattr(names, t), store.TXN_APP_ID, at.get(getattr(names, t))
        )
        if table_entries.exists(spark, getattr(names, t))
        else None
        for t in TABLES
    }
    reason = "asked for" if full else _cannot_start(previous)
    if reason is not None and previous is not None:
        previous.release()
    if reason is None:
        assert previous is not None
        try:
            return _Run(spark, bucket, at, txns, previous).compute(save)
        except FullCheckNeeded as exc:
            reason = str(exc)
    log.info("the quality check of %s reads all of bronze: %s", bucket, reason)
    computed = _Run(spark, bucket, at, txns, None).compute(save)
    computed.full_because = reason
    return computed


def _cannot_start(previous: Carried | None) -> str | None:
    if previous is None:
        return "no state of an earlier check"
    if previous.apart is not None:
        return f"the last check found bronze and silver apart ({previous.apart})"
    return None


class _Run:
    """One computation; ``previous`` None: over all of bronze."""

    def __init__(
        self,
        spark: SparkSession,
        bucket: str,
        at: Mapping[str, int],
        txns: dict[str, int | None],
        previous: Carried | None,
    ) -> None:
        self.spark, self.bucket, self.at, self.txns = spark, bucket, dict(at), txns
        self.previous = previous
        self.names = BucketTables(bucket)
        self.kept: list[DataFrame] = []
        self.reread: DataFrame | None = None
        self.saving = False
        """Whether the state is saved: its records are computed only then (lazily)."""
        """The pairs read again from their first frame (:meth:`_resent_pairs`)."""

    def keep(self, df: DataFrame) -> DataFrame:
        """Materialized once and cut from its lineage, so later plans stay small to analyse
        (planning, not data, dominates small buckets)."""
        self.kept.append(df.localCheckpoint(eager=True))
        return self.kept[-1]

    def carried(self, kind: str) -> DataFrame | None:
        return None if self.previous is None else self.previous[kind]

    def compute(self, save: Callable[[Carried], None] | None) -> Computed:
        self.saving = save is not None
        try:
            computed = self._compute()
            if save is not None:
                save(computed.carried)
            return computed
        finally:
            for df in self.kept:
                df.unpersist()
            if self.previous is not None:
                self.previous.release()

    # --- what this check reads of bronze ---------------------------------------------------

    def _runs(self) -> dict[str, int]:
        """``ingest_run_id → run_version`` of every run the ingest log names at ``at``."""
        table = self.names.ingest_log
        rows = store.read_log_rows(self.spark, table, self.at.get(table))
        return {
            r["ingest_run_id"]: r["run_version"]
            for r in rows
            if r["ingest_run_id"] is not None and r["run_version"] is not None
        }

    def _new_runs(self, runs: dict[str, int], table: str) -> list[str]:
        """The runs of ``table`` ("events" or "quarantine") the last check did not read."""
        assert self.previous is not None
        old = self.previous.txns.get(table) or 0
        now = self.txns.get(table)
        return sorted(r for r, v in runs.items() if v > old and (now is None or v <= now))

    def _read(self, runs: dict[str, int]) -> tuple[DataFrame, DataFrame, DataFrame | None]:
        """(the new frames, the frames the stream windows place, their seeds): all of bronze
        without a previous state; else the runs after it, and the tails they continue."""
        events = read_at(self.spark, self.names.events, self.at)
        if self.previous is None:
            base = self.keep(base_frames(events))
            return base, base, None
        self._only_ingest_wrote()
        new = self.keep(base_frames(events.where(of_runs(self._new_runs(runs, "events")))))
        pairs = new.where(F.col("op").isin(*STREAM_OPS) & F.col("vbucket").isNotNull())
        seeds = self.keep(
            self.previous["seeds"].join(pairs.select(*PAIR).distinct(), on=PAIR, how="left_semi")
        )
        late = (
            new.join(F.broadcast(seeds), on=PAIR)
            .where(tails.position() <= F.struct(F.col("last_file_sequence"), F.col("last_offset")))
            .select(F.lit(True).alias("late"), F.lit(None).cast("long").alias("cut_run_version"))
            .limit(1)
        )
        found = (
            seeds.select(F.lit(False).alias("late"), "cut_run_version")
            .unionByName(late)
            .agg(F.max("late").alias("late"), F.min("cut_run_version").alias("floor"))
            .first()
        )
        if found is not None and found["late"]:
            raise FullCheckNeeded("a file ingested after later ones of its session were checked")
        floor = None if found is None else (found["floor"],)
        old = self.previous.txns.get("events") or 0
        tail_runs = (
            []
            if floor is None or floor[0] is None
            else sorted(r for r, v in runs.items() if floor[0] <= v <= old)
        )
        cut = seeds.select(*PAIR, "cut_file_sequence", "cut_offset")
        tail_frames = (
            base_frames(events.where(of_runs(tail_runs)))
            .join(F.broadcast(cut), on=PAIR)
            .where(tails.position() >= F.struct(F.col("cut_file_sequence"), F.col("cut_offset")))
            .drop("cut_file_sequence", "cut_offset")
        )
        region = self.keep(new.unionByName(tail_frames))
        reread = self._resent_pairs(region)
        if not reread:
            return new, region, seeds.select(*PAIR, *SEEDS)
        whole = self.spark.createDataFrame(reread, "session_id STRING, vbucket INT")
        self.reread = whole
        sessions = sorted({p[0] for p in reread})
        again = base_frames(events.where(F.col("session_id").isin(sessions))).join(
            F.broadcast(whole), on=PAIR, how="left_semi"
        )
        region = self.keep(
            region.join(F.broadcast(whole), on=PAIR, how="left_anti").unionByName(again)
        )
        seeds = seeds.join(F.broadcast(whole), on=PAIR, how="left_anti")
        return new, region, seeds.select(*PAIR, *SEEDS)

    def _resent_pairs(self, region: DataFrame) -> list[tuple[str, int]]:
        """The (session, vbucket) pairs to read again from their first frame: those with a
        checked data seqno at or above one the frames read here send on the same branch (a
        stream that resumed below what it had sent), and those whose seqnos overlap these.
        Their duplicates, snapshots and newest changes are then computed from all their
        frames, and every change they share a key or a seqno with is read here."""
        assert self.previous is not None
        ranges = self.previous["data_max"]
        touched = region.select(*PAIR).distinct().withColumn("_touched", F.lit(True))
        own = ranges.join(touched, on=PAIR, how="left")
        checked = own.select(
            F.col("session_id").alias("_session"),
            F.col("vbucket").alias("_vb"),
            F.col("in_vb_uuid").alias("_uuid"),
            F.when(F.col("_touched"), F.col("settled_min"))
            .otherwise(F.least("settled_min", "tail_min"))
            .alias("lo"),
            F.when(F.col("_touched"), F.col("settled_max"))
            .otherwise(F.greatest("settled_max", "tail_max"))
            .alias("hi"),
        ).where(F.col("lo").isNotNull())
        hits = (
            region.where(F.col("op").isin(*DATA_OPS))
            .join(
                F.broadcast(checked),
                (F.col("vbucket") == F.col("_vb"))
                & F.col("in_vb_uuid").eqNullSafe(F.col("_uuid"))
                & (F.col("seqno") <= F.col("hi")),
            )
            .select(F.col("_session").alias("session_id"), F.col("_vb").alias("vbucket"))
            .distinct()
            .collect()
        )
        if not hits:
            return []
        vbuckets = sorted({r["vbucket"] for r in hits})
        spans = [
            (r["session_id"], r["vbucket"], r["in_vb_uuid"], r["lo"], r["hi"])
            for r in ranges.where(F.col("vbucket").isin(vbuckets))
            .select(
                *PAIR,
                "in_vb_uuid",
                F.least("settled_min", "tail_min").alias("lo"),
                F.greatest("settled_max", "tail_max").alias("hi"),
            )
            .collect()
        ]
        return tails.overlapping({(r["session_id"], r["vbucket"]) for r in hits}, spans)

    def _only_ingest_wrote(self) -> None:
        """Bronze changed since the last check by ingest runs only (their frames are what
        this check reads), or :class:`FullCheckNeeded`."""
        assert self.previous is not None
        for kind in TABLES:
            table = getattr(self.names, kind)
            before, now = self.previous.at.get(table), self.at.get(table)
            if before is None or now is None:
                continue
            if now < before:
                raise FullCheckNeeded(f"{table} is older than the last check read it")
            foreign = delta_io.foreign_commits(self.spark, table, store.TXN_APP_ID, before, now)
            if foreign:
                raise FullCheckNeeded(
                    f"{table} was written outside ingest since the last check (version "
                    f"{foreign[0]})"
                )

    # --- the metric frames -----------------------------------------------------------------

    def _compute(self) -> Computed:
        spark, names = self.spark, self.names
        runs = self._runs() if self.previous is not None or self.saving else {}
        new, region, seeds = self._read(runs)
        frames = self.keep(stream_frames(region, seeds))
        snaps = self.keep(snapshots(frames))
        if self.previous is not None:
            self._must_continue(frames)
        duplicates = duplicate_seqnos(frames)
        if self.previous is not None:
            data_keys = frames.select(*DATA_KEY).distinct()
            kept = self.previous["duplicates"].join(data_keys, on=DATA_KEY, how="left_anti")
            duplicates = duplicates.unionByName(kept)
        duplicates = self.keep(duplicates)
        pairs = frames.select(*PAIR).distinct()
        carried_parts = None
        if self.previous is not None:
            untouched_tails = self.previous["tails"].join(pairs, on=PAIR, how="left_anti")
            carried_parts = self._settled().unionByName(untouched_tails)
        streams = _collect(spark, stream_metrics(frames, snaps, duplicates, carried_parts))
        branches = latest_branches(frames, self.carried("branches"))
        alive, dead = split_history(history_items(frames), branches, rollbacks(frames))
        alive = self.keep(alive)
        committed = self.keep(committed_items(alive, snaps))
        cuts = self.keep(collection_cuts(committed, self.carried("cuts")))
        dead_rows = self.carried("dead")
        if dead_rows is None:
            dead_rows = self.keep(dead_changes(alive, dead))
        silver = silver_frames(spark, self.bucket, self.at)
        silver_rows = self.keep(silver.rows)
        coverage = _collect(
            spark,
            coverage_metrics(
                streams.frame,
                silver.states,
                silver_rows,
                branches,
                dead_rows,
                cluster_branches(new, self.carried("cluster")),
            ),
        )
        newest = self.keep(newest_changes(committed, cuts))
        try:
            reconciliation = _collect(
                spark,
                reconciliation_metrics(
                    self._bronze_live(newest),
                    view_rows(silver_rows),
                    silver_rows,
                    cuts,
                    silver.names,
                ),
            )
        except Exception as exc:
            if self.previous is None or not any(m in str(exc) for m in _GONE):
                raise
            raise FullCheckNeeded(
                "silver as the last check read it is gone (vacuumed, or its log cleaned up)"
            ) from exc
        quarantine = read_at(spark, names.quarantine, self.at)
        if self.previous is not None:
            quarantine = quarantine.where(of_runs(self._new_runs(runs, "quarantine")))
        files = file_parts(new, quarantine)
        if self.previous is not None:
            files = combine_files(files.unionByName(self.previous["files"]))
        files = self.keep(files)
        checked_files = _collect(
            spark, file_metrics(files, read_at(spark, names.ingest_log, self.at))
        )
        metrics = {
            "snapshot_completeness": streams,
            "stream_coverage": coverage,
            "silver_reconciliation": reconciliation,
            "bronze_integrity": checked_files,
        }
        records = self._streams_state(runs, frames, snaps)
        records.update(
            duplicates=duplicates,
            branches=tails.newest_logs(branch_logs(frames), self.carried("branches")),
            cluster=tails.union_combined(
                cluster_parts(new), self.carried("cluster"), tails.cluster
            ),
            cuts=tails.union_combined(cut_parts(committed), self.carried("cuts"), tails.cuts_of),
            dead=dead_rows,
            files=files,
            reconciliation=reconciliation.frame,
        )
        apart = next(
            (
                r["where"]
                for r in reconciliation.rows
                if (r["bronze_live"], r["bronze_checksum"])
                != (r["silver_live"], r["silver_checksum"])
            ),
            None,
        )
        state = Carried(at=self.at, txns=self.txns, apart=apart, frames=records)
        return Computed(metrics, state, None)

    def _settled(self) -> DataFrame:
        """The carried per-stream aggregates before each cut, but for the pairs read again
        whole."""
        assert self.previous is not None
        settled = self.previous["settled"]
        if self.reread is None:
            return settled
        return settled.join(F.broadcast(self.reread), on=PAIR, how="left_anti")

    def _must_continue(self, frames: DataFrame) -> None:
        """Raise :class:`FullCheckNeeded` when the frames read here change what the last
        check settled (the module's docstring lists when)."""
        assert self.previous is not None
        previous = self.previous
        old_logs = previous["branches"].select("vbucket", F.col("log").alias("_old"))
        new_log = (
            branch_logs(frames)
            .join(F.broadcast(old_logs), on="vbucket")
            .where(F.col("log") != F.col("_old"))
        )
        # a drop, or a create at a new seqno, changes what the carried changes left alive
        keys = ["cid", "vbucket"]
        before = previous["cuts"]
        after = tails.cuts_of(cut_parts(frames).unionByName(before))
        flush = F.when(F.col("last_create") > F.col("first_create"), F.col("last_create"))
        cut_changed = (
            after.select(*keys, F.col("dropped"), flush.alias("flush"))
            .join(
                before.select(*keys, F.col("dropped").alias("_dropped"), flush.alias("_flush")),
                on=keys,
                how="left",
            )
            .where(
                (F.col("dropped") & ~F.coalesce(F.col("_dropped"), F.lit(False)))
                | ~F.col("flush").eqNullSafe(F.col("_flush"))
            )
        )
        branches = latest_branches(frames, previous["branches"])
        _, dead = split_history(history_items(frames), branches, rollbacks(frames))
        found = [
            ("a rollback", frames.where(F.col("is_rollback"))),
            ("a new failover log", new_log),
            ("a collection dropped or created again", cut_changed),
            ("a change on a dead branch", dead),
        ]
        reasons = found[0][1].select(F.lit(found[0][0]).alias("why")).limit(1)
        for what, rows in found[1:]:
            reasons = reasons.unionByName(rows.select(F.lit(what).alias("why")).limit(1))
        first = reasons.limit(1).collect()
        if first:
            raise FullCheckNeeded(f"the new frames hold {first[0]['why']}")

    def _bronze_live(self, newest: DataFrame) -> DataFrame:
        """The live documents bronze implies: from its changes over all of bronze; else the
        last check's silver view rows (equal to bronze's then) but for the keys the frames
        read here change, and those keys' newest change."""
        if self.previous is None:
            return live_of(newest)
        then = silver_frames(self.spark, self.bucket, self.previous.at, only_at=True)
        before = then.live.select(
            F.col("_collection_id").alias("collection_id"), "key", F.col("_seqno").alias("seqno")
        )
        changed = newest.select(F.col("cid").alias("collection_id"), "key")
        return before.join(changed, on=["collection_id", "key"], how="left_anti").unionByName(
            live_of(newest)
        )

    # --- what this check carries to the next -----------------------------------------------

    def _streams_state(
        self, runs: dict[str, int], frames: DataFrame, snaps: DataFrame
    ) -> dict[str, DataFrame]:
        """The records of the streams: each (session, vbucket)'s cut and seeds, the per-stream
        partial aggregates before and from its cut, and the data seqnos on each side; the
        pairs the frames read here do not hold keep theirs."""
        cuts = tails.cut_points(frames, snaps)
        placed, grouped = tails.split_at_cuts(frames, snaps, cuts)
        if self.saving:
            placed = self.keep(placed)
        settled_frames = placed.where(~F.col("_tail"))
        settled = stream_partials(settled_frames, grouped.where(~F.col("_tail")))
        tail_parts = stream_partials(placed.where(F.col("_tail")), grouped.where(F.col("_tail")))
        seeds = tails.seeds_at_cuts(self.spark, frames, settled_frames, cuts, runs)
        ranges = tails.data_ranges(placed)
        if self.previous is not None:
            pairs = frames.select(*PAIR).distinct()
            old_seeds = self.previous["seeds"]
            old_ranges = self.previous["data_max"].join(pairs, on=PAIR, how="left_semi")
            if self.reread is not None:
                old_seeds = old_seeds.join(F.broadcast(self.reread), on=PAIR, how="left_anti")
                old_ranges = old_ranges.join(F.broadcast(self.reread), on=PAIR, how="left_anti")
            seeds = tails.keep_seeds(seeds, old_seeds)
            settled = combine(settled.unionByName(self._settled()))
            tail_parts = tail_parts.unionByName(
                self.previous["tails"].join(pairs, on=PAIR, how="left_anti")
            )
            ranges = tails.settled_ranges(ranges, old_ranges)
            untouched = {
                k: self.previous[k].join(pairs, on=PAIR, how="left_anti")
                for k in ("seeds", "data_max")
            }
            seeds = seeds.unionByName(untouched["seeds"])
            ranges = ranges.unionByName(untouched["data_max"])
        return {"seeds": seeds, "settled": settled, "tails": tail_parts, "data_max": ranges}
