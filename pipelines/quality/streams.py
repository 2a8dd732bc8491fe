"""The ``snapshot_completeness`` metric frame, one row per DCP stream: its snapshots, what
arrived in each, and the seqnos that repeat (pure DataFrame → DataFrame steps, no I/O).

They start from :func:`pipelines.quality.frames.stream_frames`. The rules are docs/protocol/dcp.md §6.3
(snapshots), §6.9 (OSO), §6.10 (stream end) and §7.1 (ordering).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from dcp_cdc.events import DATA_OPS, Mutation, OsoSnapshot, SnapshotMarker, StreamEnd
from dcp_cdc.protocol import SnapshotFlag
from pipelines.quality.frames import OSO_END, OSO_START

HISTORY_FLAGS = int(
    SnapshotFlag.HISTORY | SnapshotFlag.MAY_CONTAIN_DUPLICATES
)  # keys may repeat (docs/protocol/dcp.md §6.3)
NO_END_SEQNO = -1  # 0xFFFFFFFFFFFFFFFF read as BIGINT: "stream forever" (docs/protocol/dcp.md §4.4)
STREAM_KEY = ("session_started_at", "session_id", "vbucket", "stream_no")
"""A stream: the n-th of a vbucket in a capture session
(:func:`pipelines.quality.frames.stream_frames`)."""


def _range(start: str, end: str) -> Column:
    return F.concat(F.lit("["), F.col(start), F.lit(", "), F.col(end), F.lit("]"))


def snapshots(frames: DataFrame) -> DataFrame:
    """One row per snapshot group of a stream: its range and what arrived in it.

    ``kind`` is ``marker``, ``oso`` or null (the frames of a stream before its first marker).
    ``complete`` (the quality rule, null for the pre-marker group): a marker's end was reached
    by an item or a seqno-advanced, or a later marker of the stream covers its end; an OSO
    backfill got its end marker. ``committed`` (the consumer rule silver follows, docs/protocol/dcp.md §6.3):
    its end was reached, or a later snapshot or the stream's end closed it; an OSO backfill
    commits at its end marker.
    """
    op = F.col("op")
    marker = op == SnapshotMarker.op
    oso_flags = F.coalesce(F.col("oso_flags"), F.lit(0))
    oso_start = (op == OsoSnapshot.op) & (oso_flags.bitwiseAND(OSO_START) != 0)
    oso_end = (op == OsoSnapshot.op) & (oso_flags.bitwiseAND(OSO_END) != 0)
    item = F.col("is_item")
    data = op.isin(*DATA_OPS)
    in_order = item & ~F.coalesce(F.col("in_oso"), F.lit(False))
    position = F.struct("file_sequence", "offset")
    ident = F.struct(F.coalesce(F.col("collection_id"), F.lit(0)), F.col("key"))
    groups = frames.groupBy(
        "session_started_at", "session_id", "vbucket", "stream_no", "snapshot_no"
    ).agg(
        F.max(F.when(marker, F.lit("marker")).when(oso_start, F.lit("oso"))).alias("kind"),
        F.max(F.when(marker, F.col("start_seqno"))).alias("start"),
        F.max(F.when(marker, F.col("end_seqno"))).alias("end"),
        F.max(F.when(marker, F.col("snapshot_flags"))).alias("flags"),
        F.count(F.when(item, 1)).alias("items"),
        F.max(F.when(item, F.col("seqno"))).alias("last_seqno"),
        F.coalesce(
            F.max(in_order & (F.col("seqno") >= F.col("in_snapshot_end"))), F.lit(False)
        ).alias("reached_end"),
        F.coalesce(F.max(oso_end), F.lit(False)).alias("oso_ended"),
        F.coalesce(F.max(op == StreamEnd.op), F.lit(False)).alias("stream_ended"),
        F.count(F.when(F.col("out_of_range"), 1)).alias("out_of_range"),
        F.min_by(F.col("seqno"), F.when(F.col("out_of_range"), position)).alias(
            "out_of_range_seqno"
        ),
        F.count(F.when(F.col("regression"), 1)).alias("regressions"),
        F.min_by(F.struct("seqno", "seqno_floor"), F.when(F.col("regression"), position)).alias(
            "first_regression"
        ),
        F.count(F.when(data, 1)).alias("data_events"),
        F.count_distinct(F.when(data, ident)).alias("distinct_keys"),
    )
    stream = Window.partitionBy("session_id", "vbucket", "stream_no")
    later = stream.orderBy("snapshot_no").rowsBetween(1, Window.unboundedFollowing)
    kind = F.col("kind")
    has_later = F.count(F.lit(1)).over(later) > 0
    complete = F.when(
        kind == "marker",
        F.col("reached_end") | F.coalesce(F.min("start").over(later) <= F.col("end"), F.lit(False)),
    ).when(kind == "oso", F.col("oso_ended"))
    committed = F.when(kind == "oso", F.col("oso_ended")).otherwise(
        F.col("reached_end") | has_later | F.col("stream_ended")
    )
    last_snapshot = F.max(F.when(kind.isNotNull(), F.col("snapshot_no"))).over(stream)
    return groups.select(
        "*",
        complete.alias("complete"),
        committed.alias("committed"),
        (kind.isNotNull() & (F.col("snapshot_no") == last_snapshot)).alias("is_last"),
        F.coalesce(F.col("last_seqno") + 1, F.col("start")).alias("missing_from"),
    )


def duplicate_seqnos(frames: DataFrame) -> DataFrame:
    """Data events whose (vbucket, vb uuid, seqno) repeats inside one stream, or names
    different changes in different streams: a seqno identifies one change on a branch, and a
    re-send after a resume must be that same change (key, rev seqno, CAS, deleted or not)."""
    data = frames.where(F.col("op").isin(*DATA_OPS))
    version = F.struct(
        F.coalesce(F.col("collection_id"), F.lit(0)),
        "key",
        "rev_seqno",
        "cas",
        F.col("op") == Mutation.op,
    )
    bad = (
        data.groupBy("vbucket", "in_vb_uuid", "seqno")
        .agg(
            F.count(F.lit(1)).alias("copies"),
            F.count_distinct(F.struct("session_id", "stream_no")).alias("streams"),
            F.count_distinct(version).alias("versions"),
        )
        .where((F.col("copies") > F.col("streams")) | (F.col("versions") > 1))
        .select(
            F.col("vbucket").alias("_d_vb"),
            F.col("in_vb_uuid").alias("_d_uuid"),
            F.col("seqno").alias("_d_seqno"),
            "versions",
        )
    )
    same = (
        (F.col("vbucket") == F.col("_d_vb"))
        & F.col("in_vb_uuid").eqNullSafe(F.col("_d_uuid"))
        & (F.col("seqno") == F.col("_d_seqno"))
    )
    return data.join(bad, same, how="inner").select(
        "session_started_at",
        "session_id",
        "vbucket",
        "stream_no",
        "in_vb_uuid",
        "seqno",
        F.when(F.col("versions") > 1, F.lit("with different changes"))
        .otherwise(F.lit("repeated"))
        .alias("problem"),
    )


def stream_metrics(
    frames: DataFrame,
    snaps: DataFrame,
    duplicates: DataFrame,
    carried: DataFrame | None = None,
) -> DataFrame:
    """The ``snapshot_completeness`` metric frame: one row per stream (session, vbucket,
    stream number), ``latest`` on the newest stream of each vbucket.

    The last snapshot of a stream is reported, not failed: ``last_snapshot_complete`` is set
    for the latest stream of a vbucket only (its open snapshot is what silver waits on); an
    older stream's unfinished last snapshot was resumed by a later stream (``open_*`` columns
    stay filled for the report).

    ``carried`` (:func:`stream_partials` of frames not given here, from an earlier check)
    adds to what ``frames`` and ``snaps`` say of each stream: every column of a stream is a
    count, a minimum or a maximum, so partial aggregates combine into the whole.
    """
    parts = stream_partials(frames, snaps)
    if carried is not None:
        parts = parts.unionByName(carried)
    with_duplicates = parts.unionByName(_duplicate_parts(duplicates), allowMissingColumns=True)
    return _stream_report(_with_latest(_per_stream(with_duplicates)))


def stream_partials(frames: DataFrame, snaps: DataFrame) -> DataFrame:
    """What ``frames`` and their snapshots (:func:`snapshots`) say of each stream, aggregated
    per stream in the columns of the parts (``f_*``, ``s_*``): partial rows to combine with
    those of other frames of the same streams (:func:`stream_metrics`' ``carried``)."""
    # one row per stream from two sources: a union and one aggregation, no joins
    parts = _frame_parts(frames).unionByName(_snapshot_parts(snaps), allowMissingColumns=True)
    return combine(parts)


def _frame_parts(frames: DataFrame) -> DataFrame:
    """What the frames say of their stream (``f_*``): whether it opened, its items, the
    request it answers, how it ended, and the highest seqnos sent on it."""
    op = F.col("op")
    position = F.struct("file_sequence", "offset")
    opens = F.col("opens_stream")
    return frames.select(
        *STREAM_KEY,
        opens.alias("f_opens"),
        F.col("is_item").cast("long").alias("f_items"),
        F.when(opens, F.col("requested_start")).alias("f_requested_start"),
        F.when(opens, F.col("requested_end")).alias("f_requested_end"),
        F.when(op == StreamEnd.op, F.struct(position.alias("at"), "reason_code", "reason")).alias(
            "f_end"
        ),
        F.when(F.col("is_item"), F.col("seqno")).alias("f_item_seqno"),
        F.when(op == SnapshotMarker.op, F.col("end_seqno")).alias("f_marker_end"),
    )


def _first(condition: Column, text: Column) -> Column:
    """The snapshot's number and a text, where ``condition`` holds: min() finds the first."""
    return F.when(condition, F.struct(F.col("snapshot_no").alias("no"), text.alias("text")))


def _snapshot_parts(snaps: DataFrame) -> DataFrame:
    """What each snapshot (:func:`snapshots`) adds to its stream (``s_*``): its counts, the
    first problem of each kind (:func:`_first`), and the stream's last snapshot."""
    kind = F.col("kind")
    snapshot = kind.isNotNull()
    incomplete = snapshot & ~F.col("is_last") & ~F.col("complete")
    repeats = (
        snapshot
        & (F.col("data_events") > F.col("distinct_keys"))
        & (F.coalesce(F.col("flags"), F.lit(0)).bitwiseAND(HISTORY_FLAGS) == 0)
    )
    missing = F.concat(
        F.col("missing_from"),
        F.lit(".."),
        F.coalesce(F.col("end").cast("string"), F.lit("its end marker")),
    )
    return snaps.select(
        *STREAM_KEY,
        snapshot.cast("long").alias("s_snapshots"),
        F.col("items").alias("s_items"),
        F.col("out_of_range").alias("s_out_of_range"),
        _first(
            F.col("out_of_range") > 0,
            F.concat(
                F.lit("seqno "),
                F.col("out_of_range_seqno"),
                F.lit(" outside "),
                F.coalesce(_range("start", "end"), F.lit("any snapshot")),
            ),
        ).alias("s_out_of_range_first"),
        incomplete.cast("long").alias("s_incomplete"),
        _first(incomplete, F.concat(_range("start", "end"), F.lit(" missing "), missing)).alias(
            "s_incomplete_first"
        ),
        F.when(
            snapshot,
            F.struct(
                F.col("snapshot_no").alias("no"),
                "kind",
                "start",
                "end",
                "last_seqno",
                "complete",
                "missing_from",
            ),
        ).alias("s_last"),
        F.col("regressions").alias("s_regressions"),
        _first(
            F.col("regressions") > 0,
            F.concat(
                F.lit("seqno "),
                F.col("first_regression.seqno"),
                F.lit(" after "),
                F.col("first_regression.seqno_floor"),
            ),
        ).alias("s_regression_first"),
        repeats.cast("long").alias("s_repeats"),
        _first(
            repeats,
            F.concat(
                _range("start", "end"),
                F.lit(": "),
                F.col("data_events"),
                F.lit(" data events for "),
                F.col("distinct_keys"),
                F.lit(" keys"),
            ),
        ).alias("s_repeat_first"),
        F.when(F.col("complete"), F.coalesce(F.col("end"), F.col("last_seqno"))).alias(
            "s_complete_end"
        ),
    )


def _duplicate_parts(duplicates: DataFrame) -> DataFrame:
    """The repeated seqnos (:func:`duplicate_seqnos`) of each stream (``d_duplicate``)."""
    return duplicates.select(
        *STREAM_KEY,
        F.struct(
            F.col("seqno").alias("no"),
            F.concat(F.lit("seqno "), F.col("seqno"), F.lit(" "), F.col("problem")).alias("text"),
        ).alias("d_duplicate"),
        F.lit(1).cast("long").alias("d_duplicates"),
    )


_SUMS = (
    "f_items",
    "s_snapshots",
    "s_items",
    "s_out_of_range",
    "s_incomplete",
    "s_regressions",
    "s_repeats",
)
_MINS = (
    "f_end",
    "s_out_of_range_first",
    "s_incomplete_first",
    "s_regression_first",
    "s_repeat_first",
)
_MAXES = (
    "f_opens",
    "f_requested_start",
    "f_requested_end",
    "f_item_seqno",
    "f_marker_end",
    "s_last",
    "s_complete_end",
)


def combine(parts: DataFrame, *more: Column) -> DataFrame:
    """``parts`` (frame and snapshot parts, or partial rows of them) per stream, in the same
    columns: counts summed, first problems and the end the earliest, the rest the highest;
    ``more`` aggregates beside them."""
    return parts.groupBy(*STREAM_KEY).agg(
        *[F.coalesce(F.sum(c), F.lit(0)).cast("long").alias(c) for c in _SUMS],
        *[F.min(c).alias(c) for c in _MINS],
        *[F.max(c).alias(c) for c in _MAXES],
        *more,
    )


def _per_stream(parts: DataFrame) -> DataFrame:
    """The parts (and the duplicates' ``d_*``) aggregated, one row per stream that opened or
    sent items (not a refused request)."""
    combined = combine(
        parts,
        F.coalesce(F.sum("d_duplicates"), F.lit(0)).cast("long").alias("duplicate_seqnos"),
        F.min("d_duplicate").alias("duplicate_first"),
    )
    grouped = combined.select(
        *STREAM_KEY,
        F.col("f_opens").alias("opened"),
        F.col("f_items").alias("stream_items"),
        F.col("f_requested_start").alias("requested_start"),
        F.col("f_requested_end").alias("requested_end"),
        F.col("f_end").alias("stream_end"),
        F.col("f_item_seqno").alias("max_item_seqno"),
        F.col("f_marker_end").alias("max_marker_end"),
        F.col("s_snapshots").alias("snapshots"),
        F.col("s_items").alias("items"),
        F.col("s_out_of_range").alias("out_of_range"),
        F.col("s_out_of_range_first").alias("out_of_range_first"),
        F.col("s_incomplete").alias("incomplete"),
        F.col("s_incomplete_first").alias("incomplete_first"),
        F.col("s_last").alias("last"),
        F.col("s_regressions").alias("regressions"),
        F.col("s_regression_first").alias("regression_first"),
        F.col("s_repeats").alias("duplicate_keys"),
        F.col("s_repeat_first").alias("repeat_first"),
        F.col("s_complete_end").alias("complete_end"),
        "duplicate_seqnos",
        "duplicate_first",
    )
    return grouped.where(F.col("opened") | (F.col("stream_items") > 0))


def _with_latest(streams: DataFrame) -> DataFrame:
    """``streams`` with ``latest``: the newest stream of its vbucket."""
    newest = Window.partitionBy("vbucket").orderBy(
        *[F.col(c).desc() for c in ("session_started_at", "session_id", "stream_no")]
    )
    return streams.withColumn("latest", F.row_number().over(newest) == 1)


def _stream_report(streams: DataFrame) -> DataFrame:
    """The metric frame's columns: counts with the first problem's text, the open last
    snapshot (``open_*``), and how a bounded stream ended."""
    bounded = F.col("requested_end").isNotNull() & (F.col("requested_end") != NO_END_SEQNO)
    last_open = F.col("last").isNotNull() & ~F.coalesce(F.col("last.complete"), F.lit(False))

    def open_col(name: str) -> Column:
        return F.when(last_open, F.col(f"last.{name}"))

    # a bounded stream that did not end OK (a cut connection, a move, a failover) but that a
    # later stream of its vbucket resumed is a recovered fault, not an error: the latest
    # stream of each vbucket is the one that must have ended OK
    end_ok = F.coalesce(F.col("stream_end.reason_code") == 0, F.lit(False)) | ~F.col("latest")
    return streams.select(
        F.concat(
            F.lit("vb "),
            F.col("vbucket"),
            F.lit(" · session "),
            F.col("session_id"),
            F.lit(" · stream "),
            F.col("stream_no"),
        ).alias("where"),
        "vbucket",
        "session_started_at",
        "session_id",
        "stream_no",
        "latest",
        "snapshots",
        "items",
        "out_of_range",
        F.col("out_of_range_first.text").alias("out_of_range_detail"),
        "incomplete",
        F.col("incomplete_first.text").alias("incomplete_detail"),
        F.when(F.col("latest") & F.col("last").isNotNull(), ~last_open).alias(
            "last_snapshot_complete"
        ),
        open_col("start").alias("open_start"),
        open_col("end").alias("open_end"),
        open_col("last_seqno").alias("open_last_seqno"),
        open_col("missing_from").alias("open_missing_from"),
        F.when(
            last_open,
            F.concat(
                F.coalesce(_range("last.start", "last.end"), F.lit("OSO backfill")),
                F.lit(" received up to "),
                F.coalesce(F.col("last.last_seqno").cast("string"), F.lit("nothing")),
                F.lit(", missing "),
                F.col("last.missing_from"),
                F.lit(".."),
                F.coalesce(F.col("last.end").cast("string"), F.lit("its end marker")),
            ),
        ).alias("open_detail"),
        "regressions",
        F.col("regression_first.text").alias("regression_detail"),
        "duplicate_seqnos",
        F.col("duplicate_first.text").alias("duplicate_seqno_detail"),
        "duplicate_keys",
        F.col("repeat_first.text").alias("duplicate_key_detail"),
        bounded.alias("bounded"),
        "requested_start",
        F.when(bounded, F.col("requested_end")).alias("requested_end"),
        F.col("stream_end.reason_code").alias("end_reason_code"),
        F.when(bounded, end_ok).alias("bounded_end_ok"),
        F.when(
            bounded & ~end_ok,
            F.concat(
                F.lit("asked to end at "),
                F.col("requested_end"),
                F.lit(", "),
                F.coalesce(
                    F.concat(
                        F.lit("ended "),
                        F.col("stream_end.reason"),
                        F.lit(" ("),
                        F.col("stream_end.reason_code"),
                        F.lit(")"),
                    ),
                    F.lit("no stream end"),
                ),
            ),
        ).alias("end_detail"),
        F.greatest("max_item_seqno", "max_marker_end", "requested_start").alias("producer_high"),
        F.greatest("complete_end", "requested_start").alias("complete_end"),
    )
