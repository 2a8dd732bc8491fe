"""Pure DataFrame → DataFrame steps of the quality suites: compact metric frames, no I/O.

Bronze is read once: :func:`base_frames` projects what every metric needs (materialize it once), and
:func:`stream_frames` places each frame of a DCP stream in its session, stream and snapshot
with one window pass per (session, vbucket). Every metric frame is small, one row per
stream, vbucket, collection or capture file, with a ``where`` label for the report and a
``*_detail`` text next to each problem count; Great Expectations then validates those frames.

The rules are spec §6.3 (snapshots), §6.9 (OSO), §6.10 (stream end), §7.1 (ordering) and
§7.4–§7.5 (failover log, rollback).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from dcp_cdc.events import DATA_OPS
from dcp_cdc.protocol import ClientOpcode, Opcode, OsoFlag, SnapshotFlag
from pipelines.bronze.transforms import vb_key

ITEM_OPS = (*DATA_OPS, "system_event", "seqno_advanced", "prepare", "commit", "abort")
"""Frames that carry a seqno of the vbucket's history (spec §7.1)."""
STREAM_OPS = (
    *ITEM_OPS,
    "snapshot_marker",
    "oso_snapshot",
    "stream_end",
    "stream_request",
    "stream_request_response",
)
KNOWN_OPCODES = tuple(sorted([int(o) for o in Opcode] + [int(ClientOpcode.GET_ALL_VB_SEQNOS)]))
"""The DCP opcodes, and the one other command a capture records (the cluster state a session
ends with: docs on capture)."""
HISTORY_FLAGS = int(
    SnapshotFlag.HISTORY | SnapshotFlag.MAY_CONTAIN_DUPLICATES
)  # keys may repeat (spec §6.3)
NO_END_SEQNO = -1  # 0xFFFFFFFFFFFFFFFF read as BIGINT: "stream forever" (spec §4.4)
OSO_START, OSO_END = int(OsoFlag.START), int(OsoFlag.END)
CHECKSUM_MODULUS = 9223372036854775783  # the largest prime below 2^63: checksums stay BIGINT

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
        "snapshot_marker",
        "system_event",
        "seqno_advanced",
        "oso_snapshot",
        "stream_end",
        "stream_request",
        "add_stream",
    ),
    "by_seqno": (*DATA_OPS, "system_event", "seqno_advanced"),
    "start_seqno": ("snapshot_marker", "stream_request"),
    "end_seqno": ("snapshot_marker", "stream_request"),
    "snapshot_flags": ("snapshot_marker",),
    "event": ("system_event",),
    "oso_flags": ("oso_snapshot",),
    "reason_code": ("stream_end",),
    "status": ("stream_request_response", "add_stream_response"),
}
"""Bronze columns that must not be null: for every frame (``None``) or for the ops named."""

POSITION = ("session_started_at", "session_id", "file_sequence", "offset")
"""Session order: where a frame stands in a vbucket's whole history (bronze lineage)."""


def _position() -> Column:
    return F.struct(*POSITION)


def _basename(path: Column) -> Column:
    return F.element_at(F.split(path, "/"), -1)


def _range(start: str, end: str) -> Column:
    return F.concat(F.lit("["), F.col(start), F.lit(", "), F.col(end), F.lit("]"))


# --- bronze, once -------------------------------------------------------------------------


def null_columns() -> Column:
    """The names of the required columns (:data:`REQUIRED`) that are null in this frame."""
    op = F.col("op")
    named = [
        F.when(F.col(c).isNull() & (F.lit(True) if ops is None else op.isin(*ops)), F.lit(c))
        for c, ops in REQUIRED.items()
    ]
    return F.filter(F.array(*named), lambda c: c.isNotNull())


def unknown_opcode() -> Column:
    return (F.col("op") == "unknown") | ~F.col("opcode").isin(*KNOWN_OPCODES)


def base_frames(events: DataFrame) -> DataFrame:
    """The projection of ``bronze.<bucket>_events`` every metric derives from (persist it).

    ``vbucket`` is the stream a frame belongs to: the vbucket of a request, the opaque of a
    response (bronze's rule); ``seqno`` is a history item's seqno (by, commit or abort seqno).
    """
    return events.select(
        vb_key().alias("vbucket"),
        "op",
        "status",
        *POSITION,
        "file",
        F.coalesce("by_seqno", "commit_seqno", "abort_seqno").alias("seqno"),
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
        null_columns().alias("null_columns"),
        unknown_opcode().alias("unknown_opcode"),
        "opcode",
    )


def stream_frames(base: DataFrame) -> DataFrame:
    """The frames of DCP streams, each placed in its stream and snapshot.

    Per (session, vbucket), in session order: ``stream_no`` numbers the streams: a stream
    request, the rollback responses and re-requests that follow it, up to and including the
    successful response that opens the stream (spec §6.1, §7.5), and everything after it.
    ``snapshot_no`` counts snapshot openers (markers, OSO starts and stream starts),
    ``rollback_no`` rollback responses (0x23). ``requested_start``/``requested_end`` are the
    last request's, so the response that opens a stream carries the request it answers.

    ``regression`` marks an item whose seqno does not exceed every seqno before it since the
    last rollback (nor that rollback's seqno): seqnos strictly increase on a stream except
    inside an OSO backfill (spec §7.1, §6.9). ``out_of_range`` marks an item outside its
    snapshot's [start, end] or outside any snapshot (spec §6.3: assert only
    ``start <= seqno <= end``; a first marker's start is the requested start).
    """
    op = F.col("op")
    frames = base.where(op.isin(*STREAM_OPS) & F.col("vbucket").isNotNull())
    ordered = Window.partitionBy("session_id", "vbucket").orderBy("file_sequence", "offset")
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    opens_stream = (op == "stream_request_response") & (F.col("status") == 0)
    oso_flags = F.coalesce(F.col("oso_flags"), F.lit(0))
    opens_snapshot = (
        (op == "snapshot_marker")
        | ((op == "oso_snapshot") & (oso_flags.bitwiseAND(OSO_START) != 0))
        | opens_stream
    )
    rollback = (op == "stream_request_response") & F.col("rollback_seqno").isNotNull()
    request = op == "stream_request"
    counted = frames.select(
        "*",
        opens_stream.alias("opens_stream"),
        rollback.alias("is_rollback"),
        (op.isin(*ITEM_OPS) & F.col("seqno").isNotNull()).alias("is_item"),
        F.sum(opens_stream.cast("int")).over(upto).alias("_opened"),
        F.sum(request.cast("int")).over(upto).alias("_requests"),
        F.sum(opens_snapshot.cast("int")).over(upto).alias("snapshot_no"),
        F.sum(rollback.cast("int")).over(upto).alias("rollback_no"),
        F.last(F.when(rollback, F.col("rollback_seqno")), ignorenulls=True)
        .over(upto)
        .alias("rollback_floor"),
        F.last(F.when(request, F.col("start_seqno")), ignorenulls=True)
        .over(upto)
        .alias("requested_start"),
        F.last(F.when(request, F.col("end_seqno")), ignorenulls=True)
        .over(upto)
        .alias("requested_end"),
    )
    # a request not yet answered by a successful response belongs to the stream it opens
    answered = F.last(F.when(F.col("opens_stream"), F.col("_requests")), ignorenulls=True)
    pending = F.col("_requests") > F.coalesce(answered.over(upto), F.lit(0))
    placed = counted.withColumn("stream_no", F.col("_opened") + pending.cast("int")).drop(
        "_opened", "_requests"
    )
    # Clustered on a superset of the first window's keys: Spark sorts again, no new shuffle.
    before = (
        Window.partitionBy("session_id", "vbucket", "rollback_no")
        .orderBy("file_sequence", "offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    in_order = F.col("is_item") & ~F.coalesce(F.col("in_oso"), F.lit(False))
    floor = F.greatest(
        F.max(F.when(F.col("is_item"), F.col("seqno"))).over(before), F.col("rollback_floor")
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
    )


# --- snapshots and streams (snapshot_completeness) ----------------------------------------


def snapshots(frames: DataFrame) -> DataFrame:
    """One row per snapshot group of a stream: its range and what arrived in it.

    ``kind`` is ``marker``, ``oso`` or null (the frames of a stream before its first marker).
    ``complete`` (the quality rule, null for the pre-marker group): a marker's end was reached
    by an item or a seqno-advanced, or a later marker of the stream covers its end; an OSO
    backfill got its end marker. ``committed`` (the consumer rule silver follows, spec §6.3):
    its end was reached, or a later snapshot or the stream's end closed it; an OSO backfill
    commits at its end marker.
    """
    op = F.col("op")
    marker = op == "snapshot_marker"
    oso_flags = F.coalesce(F.col("oso_flags"), F.lit(0))
    oso_start = (op == "oso_snapshot") & (oso_flags.bitwiseAND(OSO_START) != 0)
    oso_end = (op == "oso_snapshot") & (oso_flags.bitwiseAND(OSO_END) != 0)
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
        F.coalesce(F.max(op == "stream_end"), F.lit(False)).alias("stream_ended"),
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
        F.col("op") == "mutation",
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
        "seqno",
        F.when(F.col("versions") > 1, F.lit("with different changes"))
        .otherwise(F.lit("repeated"))
        .alias("problem"),
    )


def stream_metrics(frames: DataFrame, snaps: DataFrame, duplicates: DataFrame) -> DataFrame:
    """The ``snapshot_completeness`` metric frame: one row per stream (session, vbucket,
    stream number), ``latest`` on the newest stream of each vbucket.

    The last snapshot of a stream is reported, not failed: ``last_snapshot_complete`` is set
    for the latest stream of a vbucket only (its open snapshot is what silver waits on); an
    older stream's unfinished last snapshot was resumed by a later stream (``open_*`` columns
    stay filled for the report).
    """
    op = F.col("op")
    key = ["session_started_at", "session_id", "vbucket", "stream_no"]
    position = F.struct("file_sequence", "offset")
    opens = F.col("opens_stream")
    from_frames = frames.select(
        *key,
        opens.alias("f_opens"),
        F.col("is_item").alias("f_item"),
        F.when(opens, F.col("requested_start")).alias("f_requested_start"),
        F.when(opens, F.col("requested_end")).alias("f_requested_end"),
        F.when(op == "stream_end", F.struct(position.alias("at"), "reason_code", "reason")).alias(
            "f_end"
        ),
        F.when(F.col("is_item"), F.col("seqno")).alias("f_item_seqno"),
        F.when(op == "snapshot_marker", F.col("end_seqno")).alias("f_marker_end"),
    )
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

    def first(condition: Column, text: Column) -> Column:
        """The snapshot's number and a text, where ``condition`` holds: min() finds the first."""
        return F.when(condition, F.struct(F.col("snapshot_no").alias("no"), text.alias("text")))

    from_snaps = snaps.select(
        *key,
        snapshot.alias("s_snapshot"),
        F.col("items").alias("s_items"),
        F.col("out_of_range").alias("s_out_of_range"),
        first(
            F.col("out_of_range") > 0,
            F.concat(
                F.lit("seqno "),
                F.col("out_of_range_seqno"),
                F.lit(" outside "),
                F.coalesce(_range("start", "end"), F.lit("any snapshot")),
            ),
        ).alias("s_out_of_range_first"),
        incomplete.alias("s_incomplete"),
        first(incomplete, F.concat(_range("start", "end"), F.lit(" missing "), missing)).alias(
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
        first(
            F.col("regressions") > 0,
            F.concat(
                F.lit("seqno "),
                F.col("first_regression.seqno"),
                F.lit(" after "),
                F.col("first_regression.seqno_floor"),
            ),
        ).alias("s_regression_first"),
        repeats.alias("s_repeats"),
        first(
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
    from_duplicates = duplicates.select(
        *key,
        F.struct(
            F.col("seqno").alias("no"),
            F.concat(F.lit("seqno "), F.col("seqno"), F.lit(" "), F.col("problem")).alias("text"),
        ).alias("d_duplicate"),
    )
    # one row per stream from three sources: a union and one aggregation, no joins
    parts = from_frames.unionByName(from_snaps, allowMissingColumns=True).unionByName(
        from_duplicates, allowMissingColumns=True
    )
    grouped = parts.groupBy(*key).agg(
        F.max("f_opens").alias("opened"),
        F.count(F.when(F.col("f_item"), 1)).alias("stream_items"),
        F.max("f_requested_start").alias("requested_start"),
        F.max("f_requested_end").alias("requested_end"),
        F.min("f_end").alias("stream_end"),
        F.max("f_item_seqno").alias("max_item_seqno"),
        F.max("f_marker_end").alias("max_marker_end"),
        F.count(F.when(F.col("s_snapshot"), 1)).alias("snapshots"),
        F.coalesce(F.sum("s_items"), F.lit(0)).alias("items"),
        F.coalesce(F.sum("s_out_of_range"), F.lit(0)).alias("out_of_range"),
        F.min("s_out_of_range_first").alias("out_of_range_first"),
        F.count(F.when(F.col("s_incomplete"), 1)).alias("incomplete"),
        F.min("s_incomplete_first").alias("incomplete_first"),
        F.max("s_last").alias("last"),
        F.coalesce(F.sum("s_regressions"), F.lit(0)).alias("regressions"),
        F.min("s_regression_first").alias("regression_first"),
        F.count(F.when(F.col("s_repeats"), 1)).alias("duplicate_keys"),
        F.min("s_repeat_first").alias("repeat_first"),
        F.max("s_complete_end").alias("complete_end"),
        F.count("d_duplicate").alias("duplicate_seqnos"),
        F.min("d_duplicate").alias("duplicate_first"),
    )
    joined = grouped.where(F.col("opened") | (F.col("stream_items") > 0))  # not a refused request
    newest = Window.partitionBy("vbucket").orderBy(
        *[F.col(c).desc() for c in ("session_started_at", "session_id", "stream_no")]
    )
    joined = joined.withColumn("latest", F.row_number().over(newest) == 1)
    bounded = F.col("requested_end").isNotNull() & (F.col("requested_end") != NO_END_SEQNO)
    last_open = F.col("last").isNotNull() & ~F.coalesce(F.col("last.complete"), F.lit(False))

    def open_col(name: str) -> Column:
        return F.when(last_open, F.col(f"last.{name}"))

    # a bounded stream that did not end OK (a cut connection, a move, a failover) but that a
    # later stream of its vbucket resumed is a recovered fault, not an error: the latest
    # stream of each vbucket is the one that must have ended OK
    end_ok = F.coalesce(F.col("stream_end.reason_code") == 0, F.lit(False)) | ~F.col("latest")
    return joined.select(
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


# --- branches, rollbacks and the state bronze implies -------------------------------------


def latest_branches(frames: DataFrame) -> DataFrame:
    """Per vbucket, the branches of its newest failover log (spec §7.4): ``uuid`` and
    ``branch_end``, the seqno where the next newer branch starts (null for the newest).

    Only the logs that opened streams, which silver's walk rolls back by: the live documents
    bronze implies and the rows found rolled back are judged against the history silver was
    sent. What the cluster holds now (the failover logs a session ends with) is
    :func:`cluster_branches`, and ``on_cluster_branch`` alone judges silver against it, so a
    missed rollback fails that one check, saying so, and not every count of the vbucket."""
    logs = (
        frames.where(F.col("opens_stream") & F.col("failover_log").isNotNull())
        .groupBy("vbucket")
        .agg(F.max_by(F.col("failover_log"), _position()).alias("log"))
    )
    entries = F.transform(
        "log",
        lambda e, i: F.struct(
            e["vb_uuid"].alias("uuid"),
            F.when(i > 0, F.element_at(F.col("log"), i)["seqno"]).alias("branch_end"),
        ),
    )
    return logs.select("vbucket", F.explode(entries).alias("b")).select(
        "vbucket", F.col("b.uuid").alias("uuid"), F.col("b.branch_end").alias("branch_end")
    )


def rollbacks(frames: DataFrame) -> DataFrame:
    """Rollback responses (status 0x23): vbucket, where in its history, and the seqno R
    (``rb_vbucket``, ``rb_position``, ``rb_seqno``)."""
    return frames.where(F.col("is_rollback")).select(
        F.col("vbucket").alias("rb_vbucket"),
        _position().alias("rb_position"),
        F.col("rollback_seqno").alias("rb_seqno"),
    )


def with_branch(
    rows: DataFrame, branches: DataFrame, *, vbucket: str, uuid: str, seqno: str
) -> DataFrame:
    """``rows`` with ``dead_branch``: a change its vbucket's newest failover log no longer
    holds (its uuid is gone, or it lies above where its branch ended; spec §7.4). A row
    without a uuid is not judged."""
    b = branches.select(
        F.col("vbucket").alias("_b_vb"),
        F.col("uuid").alias("_b_uuid"),
        F.col("branch_end").alias("_b_end"),
        F.lit(True).alias("_b_found"),
    )
    joined = rows.join(
        F.broadcast(b),
        (F.col(vbucket) == F.col("_b_vb")) & (F.col(uuid) == F.col("_b_uuid")),
        how="left",
    )
    dead = F.col(uuid).isNotNull() & (
        F.col("_b_found").isNull()
        | (F.col("_b_end").isNotNull() & (F.col(seqno) > F.col("_b_end")))
    )
    return joined.withColumn("dead_branch", dead).drop("_b_vb", "_b_uuid", "_b_end", "_b_found")


def split_history(
    items: DataFrame, branches: DataFrame, rolled: DataFrame
) -> tuple[DataFrame, DataFrame]:
    """``items`` (frames with a seqno) as (alive, dead): dead when a rollback response that
    came later in the vbucket's history has a lower seqno (spec §7.5), or when the newest
    failover log no longer holds their branch."""
    later_rollback = (
        (F.col("vbucket") == F.col("rb_vbucket"))
        & (F.col("rb_position") > _position())
        & (F.col("seqno") > F.col("rb_seqno"))
    )
    rb = F.broadcast(rolled)
    removed = items.join(rb, later_rollback, how="left_semi")
    kept = with_branch(
        items.join(rb, later_rollback, how="left_anti"),
        branches,
        vbucket="vbucket",
        uuid="in_vb_uuid",
        seqno="seqno",
    )
    alive = kept.where(~F.col("dead_branch")).drop("dead_branch")
    dead = removed.unionByName(kept.where(F.col("dead_branch")).drop("dead_branch"))
    return alive, dead


def dead_changes(alive: DataFrame, dead: DataFrame) -> DataFrame:
    """(vbucket, vb uuid, seqno) of data events that are dead and were not sent again."""
    keys = ["vbucket", "in_vb_uuid", "seqno"]
    gone = dead.where(F.col("op").isin(*DATA_OPS)).select(*keys).distinct()
    return gone.join(alive.select(*keys), on=keys, how="left_anti")


def committed_items(items: DataFrame, snaps: DataFrame) -> DataFrame:
    """``items`` of committed snapshots (the consumer rule, spec §6.3)."""
    done = snaps.where(F.col("committed")).select(
        "session_id", "vbucket", "stream_no", "snapshot_no"
    )
    return items.join(
        done, on=["session_id", "vbucket", "stream_no", "snapshot_no"], how="left_semi"
    )


def history_items(frames: DataFrame) -> DataFrame:
    """The data and system events of the streams (what silver's state is made of)."""
    return frames.where(F.col("op").isin(*DATA_OPS, "system_event"))


def collection_cuts(items: DataFrame) -> DataFrame:
    """Per (collection, vbucket): ``dropped`` (a drop arrived: every change of the collection
    in the vbucket is gone, later ones are ignored) and ``flush_seqno`` (a repeated create at
    a new seqno: changes below it are gone, spec §6.7)."""
    events = items.where(F.col("op") == "system_event").withColumn(
        "cid", F.coalesce(F.col("collection_id"), F.lit(0))
    )
    creates = F.when(F.col("event") == "create_collection", F.col("seqno"))
    cuts = events.groupBy("cid", "vbucket").agg(
        F.max(F.col("event") == "drop_collection").alias("dropped"),
        F.min(creates).alias("first_create"),
        F.max(creates).alias("last_create"),
    )
    return cuts.select(
        "cid",
        "vbucket",
        F.coalesce(F.col("dropped"), F.lit(False)).alias("dropped"),
        F.when(F.col("last_create") > F.col("first_create"), F.col("last_create")).alias(
            "flush_seqno"
        ),
    )


def checksum(key: Column, seqno: Column, where: Column | None = None) -> Column:
    """An order-independent checksum over (key, seqno) pairs (of the rows ``where`` holds),
    as BIGINT."""
    hashed = F.xxhash64(key, seqno).cast("decimal(20,0)")
    total = F.sum(hashed if where is None else F.when(where, hashed))
    return F.pmod(F.coalesce(total, F.lit(0)), F.lit(CHECKSUM_MODULUS)).cast("long")


def live(deleted: Column, expiry: Column) -> Column:
    """The silver view's rule: not deleted, and no expiry or one still ahead."""
    return ~deleted & ((expiry == 0) | (expiry > F.unix_timestamp()))


def bronze_live_documents(alive: DataFrame, cuts: DataFrame) -> DataFrame:
    """The live documents bronze implies, computed without silver: per (collection, key) the
    newest surviving committed change, minus drops and flushes, that is a mutation whose
    expiry is not past (``collection_id``, ``key`` as text, ``seqno``)."""
    changes = (
        alive.where(F.col("op").isin(*DATA_OPS))
        .withColumn("cid", F.coalesce(F.col("collection_id"), F.lit(0)))
        .join(F.broadcast(cuts), on=["cid", "vbucket"], how="left")
        .where(
            ~F.coalesce(F.col("dropped"), F.lit(False))
            & (F.col("flush_seqno").isNull() | (F.col("seqno") > F.col("flush_seqno")))
        )
    )
    newest = changes.groupBy("cid", "key").agg(
        F.max_by(F.struct("op", "expiration", "seqno"), F.struct("seqno", "rev_seqno")).alias(
            "change"
        )
    )
    deleted = F.col("change.op") != "mutation"
    expiry = F.coalesce(F.col("change.expiration"), F.lit(0))
    return newest.where(live(deleted, expiry)).select(
        F.col("cid").alias("collection_id"),
        F.col("key").cast("string").alias("key"),
        F.col("change.seqno").alias("seqno"),
    )


# --- the other metric frames --------------------------------------------------------------


def cluster_branches(base: DataFrame) -> DataFrame:
    """Per vbucket, the cluster's history as the captures last recorded it: ``log``, the
    newest failover log (of a stream request's success, or of a DCP_GET_FAILOVER_LOG reply,
    newest first), ``log_session`` the session it came from, and ``high``, the newest high
    seqno recorded (GET_ALL_VB_SEQNOS) in that session or a later one (null when none).

    "That session or later", not "after the log": a session records its high seqnos just
    before its failover logs (the capture agent's last step), and both say what the node held
    as the session ended. A high seqno of an older session may predate a failover the log
    shows, so it bounds nothing."""
    session = F.struct("session_started_at", "session_id")
    op, ok = F.col("op"), F.col("status") == 0
    logs = (
        base.where(
            op.isin("stream_request_response", "failover_log_response")
            & ok
            & F.col("failover_log").isNotNull()
        )
        .groupBy("vbucket")
        .agg(
            F.max_by(
                F.struct(F.col("failover_log").alias("log"), session.alias("at")), _position()
            ).alias("newest")
        )
        .select("vbucket", F.col("newest.log").alias("log"), F.col("newest.at").alias("log_at"))
    )
    highs = (
        base.where((op == "vb_seqnos_response") & ok & F.col("high_seqnos").isNotNull())
        .select(_position().alias("p"), session.alias("at"), F.explode("high_seqnos").alias("h"))
        .groupBy(F.col("h.vbucket").alias("h_vbucket"))
        .agg(F.max_by(F.struct(F.col("h.seqno").alias("seqno"), "at"), "p").alias("high"))
    )
    joined = logs.join(highs, logs["vbucket"] == highs["h_vbucket"], how="left")
    return joined.select(
        "vbucket",
        "log",
        F.col("log_at.session_id").alias("log_session"),
        F.when(F.col("high.at") >= F.col("log_at"), F.col("high.seqno")).alias("high"),
    )


def on_branch(states: DataFrame, cluster: DataFrame) -> DataFrame:
    """Per vbucket of silver's stream state whose cluster history the captures recorded
    (:func:`cluster_branches`): ``on_cluster_branch``, whether silver's position lies on the
    cluster's current branch, and ``cluster_branch_detail``, why not.

    Silver's branch is the uuid its consistent seqno belongs to: the newest entry of silver's
    failover log at or below it (the uuid a consumer resuming there asks with; after a
    rollback it may be older than ``vb_uuid``). That uuid must be in the cluster's newest failover
    log, and the seqno not past where that branch ends: the start of the next newer branch,
    or for the newest branch the high seqno recorded (none recorded: no end known). A vbucket
    without a uuid in silver, or absent from ``cluster``, is not judged (null)."""
    seqno = F.col("consistent_seqno")
    at_or_below = F.filter(F.col("failover_log"), lambda e: e["seqno"] <= seqno)
    silver_uuid = F.coalesce(F.try_element_at(at_or_below, F.lit(1))["vb_uuid"], F.col("vb_uuid"))
    positions = F.transform(F.col("log"), lambda e, i: F.struct(e.alias("e"), i.alias("i")))
    found = F.try_element_at(
        F.filter(positions, lambda p: p["e"]["vb_uuid"] == F.col("s_uuid")), F.lit(1)
    )
    # element_at is 1-based: element i is the entry just newer than entry i (0-based)
    newer_start = F.element_at(F.col("log"), F.col("found.i"))["seqno"]
    branch_end = F.when(F.col("found.i") > 0, newer_start).otherwise(F.col("high"))
    c = cluster.withColumnRenamed("vbucket", "c_vbucket")
    joined = (
        states.select("vbucket", seqno, silver_uuid.alias("s_uuid"))
        .where(F.col("s_uuid").isNotNull())
        .join(c, F.col("vbucket") == F.col("c_vbucket"), how="inner")
        .select("*", found.alias("found"), branch_end.alias("branch_end"))
    )
    log_text = F.array_join(
        F.transform(F.col("log"), lambda e: F.concat(e["vb_uuid"], F.lit("@"), e["seqno"])), ", "
    )
    silver_at = F.concat(
        F.lit("silver at seqno "), seqno, F.lit(" of vb uuid "), F.col("s_uuid"), F.lit("; ")
    )
    log_note = F.concat(
        F.lit("newest failover log, session "),
        F.col("log_session"),
        F.lit(": ["),
        log_text,
        F.lit("])"),
    )
    where_it_ends = F.when(
        F.col("found.i") > 0, F.concat(F.lit(" ended at seqno "), F.col("branch_end"), F.lit(" ("))
    ).otherwise(F.concat(F.lit(" is at seqno "), F.col("branch_end"), F.lit(" (its high seqno; ")))
    ok = F.col("found").isNotNull() & (
        F.col("branch_end").isNull() | (seqno <= F.col("branch_end"))
    )
    detail = F.when(
        F.col("found").isNull(),
        F.concat(silver_at, F.lit("the cluster no longer holds that branch ("), log_note),
    ).when(
        ~ok,
        F.concat(
            silver_at, F.lit("the cluster's branch "), F.col("s_uuid"), where_it_ends, log_note
        ),
    )
    return joined.select(
        "vbucket", ok.alias("on_cluster_branch"), detail.alias("cluster_branch_detail")
    )


def coverage_metrics(
    streams: DataFrame,
    states: DataFrame,
    silver_rows: DataFrame,
    branches: DataFrame,
    dead_changes: DataFrame,
    cluster: DataFrame,
) -> DataFrame:
    """The ``stream_coverage`` metric frame: one row per vbucket of bronze.

    ``streams`` is :func:`stream_metrics`; ``states`` silver's ``__stream_state``;
    ``silver_rows`` (``_vbucket``, ``_vb_uuid``, ``_seqno``, ``key``, ``table``) every row of
    the bucket's collection tables, tombstones included; ``dead_changes`` the (vbucket, vb
    uuid, seqno) of bronze changes a rollback or failover removed and nothing re-sent.
    A silver row is rolled back when its branch is gone from the newest failover log or it
    came from such a change. ``cluster`` (:func:`cluster_branches`): what the captures say the
    cluster's history is now, which silver's position must lie on (:func:`on_branch`).
    """
    rows = with_branch(silver_rows, branches, vbucket="_vbucket", uuid="_vb_uuid", seqno="_seqno")
    dead = dead_changes.select(
        F.col("vbucket").alias("_d_vb"),
        F.col("in_vb_uuid").alias("_d_uuid"),
        F.col("seqno").alias("_d_seqno"),
        F.lit(True).alias("dead_change"),
    )
    match = (
        (F.col("_vbucket") == F.col("_d_vb"))
        & (F.col("_vb_uuid") == F.col("_d_uuid"))
        & (F.col("_seqno") == F.col("_d_seqno"))
    )
    rolled = (
        rows.join(dead, match, how="left")
        .where(F.col("dead_branch") | F.coalesce(F.col("dead_change"), F.lit(False)))
        .select(
            F.col("_vbucket").alias("vbucket"),
            F.col("_seqno").alias("rolled_seqno"),
            F.concat(
                F.col("table"),
                F.lit(" key "),
                F.col("key"),
                F.lit(" seqno "),
                F.col("_seqno"),
                F.lit(" of vb uuid "),
                F.col("_vb_uuid"),
            ).alias("rolled"),
        )
    )
    # one row per vbucket from four sources: a union and one aggregation
    latest = streams.where(F.col("latest")).select(
        "vbucket", "session_id", "bounded", "requested_end", "producer_high", "complete_end"
    )
    parts = (
        latest.unionByName(
            states.select("vbucket", "consistent_seqno", "last_applied_seqno"),
            allowMissingColumns=True,
        )
        .unionByName(rolled, allowMissingColumns=True)
        .unionByName(on_branch(states, cluster), allowMissingColumns=True)
    )
    grouped = parts.groupBy("vbucket").agg(
        F.max(F.col("session_id")).alias("latest_session"),
        F.max(F.col("bounded")).alias("bounded"),
        F.max(F.col("requested_end")).alias("requested_end"),
        F.max(F.col("producer_high")).alias("producer_high"),
        F.max(F.col("complete_end")).alias("complete_end"),
        F.max(F.col("consistent_seqno")).alias("consistent_seqno"),
        F.max(F.col("last_applied_seqno")).alias("last_applied_seqno"),
        F.count(F.col("rolled")).alias("rolled_back_rows"),
        F.min_by(F.col("rolled"), F.col("rolled_seqno")).alias("rolled_back_detail"),
        F.min(F.col("on_cluster_branch")).alias("on_cluster_branch"),
        F.max(F.col("cluster_branch_detail")).alias("cluster_branch_detail"),
    )
    zero = F.lit(0)
    return grouped.where(F.col("latest_session").isNotNull()).select(
        F.concat(F.lit("vb "), F.col("vbucket")).alias("where"),
        "vbucket",
        "latest_session",
        "bounded",
        "requested_end",
        "producer_high",
        F.coalesce(F.col("complete_end"), zero).alias("complete_end"),
        F.coalesce(F.col("consistent_seqno"), zero).alias("applied_consistent"),
        F.coalesce(F.col("last_applied_seqno"), zero).alias("applied_last"),
        "rolled_back_rows",
        "rolled_back_detail",
        "on_cluster_branch",
        "cluster_branch_detail",
    )


def reconciliation_metrics(
    bronze_live: DataFrame,
    silver_live: DataFrame,
    silver_rows: DataFrame,
    cuts: DataFrame,
    names: DataFrame,
) -> DataFrame:
    """The ``silver_reconciliation`` metric frame: one row per collection id (of bronze, of
    silver's rows or of its registry).

    ``bronze_live`` is :func:`bronze_live_documents`; ``silver_live`` the rows of the user
    views (``_collection_id``, ``key``, ``_seqno``, ``_expiry``, ``table``); ``silver_rows``
    every row of the ``_all`` tables; ``cuts`` :func:`collection_cuts`; ``names``
    (``collection_id``, ``name``) for the report. One query: the views and the bronze side
    see the same clock.
    """
    drops = cuts.where(F.col("dropped")).select(
        F.col("cid").alias("_c_cid"), F.col("vbucket").alias("_c_vb")
    )
    in_dropped = silver_rows.join(
        F.broadcast(drops),
        (F.col("_collection_id") == F.col("_c_cid")) & (F.col("_vbucket") == F.col("_c_vb")),
        how="left_semi",
    )
    # the three sides, tagged, in one union and one aggregation per collection: no joins
    parts = (
        bronze_live.select("collection_id", "key", "seqno", F.lit("bronze").alias("side"))
        .unionByName(
            silver_live.select(
                F.col("_collection_id").alias("collection_id"),
                "key",
                F.col("_seqno").alias("seqno"),
                F.col("_expiry").alias("expiry"),
                "table",
                F.lit("silver").alias("side"),
            ),
            allowMissingColumns=True,
        )
        .unionByName(
            in_dropped.select(
                F.col("_collection_id").alias("collection_id"),
                "key",
                "table",
                F.col("_vbucket").alias("vbucket"),
                F.lit("dropped").alias("side"),
            ),
            allowMissingColumns=True,
        )
        .unionByName(
            names.select("collection_id", F.lit("known").alias("side")), allowMissingColumns=True
        )  # a collection with no live documents too
    )
    side = F.col("side")
    bronze, silver, dropped = side == "bronze", side == "silver", side == "dropped"
    expired = silver & (F.col("expiry") > 0) & (F.col("expiry") <= F.unix_timestamp())
    where_key = F.concat(F.col("table"), F.lit(" key "), F.col("key"))
    grouped = parts.groupBy("collection_id").agg(
        F.count(F.when(bronze, 1)).alias("bronze_live"),
        checksum(F.col("key"), F.col("seqno"), bronze).alias("bronze_checksum"),
        F.count(F.when(silver, 1)).alias("silver_live"),
        checksum(F.col("key"), F.col("seqno"), silver).alias("silver_checksum"),
        F.count(F.when(expired, 1)).alias("expired_live_rows"),
        F.min_by(where_key, F.when(expired, F.col("key"))).alias("expired_detail"),
        F.min(F.when(silver | dropped, F.col("table"))).alias("silver_table"),
        F.count(F.when(dropped, 1)).alias("dropped_rows"),
        F.min_by(
            F.concat(where_key, F.lit(" in vb "), F.col("vbucket")), F.when(dropped, F.col("key"))
        ).alias("dropped_detail"),
    )
    named = grouped.join(F.broadcast(names), on="collection_id", how="left")
    cid_hex = F.lower(F.hex(F.col("collection_id")))
    return named.select(
        F.concat(
            F.lit("collection 0x"),
            cid_hex,
            F.lit(" "),
            F.coalesce(F.col("name"), F.col("silver_table"), F.lit("(no silver table)")),
        ).alias("where"),
        "collection_id",
        F.col("name").alias("collection"),
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


def file_metrics(base: DataFrame, quarantine: DataFrame, ingest_log: DataFrame) -> DataFrame:
    """The ``bronze_integrity`` metric frame: one row per capture file.

    ``malformed`` counts quarantine records other than cut tails; a cut tail
    (``truncated``) is normal only at the end of its session's last file, where a dropped
    connection leaves it (capture format), so ``truncated_mid_session`` counts the others.
    """
    session = Window.partitionBy("session_id")
    logged = ingest_log.where(F.col("status") == "ingested").select(
        "file",
        "session_id",
        "file_sequence",
        (F.col("file_sequence") == F.max("file_sequence").over(session)).alias("last_of_session"),
    )
    unknown = F.col("unknown_opcode")
    frames = base.select(
        "file",
        F.lit(1).alias("frame"),
        F.size("null_columns").alias("nulls"),
        "null_columns",
        F.when(unknown, F.concat(F.col("op"), F.lit(" 0x"), F.lower(F.hex("opcode")))).alias(
            "unknown"
        ),
    )
    quarantined = quarantine.select(
        "file",
        F.coalesce(F.col("truncated"), F.lit(False)).alias("truncated"),
        F.concat(F.lit("offset "), F.col("offset"), F.lit(": "), F.col("reason")).alias("bad"),
        F.col("offset").alias("q_offset"),
    )
    parts = logged.unionByName(frames, allowMissingColumns=True).unionByName(
        quarantined, allowMissingColumns=True
    )
    cut, bad = F.col("truncated"), F.col("truncated") == F.lit(False)
    grouped = parts.groupBy("file").agg(
        F.max("session_id").alias("session_id"),
        F.max("file_sequence").alias("file_sequence"),
        F.max("last_of_session").alias("last_of_session"),
        F.count(F.col("frame")).alias("frames"),
        F.coalesce(F.sum("nulls"), F.lit(0)).cast("long").alias("null_required"),
        F.array_distinct(F.flatten(F.collect_set("null_columns"))).alias("null_columns"),
        F.count(F.col("unknown")).alias("unknown_opcodes"),
        F.array_sort(F.collect_set("unknown")).alias("unknown"),
        F.count(F.when(bad, 1)).alias("malformed"),
        F.min_by(F.col("bad"), F.when(bad, F.col("q_offset"))).alias("malformed_detail"),
        F.count(F.when(cut, 1)).alias("truncated"),
        F.min(F.when(cut, F.col("q_offset"))).alias("truncated_offset"),
    )
    mid_session = F.when(
        ~F.coalesce(F.col("last_of_session"), F.lit(False)), F.col("truncated")
    ).otherwise(F.lit(0))
    return grouped.select(
        F.concat(
            _basename(F.col("file")),
            F.lit(" (session "),
            F.coalesce(F.col("session_id"), F.lit("?")),
            F.lit(" #"),
            F.coalesce(F.col("file_sequence").cast("string"), F.lit("?")),
            F.lit(")"),
        ).alias("where"),
        "file",
        "session_id",
        "file_sequence",
        "frames",
        "null_required",
        F.when(F.col("null_required") > 0, F.array_join("null_columns", ", ")).alias("null_detail"),
        "unknown_opcodes",
        F.when(F.col("unknown_opcodes") > 0, F.array_join("unknown", ", ")).alias("unknown_detail"),
        "malformed",
        "malformed_detail",
        "truncated",
        mid_session.alias("truncated_mid_session"),
        F.when(
            mid_session > 0,
            F.concat(
                F.lit("cut tail at offset "),
                F.col("truncated_offset"),
                F.lit(", but later files of the session exist"),
            ),
        ).alias("truncated_detail"),
    )
