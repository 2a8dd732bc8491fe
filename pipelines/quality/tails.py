"""Where each (session, vbucket)'s checked frames stop being final: its *cut*, the first
frame of the first snapshot of its last stream that may still change, and what a check
carries across it (:mod:`pipelines.quality.compute`): the windows' values there, each side's
data seqnos, and the carried per-vbucket records combined with new ones (pure DataFrame →
DataFrame steps, no I/O)."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from dcp_cdc.events import DATA_OPS
from pipelines.quality.frames import SEED_COLUMNS, seeds_after

PAIR = ["session_id", "vbucket"]
"""A (session, vbucket): the frames one window pass places
(:func:`pipelines.quality.frames.stream_frames`)."""
SEEDS = [c for c, _ in SEED_COLUMNS]


def position() -> Column:
    return F.struct("file_sequence", "offset")


def cut_points(frames: DataFrame, snaps: DataFrame) -> DataFrame:
    """Per (session, vbucket): its cut, the first frame of the first snapshot of its last
    stream that may still change: the stream's last snapshot, or a marker's snapshot not
    complete (a later marker may still cover its end). ``cut_*``: the stream and snapshot
    numbers, the position and the run of that frame."""
    stream = Window.partitionBy(*PAIR, "stream_no")
    groups = snaps.select(
        *PAIR,
        "stream_no",
        "snapshot_no",
        (F.col("stream_no") == F.max("stream_no").over(Window.partitionBy(*PAIR))).alias(
            "_last_stream"
        ),
        (F.col("snapshot_no") == F.max("snapshot_no").over(stream)).alias("_last_group"),
        ((F.col("kind") == "marker") & ~F.coalesce(F.col("complete"), F.lit(False))).alias(
            "_open_marker"
        ),
    )
    first_open = (
        groups.where(F.col("_last_stream") & (F.col("_last_group") | F.col("_open_marker")))
        .groupBy(*PAIR, "stream_no")
        .agg(F.min("snapshot_no").alias("snapshot_no"))
    )
    at = frames.join(first_open, on=[*PAIR, "stream_no", "snapshot_no"], how="left_semi")
    first = F.min_by(
        F.struct("stream_no", "snapshot_no", "file_sequence", "offset", "ingest_run_id"),
        position(),
    )
    return (
        at.groupBy(*PAIR)
        .agg(first.alias("c"))
        .select(
            *PAIR,
            F.col("c.stream_no").alias("cut_stream_no"),
            F.col("c.snapshot_no").alias("cut_snapshot_no"),
            F.col("c.file_sequence").alias("cut_file_sequence"),
            F.col("c.offset").alias("cut_offset"),
            F.col("c.ingest_run_id").alias("cut_run"),
        )
    )


def newest_logs(logs: DataFrame, carried: DataFrame | None) -> DataFrame:
    if carried is None:
        return logs
    return (
        logs.unionByName(carried)
        .groupBy("vbucket")
        .agg(F.max_by("log", "p").alias("log"), F.max("p").alias("p"))
    )


def cluster(parts: DataFrame) -> DataFrame:
    return parts.groupBy("vbucket").agg(
        F.max_by("newest", "newest.p").alias("newest"), F.max_by("high", "high.p").alias("high")
    )


def cuts_of(parts: DataFrame) -> DataFrame:
    return parts.groupBy("cid", "vbucket").agg(
        F.max("dropped").alias("dropped"),
        F.min("first_create").alias("first_create"),
        F.max("last_create").alias("last_create"),
    )


def union_combined(
    parts: DataFrame, carried: DataFrame | None, combined: Callable[[DataFrame], DataFrame]
) -> DataFrame:
    return parts if carried is None else combined(parts.unionByName(carried))


def overlapping(
    start: set[tuple[str, int]], spans: list[tuple[str, int, int | None, int, int]]
) -> list[tuple[str, int]]:
    """``start`` and every pair whose data seqnos overlap, on the same vbucket and branch,
    those of a pair already in the set (``spans``: pair, vb uuid, lowest and highest)."""
    chosen = set(start)
    grown = True
    while grown:
        grown = False
        for session, vb, uuid, lo, hi in spans:
            if (session, vb) in chosen:
                continue
            for other, ovb, ouuid, olo, ohi in spans:
                if (
                    (other, ovb) in chosen
                    and (ovb, ouuid) == (vb, uuid)
                    and lo <= ohi
                    and olo <= hi
                ):
                    chosen.add((session, vb))
                    grown = True
                    break
    return sorted(chosen)


def split_at_cuts(
    frames: DataFrame, snaps: DataFrame, cuts: DataFrame
) -> tuple[DataFrame, DataFrame]:
    """``frames`` and their snapshot groups ``snaps``, each with ``_tail``: at or after its
    pair's cut (:func:`cut_points`)."""
    at_cut = F.struct(F.col("cut_file_sequence"), F.col("cut_offset"))
    placed = frames.join(F.broadcast(cuts), on=PAIR, how="left").withColumn(
        "_tail", F.coalesce(position() >= at_cut, F.lit(False))
    )
    grouped = snaps.join(F.broadcast(cuts), on=PAIR, how="left").withColumn(
        "_tail",
        F.coalesce(
            (F.col("stream_no") == F.col("cut_stream_no"))
            & (F.col("snapshot_no") >= F.col("cut_snapshot_no")),
            F.lit(False),
        ),
    )
    return placed, grouped


def seeds_at_cuts(
    spark: SparkSession,
    frames: DataFrame,
    settled: DataFrame,
    cuts: DataFrame,
    runs: dict[str, int],
) -> DataFrame:
    """Per pair: the seeds of its last frame before the cut (null when none of ``settled``
    is), the cut, the run version of the frame there, and the last position checked."""
    newest_first = Window.partitionBy(*PAIR).orderBy(
        F.col("file_sequence").desc(), F.col("offset").desc()
    )
    last_settled = seeds_after(
        settled.withColumn("_n", F.row_number().over(newest_first)).where(F.col("_n") == 1)
    )
    last = frames.groupBy(*PAIR).agg(F.max(position()).alias("_last"))
    versions = spark.createDataFrame(sorted(runs.items()), "cut_run STRING, cut_run_version LONG")
    return (
        cuts.join(versions, on="cut_run", how="left")
        .join(last, on=PAIR)
        .join(last_settled, on=PAIR, how="left")
        .select(
            *PAIR,
            *SEEDS,
            "cut_file_sequence",
            "cut_offset",
            "cut_run_version",
            F.col("_last.file_sequence").alias("last_file_sequence"),
            F.col("_last.offset").alias("last_offset"),
        )
    )


def keep_seeds(seeds: DataFrame, old: DataFrame) -> DataFrame:
    """``seeds`` (:func:`seeds_at_cuts`), a pair with no frame before its cut here keeping
    its ``old`` seeds (its whole read lay from its cut on)."""
    renamed = old.select(*PAIR, *[F.col(c).alias(f"_old_{c}") for c in SEEDS])
    return (
        seeds.join(renamed, on=PAIR, how="left")
        .select(
            *[c for c in seeds.columns if c not in SEEDS],
            *[
                F.when(F.col("s_opened").isNull(), F.col(f"_old_{c}")).otherwise(F.col(c)).alias(c)
                for c in SEEDS
            ],
        )
        .select(*seeds.columns)
    )


def data_ranges(placed: DataFrame) -> DataFrame:
    """Per pair and vb uuid: the lowest and highest data seqno before its cut
    (``settled_*``) and from it (``tail_*``)."""
    data = placed.where(F.col("op").isin(*DATA_OPS) & F.col("seqno").isNotNull())
    settled = F.when(~F.col("_tail"), F.col("seqno"))
    tail = F.when(F.col("_tail"), F.col("seqno"))
    return data.groupBy(*PAIR, "in_vb_uuid").agg(
        F.min(settled).alias("settled_min"),
        F.max(settled).alias("settled_max"),
        F.min(tail).alias("tail_min"),
        F.max(tail).alias("tail_max"),
    )


def settled_ranges(ranges: DataFrame, old: DataFrame) -> DataFrame:
    """``ranges`` (:func:`data_ranges` of frames read here) widened by the ``old`` ranges
    before the cut of the same pairs (their tails were read again)."""
    no_tail = F.lit(None).cast("long")
    return (
        ranges.unionByName(old.withColumn("tail_min", no_tail).withColumn("tail_max", no_tail))
        .groupBy(*PAIR, "in_vb_uuid")
        .agg(
            F.min("settled_min").alias("settled_min"),
            F.max("settled_max").alias("settled_max"),
            F.min("tail_min").alias("tail_min"),
            F.max("tail_max").alias("tail_max"),
        )
    )
