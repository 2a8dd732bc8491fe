"""The ``stream_coverage``, ``silver_reconciliation`` and ``bronze_integrity`` metric frames:
one row per vbucket, per collection and per capture file, each problem count with a
``*_detail`` text and a ``where`` label for the report (pure DataFrame → DataFrame steps, no
I/O).

They join what bronze implies (:mod:`pipelines.quality.branches`) with what silver holds;
the ``snapshot_completeness`` frame is :func:`pipelines.quality.streams.stream_metrics`.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines.quality.branches import on_branch, with_branch

CHECKSUM_MODULUS = 9223372036854775783  # the largest prime below 2^63: checksums stay BIGINT


def _basename(path: Column) -> Column:
    return F.element_at(F.split(path, "/"), -1)


def checksum(key: Column, seqno: Column, where: Column | None = None) -> Column:
    """An order-independent checksum over (key, seqno) pairs (of the rows ``where`` holds),
    as BIGINT."""
    hashed = F.xxhash64(key, seqno).cast("decimal(20,0)")
    total = F.sum(hashed if where is None else F.when(where, hashed))
    return F.pmod(F.coalesce(total, F.lit(0)), F.lit(CHECKSUM_MODULUS)).cast("long")


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


def file_parts(base: DataFrame, quarantine: DataFrame) -> DataFrame:
    """What ``base`` frames and ``quarantine`` records say of each capture file, aggregated
    per file: counts, the required columns found null and the unknown opcodes (sets), the
    first malformed record and the first cut tail. Partial rows of the same file combine
    (:func:`file_metrics`)."""
    unknown = F.col("unknown_opcode")
    frames = base.select(
        "file",
        F.lit(1).cast("long").alias("frames"),
        F.size("null_columns").cast("long").alias("null_required"),
        "null_columns",
        F.when(unknown, F.concat(F.col("op"), F.lit(" 0x"), F.lower(F.hex("opcode")))).alias(
            "unknown"
        ),
        unknown.cast("long").alias("unknown_opcodes"),
    )
    cut = F.coalesce(F.col("truncated"), F.lit(False))
    quarantined = quarantine.select(
        "file",
        F.when(cut, F.col("offset")).alias("truncated_offset"),
        F.when(~cut, F.struct(F.col("offset").alias("at"), F.col("reason"))).alias("bad"),
        cut.cast("long").alias("truncated"),
        (~cut).cast("long").alias("malformed"),
    )
    parts = frames.unionByName(quarantined, allowMissingColumns=True)
    return combine_files(
        parts.select(
            "*",
            F.when(F.col("unknown").isNotNull(), F.array("unknown")).alias("unknowns"),
            F.when(F.col("bad").isNotNull(), F.col("bad")).alias("first_bad"),
        ).drop("unknown", "bad")
    )


def combine_files(parts: DataFrame) -> DataFrame:
    return parts.groupBy("file").agg(
        *[
            F.coalesce(F.sum(c), F.lit(0)).cast("long").alias(c)
            for c in ("frames", "null_required", "unknown_opcodes", "truncated", "malformed")
        ],
        F.array_sort(F.array_distinct(F.flatten(F.collect_list("null_columns")))).alias(
            "null_columns"
        ),
        F.array_sort(F.array_distinct(F.flatten(F.collect_list("unknowns")))).alias("unknowns"),
        F.min("first_bad").alias("first_bad"),
        F.min("truncated_offset").alias("truncated_offset"),
    )


def file_metrics(parts: DataFrame, ingest_log: DataFrame) -> DataFrame:
    """The ``bronze_integrity`` metric frame: one row per capture file, from its
    :func:`file_parts` (one row per file, or partial rows of it) and the ingest log.

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
    combined = combine_files(parts)
    grouped = combined.join(logged, on="file", how="full").select(
        "file",
        "session_id",
        "file_sequence",
        "last_of_session",
        *[F.coalesce(c, F.lit(0)).cast("long").alias(c) for c in ("frames", "null_required")],
        F.coalesce("null_columns", F.array().cast("array<string>")).alias("null_columns"),
        F.coalesce(F.col("unknown_opcodes"), F.lit(0)).cast("long").alias("unknown_opcodes"),
        F.coalesce("unknowns", F.array().cast("array<string>")).alias("unknown"),
        F.coalesce(F.col("malformed"), F.lit(0)).cast("long").alias("malformed"),
        F.concat(
            F.lit("offset "), F.col("first_bad.at"), F.lit(": "), F.col("first_bad.reason")
        ).alias("malformed_detail"),
        F.coalesce(F.col("truncated"), F.lit(0)).cast("long").alias("truncated"),
        "truncated_offset",
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
