"""Pure DataFrame → DataFrame steps of the bronze ingest (no reads, no writes)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines import schemas

SNAPSHOT_STATE = T.StructType(
    [
        T.StructField("start", T.LongType()),
        T.StructField("end", T.LongType()),
        T.StructField("flags", T.LongType()),
        T.StructField("oso", T.BooleanType()),
    ]
)
CARRY_IN = T.StructType(
    [
        T.StructField("session_id", T.StringType()),
        T.StructField("vb_key", T.IntegerType()),
        T.StructField("carry_snapshot", SNAPSHOT_STATE),
        T.StructField("carry_vb_uuid", T.LongType()),
    ]
)
"""The state a session's earlier files left per vbucket (from the ingest log)."""


def vb_key() -> Column:
    """The stream a frame belongs to: the vbucket of a request, the opaque of a response
    (a consumer sets each stream request's opaque to its vbucket, capture-format.md)."""
    return F.when(F.col("status").isNotNull(), F.col("opaque").cast("int")).otherwise(
        F.col("vbucket")
    )


def _snapshot_event() -> Column:
    op = F.col("op")
    null = F.lit(None).cast("long")

    def state(start: Column, end: Column, flags: Column, oso: bool) -> Column:
        return F.struct(
            start.alias("start"), end.alias("end"), flags.alias("flags"), F.lit(oso).alias("oso")
        )

    oso_start = (F.col("oso_flags").bitwiseAND(1)) != 0
    return (
        F.when(
            op == "snapshot_marker",
            state(F.col("start_seqno"), F.col("end_seqno"), F.col("snapshot_flags"), False),
        )
        .when((op == "oso_snapshot") & oso_start, state(null, null, null, True))
        .when(op == "oso_snapshot", state(null, null, null, False))
        .when(
            (op == "stream_request_response") & (F.col("status") == 0),
            state(null, null, null, False),
        )
    )


def with_session_order(frames: DataFrame, carry_in: DataFrame) -> DataFrame:
    """Add ``in_snapshot_*``, ``in_oso`` and ``in_vb_uuid``: the state in force at each frame.

    A frame's state is that of the last snapshot marker, OSO marker or successful stream
    response before it (or at it) on the same stream, in session order (file sequence, offset);
    before the first such frame of this run, the state the session's earlier files left.
    """
    window = (
        Window.partitionBy("session_id", "vb_key")
        .orderBy("file_sequence", "offset")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    uuid_event = F.when(
        (F.col("op") == "stream_request_response") & F.col("failover_log").isNotNull(),
        F.col("failover_log")[0]["vb_uuid"],
    )
    keyed = frames.withColumn("vb_key", vb_key())
    ordered = keyed.select(
        "*",
        F.last(_snapshot_event(), ignorenulls=True).over(window).alias("_snapshot"),
        F.last(uuid_event, ignorenulls=True).over(window).alias("_vb_uuid"),
    )
    joined = ordered.join(F.broadcast(carry_in), on=["session_id", "vb_key"], how="left")
    snapshot = F.coalesce(F.col("_snapshot"), F.col("carry_snapshot"))
    return joined.select(
        *[c for c in frames.columns],
        "vb_key",
        snapshot["start"].alias("in_snapshot_start"),
        snapshot["end"].alias("in_snapshot_end"),
        snapshot["flags"].alias("in_snapshot_flags"),
        F.coalesce(snapshot["oso"], F.lit(False)).alias("in_oso"),
        F.coalesce(F.col("_vb_uuid"), F.col("carry_vb_uuid")).alias("in_vb_uuid"),
    )


def events(ordered: DataFrame, run_id: str, ingested_at: Column) -> DataFrame:
    """The rows of ``bronze.<bucket>_events``: every well-formed frame, lineage attached."""
    return (
        ordered.where(F.col("op") != "error")
        .withColumn("ingest_run_id", F.lit(run_id))
        .withColumn("ingested_at", ingested_at)
        .select([F.col(f.name).cast(f.dataType) for f in schemas.EVENTS.fields])
    )


def quarantine(frames: DataFrame, run_id: str, ingested_at: Column) -> DataFrame:
    """The rows of ``bronze.<bucket>_quarantine``."""
    return frames.where(F.col("op") == "error").select(
        "bucket", "session_id", "file", "file_sequence", "offset", "opcode",
        F.col("error_reason").alias("reason"), F.col("error_expected").alias("expected"),
        F.col("error_got").alias("got"), F.col("error_frame_length").alias("frame_length"),
        F.col("error_truncated").alias("truncated"), "raw",
        F.col("error_raw_length").alias("raw_length"), F.lit(run_id).alias("ingest_run_id"),
        ingested_at.alias("ingested_at"),
    )  # fmt: skip


def file_end_states(ordered: DataFrame) -> DataFrame:
    """Per file and stream, the state in force after the file's last frame of that stream."""
    last = F.max_by(
        F.struct(
            F.struct(
                F.col("in_snapshot_start").alias("start"), F.col("in_snapshot_end").alias("end"),
                F.col("in_snapshot_flags").alias("flags"), F.col("in_oso").alias("oso"),
            ).alias("snapshot"),
            F.col("in_vb_uuid").alias("vb_uuid"),
        ),
        F.col("offset"),
    )  # fmt: skip
    return (
        ordered.where(F.col("vb_key").isNotNull())
        .groupBy("session_id", "file", "file_sequence", "vb_key")
        .agg(last.alias("state"))
    )


def file_counts(frames: DataFrame) -> DataFrame:
    """Frames and errors per file."""
    return frames.groupBy("file").agg(
        F.sum(F.when(F.col("op") != "error", 1).otherwise(0)).cast("long").alias("frames"),
        F.sum(F.when(F.col("op") == "error", 1).otherwise(0)).cast("long").alias("errors"),
    )
