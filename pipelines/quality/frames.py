"""Bronze, read once for the quality suites: the projection every metric derives from, and
each frame of a DCP stream placed in its session, stream and snapshot (pure DataFrame →
DataFrame steps, no I/O).

:func:`base_frames` projects what every metric needs (materialize it once), and
:func:`stream_frames` places each frame with one window pass per (session, vbucket); the
snapshot and stream metrics (:mod:`pipelines.quality.streams`), the branches
(:mod:`pipelines.quality.branches`) and the other metric frames
(:mod:`pipelines.quality.measures`) start from them. Great Expectations then validates the
small metric frames.

The rules are docs/protocol/dcp.md §6.3 (snapshots), §6.9 (OSO), §6.10 (stream end), §7.1 (ordering) and
§7.4–§7.5 (failover log, rollback).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from dcp_cdc.events import (
    DATA_OPS,
    Abort,
    AddStream,
    AddStreamResponse,
    Commit,
    OsoSnapshot,
    Prepare,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamEnd,
    StreamRequest,
    StreamRequestResponse,
    SystemEvent,
    UnknownFrame,
)
from dcp_cdc.protocol import ClientOpcode, Opcode, OsoFlag
from pipelines.bronze.transforms import vb_key

ITEM_OPS = (*DATA_OPS, SystemEvent.op, SeqnoAdvanced.op, Prepare.op, Commit.op, Abort.op)
"""Frames that carry a seqno of the vbucket's history (docs/protocol/dcp.md §7.1)."""
STREAM_OPS = (
    *ITEM_OPS,
    SnapshotMarker.op,
    OsoSnapshot.op,
    StreamEnd.op,
    StreamRequest.op,
    StreamRequestResponse.op,
)
KNOWN_OPCODES = tuple(sorted([int(o) for o in Opcode] + [int(ClientOpcode.GET_ALL_VB_SEQNOS)]))
"""The DCP opcodes, and the one other command a capture records (the cluster state a session
ends with: docs on capture)."""
OSO_START, OSO_END = int(OsoFlag.START), int(OsoFlag.END)

_KEYED = ("vbucket", "by_seqno", "rev_seqno", "cas", "key", "in_vb_uuid")
REQUIRED: dict[str, tuple[str, ...] | None] = {
    **{
        c: None
        for c in (
            "op",
            "opcode",
            "magic",
            "offset",
            "frame_len",
            "bucket",
            "session_id",
            "session_started_at",
            "file",
            "file_sequence",
            "frame_index",
            "ingest_run_id",
            "ingested_at",
        )
    },
    **{c: DATA_OPS for c in _KEYED},
    "vbucket": (
        *DATA_OPS,
        SnapshotMarker.op,
        SystemEvent.op,
        SeqnoAdvanced.op,
        OsoSnapshot.op,
        StreamEnd.op,
        StreamRequest.op,
        AddStream.op,
    ),
    "by_seqno": (*DATA_OPS, SystemEvent.op, SeqnoAdvanced.op),
    "start_seqno": (SnapshotMarker.op, StreamRequest.op),
    "end_seqno": (SnapshotMarker.op, StreamRequest.op),
    "snapshot_flags": (SnapshotMarker.op,),
    "event": (SystemEvent.op,),
    "oso_flags": (OsoSnapshot.op,),
    "reason_code": (StreamEnd.op,),
    "status": (StreamRequestResponse.op, AddStreamResponse.op),
}
"""Bronze columns that must not be null: for every frame (``None``) or for the ops named."""

POSITION = ("session_started_at", "session_id", "file_sequence", "offset")
"""Session order: where a frame stands in a vbucket's whole history (bronze lineage)."""


def history_position() -> Column:
    """A frame's place in its vbucket's whole history (:data:`POSITION`), as one comparable
    struct."""
    return F.struct(*POSITION)


def null_columns() -> Column:
    """The names of the required columns (:data:`REQUIRED`) that are null in this frame."""
    op = F.col("op")
    named = [
        F.when(F.col(c).isNull() & (F.lit(True) if ops is None else op.isin(*ops)), F.lit(c))
        for c, ops in REQUIRED.items()
    ]
    return F.filter(F.array(*named), lambda c: c.isNotNull())


def unknown_opcode() -> Column:
    return (F.col("op") == UnknownFrame.op) | ~F.col("opcode").isin(*KNOWN_OPCODES)


BASE_COLUMNS = (
    "vbucket",
    "op",
    "status",
    *POSITION,
    "file",
    "ingest_run_id",
    "seqno",
    "collection_id",
    "key",
    "rev_seqno",
    "cas",
    "expiration",
    "event",
    "start_seqno",
    "end_seqno",
    "snapshot_flags",
    "oso_flags",
    "reason_code",
    "reason",
    "rollback_seqno",
    "failover_log",
    "high_seqnos",
    "in_snapshot_start",
    "in_snapshot_end",
    "in_snapshot_flags",
    "in_oso",
    "in_vb_uuid",
    "null_columns",
    "unknown_opcode",
    "opcode",
)
"""The columns of :func:`base_frames`: bronze's own, but for the four derived there."""


def base_frames(events: DataFrame) -> DataFrame:
    """The projection of ``bronze.<bucket>_events`` every metric derives from (persist it).

    ``vbucket`` is the stream a frame belongs to: the vbucket of a request, the opaque of a
    response (bronze's rule); ``seqno`` is a history item's seqno (by, commit or abort seqno).
    """
    derived = {
        "vbucket": vb_key(),
        "seqno": F.coalesce("by_seqno", "commit_seqno", "abort_seqno"),
        "null_columns": null_columns(),
        "unknown_opcode": unknown_opcode(),
    }
    return events.select(*[derived[c].alias(c) if c in derived else c for c in BASE_COLUMNS])


SEED_COLUMNS = (
    ("s_opened", "LONG"),
    ("s_requests", "LONG"),
    ("s_snapshot_no", "LONG"),
    ("s_rollback_no", "LONG"),
    ("s_rollback_floor", "LONG"),
    ("s_requested_start", "LONG"),
    ("s_requested_end", "LONG"),
    ("s_answered", "LONG"),
    ("s_floor", "LONG"),
)
"""What :func:`stream_frames` starts a (session, vbucket) from when it does not start at its
first frame: each window's value just before its first frame here (a checked prefix carried
from an earlier check, :mod:`pipelines.quality.carry`)."""
SEEDS_SCHEMA = "session_id STRING, vbucket INT, " + ", ".join(f"{c} {t}" for c, t in SEED_COLUMNS)


def stream_frames(base: DataFrame, seeds: DataFrame | None = None) -> DataFrame:
    """The frames of DCP streams, each placed in its stream and snapshot.

    Per (session, vbucket), in session order: ``stream_no`` numbers the streams: a stream
    request, the rollback responses and re-requests that follow it, up to and including the
    successful response that opens the stream (docs/protocol/dcp.md §6.1, §7.5), and everything after it.
    ``snapshot_no`` counts snapshot openers (markers, OSO starts and stream starts),
    ``rollback_no`` rollback responses (0x23). ``requested_start``/``requested_end`` are the
    last request's, so the response that opens a stream carries the request it answers.

    ``regression`` marks an item whose seqno does not exceed every seqno before it since the
    last rollback (nor that rollback's seqno): seqnos strictly increase on a stream except
    inside an OSO backfill (docs/protocol/dcp.md §7.1, §6.9). ``out_of_range`` marks an item outside its
    snapshot's [start, end] or outside any snapshot (docs/protocol/dcp.md §6.3: assert only
    ``start <= seqno <= end``; a first marker's start is the requested start).

    ``seeds`` (:data:`SEEDS_SCHEMA`, one row per (session, vbucket)): the frames of a
    (session, vbucket) with a seed continue a prefix not given here, each count and last
    value from the seed's (a frame without one starts from nothing). ``s_floor`` is the
    highest item seqno of the prefix's last ``rollback_no``. The ``_seed_*`` columns give a
    frame's values for seeding a later call that starts after it.
    """
    op = F.col("op")
    frames = base.where(op.isin(*STREAM_OPS) & F.col("vbucket").isNotNull())
    if seeds is None:
        frames = frames.select("*", *[F.lit(None).cast(t).alias(c) for c, t in SEED_COLUMNS])
    else:
        frames = frames.join(F.broadcast(seeds), on=["session_id", "vbucket"], how="left")

    def seeded(name: str, counted: Column) -> Column:
        return F.coalesce(F.col(name), F.lit(0)) + counted

    ordered = Window.partitionBy("session_id", "vbucket").orderBy("file_sequence", "offset")
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    opens_stream = (op == StreamRequestResponse.op) & (F.col("status") == 0)
    oso_flags = F.coalesce(F.col("oso_flags"), F.lit(0))
    opens_snapshot = (
        (op == SnapshotMarker.op)
        | ((op == OsoSnapshot.op) & (oso_flags.bitwiseAND(OSO_START) != 0))
        | opens_stream
    )
    rollback = (op == StreamRequestResponse.op) & F.col("rollback_seqno").isNotNull()
    request = op == StreamRequest.op

    def last(value: Column, when: Column, seed: str) -> Column:
        return F.coalesce(F.last(F.when(when, value), ignorenulls=True).over(upto), F.col(seed))

    counted = frames.select(
        "*",
        opens_stream.alias("opens_stream"),
        rollback.alias("is_rollback"),
        (op.isin(*ITEM_OPS) & F.col("seqno").isNotNull()).alias("is_item"),
        seeded("s_opened", F.sum(opens_stream.cast("long")).over(upto)).alias("_opened"),
        seeded("s_requests", F.sum(request.cast("long")).over(upto)).alias("_requests"),
        seeded("s_snapshot_no", F.sum(opens_snapshot.cast("long")).over(upto)).alias("snapshot_no"),
        seeded("s_rollback_no", F.sum(rollback.cast("long")).over(upto)).alias("rollback_no"),
        last(F.col("rollback_seqno"), rollback, "s_rollback_floor").alias("rollback_floor"),
        last(F.col("start_seqno"), request, "s_requested_start").alias("requested_start"),
        last(F.col("end_seqno"), request, "s_requested_end").alias("requested_end"),
    )
    # a request not yet answered by a successful response belongs to the stream it opens
    answered = last(F.col("_requests"), F.col("opens_stream"), "s_answered")
    pending = F.col("_requests") > F.coalesce(F.col("_answered"), F.lit(0))
    placed = counted.withColumn("_answered", answered).withColumn(
        "stream_no", F.col("_opened") + pending.cast("long")
    )
    # Clustered on a superset of the first window's keys: Spark sorts again, no new shuffle.
    before = (
        Window.partitionBy("session_id", "vbucket", "rollback_no")
        .orderBy("file_sequence", "offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    in_order = F.col("is_item") & ~F.coalesce(F.col("in_oso"), F.lit(False))
    floor = F.greatest(
        F.max(F.when(F.col("is_item"), F.col("seqno"))).over(before),
        F.col("rollback_floor"),
        F.when(F.col("rollback_no") == F.col("s_rollback_no"), F.col("s_floor")),
    )
    seqno = F.col("seqno")
    outside = (
        F.col("in_snapshot_start").isNull()
        | (seqno < F.col("in_snapshot_start"))
        | (seqno > F.col("in_snapshot_end"))
    )
    return placed.select(
        "*",
        F.coalesce(in_order & (seqno <= floor), F.lit(False)).alias("regression"),
        floor.alias("seqno_floor"),
        (in_order & outside).alias("out_of_range"),
    ).drop(*[c for c, _ in SEED_COLUMNS])


def seeds_after(frames: DataFrame) -> DataFrame:
    """The seeds (:data:`SEEDS_SCHEMA`) of a call that starts just after each of ``frames``
    (:func:`stream_frames` rows): that frame's counts and last values."""
    return frames.select(
        "session_id",
        "vbucket",
        F.col("_opened").alias("s_opened"),
        F.col("_requests").alias("s_requests"),
        F.col("snapshot_no").alias("s_snapshot_no"),
        F.col("rollback_no").alias("s_rollback_no"),
        F.col("rollback_floor").alias("s_rollback_floor"),
        F.col("requested_start").alias("s_requested_start"),
        F.col("requested_end").alias("s_requested_end"),
        F.col("_answered").alias("s_answered"),
        F.greatest(F.col("seqno_floor"), F.when(F.col("is_item"), F.col("seqno"))).alias("s_floor"),
    )
