"""Which changes of bronze survive, and where the cluster's history stands: the branches of
the failover logs, rollbacks, collection drops and flushes, the live documents bronze
implies, and whether silver's position lies on the cluster's current branch (pure
DataFrame → DataFrame steps, no I/O).

They start from :func:`pipelines.quality.frames.stream_frames` (and
:func:`pipelines.quality.frames.base_frames` for the cluster's state). The rules are spec
§6.3 (committed snapshots), §6.7 (collections) and §7.4–§7.5 (failover log, rollback).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from dcp_cdc.events import (
    DATA_OPS,
    FailoverLogResponse,
    Mutation,
    StreamRequestResponse,
    SystemEvent,
    VbSeqnosResponse,
)
from pipelines.quality.frames import history_position


def latest_branches(frames: DataFrame, carried: DataFrame | None = None) -> DataFrame:
    """Per vbucket, the branches of its newest failover log (docs/protocol/dcp.md §7.4): ``uuid`` and
    ``branch_end``, the seqno where the next newer branch starts (null for the newest).

    Only the logs that opened streams, which silver's walk rolls back by: the live documents
    bronze implies and the rows found rolled back are judged against the history silver was
    sent. What the cluster holds now (the failover logs a session ends with) is
    :func:`cluster_branches`, and ``on_cluster_branch`` alone judges silver against it, so a
    missed rollback fails that one check, saying so, and not every count of the vbucket.
    ``carried``: the :func:`branch_logs` of frames not in ``frames``."""
    logs = branch_logs(frames)
    if carried is not None:
        logs = _newest_logs(logs.unionByName(carried))
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


def branch_logs(frames: DataFrame) -> DataFrame:
    """Per vbucket, the newest failover log that opened a stream in ``frames`` (``log``) and
    where (``p``): partial rows combine, the newer position wins."""
    return _newest_logs(
        frames.where(F.col("opens_stream") & F.col("failover_log").isNotNull()).select(
            "vbucket", F.col("failover_log").alias("log"), history_position().alias("p")
        )
    )


def _newest_logs(logs: DataFrame) -> DataFrame:
    return logs.groupBy("vbucket").agg(F.max_by("log", "p").alias("log"), F.max("p").alias("p"))


def rollbacks(frames: DataFrame) -> DataFrame:
    """Rollback responses (status 0x23): vbucket, where in its history, and the seqno R
    (``rb_vbucket``, ``rb_position``, ``rb_seqno``)."""
    return frames.where(F.col("is_rollback")).select(
        F.col("vbucket").alias("rb_vbucket"),
        history_position().alias("rb_position"),
        F.col("rollback_seqno").alias("rb_seqno"),
    )


def with_branch(
    rows: DataFrame, branches: DataFrame, *, vbucket: str, uuid: str, seqno: str
) -> DataFrame:
    """``rows`` with ``dead_branch``: a change its vbucket's newest failover log no longer
    holds (its uuid is gone, or it lies above where its branch ended; docs/protocol/dcp.md §7.4). A row
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
    came later in the vbucket's history has a lower seqno (docs/protocol/dcp.md §7.5), or when the newest
    failover log no longer holds their branch."""
    later_rollback = (
        (F.col("vbucket") == F.col("rb_vbucket"))
        & (F.col("rb_position") > history_position())
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
    """``items`` of committed snapshots (the consumer rule, docs/protocol/dcp.md §6.3)."""
    done = snaps.where(F.col("committed")).select(
        "session_id", "vbucket", "stream_no", "snapshot_no"
    )
    return items.join(
        done, on=["session_id", "vbucket", "stream_no", "snapshot_no"], how="left_semi"
    )


def history_items(frames: DataFrame) -> DataFrame:
    """The data and system events of the streams (what silver's state is made of)."""
    return frames.where(F.col("op").isin(*DATA_OPS, SystemEvent.op))


def collection_cuts(items: DataFrame, carried: DataFrame | None = None) -> DataFrame:
    """Per (collection, vbucket): ``dropped`` (a drop arrived: every change of the collection
    in the vbucket is gone, later ones are ignored) and ``flush_seqno`` (a repeated create at
    a new seqno: changes below it are gone, docs/protocol/dcp.md §6.7). ``carried``: the
    :func:`cut_parts` of system events not in ``items``."""
    parts = cut_parts(items)
    if carried is not None:
        parts = _combine_cuts(parts.unionByName(carried))
    return parts.select(
        "cid",
        "vbucket",
        F.coalesce(F.col("dropped"), F.lit(False)).alias("dropped"),
        F.when(F.col("last_create") > F.col("first_create"), F.col("last_create")).alias(
            "flush_seqno"
        ),
    )


def cut_parts(items: DataFrame) -> DataFrame:
    """Per (collection, vbucket) of the system events in ``items``: whether one is a drop, and
    the lowest and highest seqno of a create (partial rows combine)."""
    events = items.where(F.col("op") == SystemEvent.op).withColumn(
        "cid", F.coalesce(F.col("collection_id"), F.lit(0))
    )
    creates = F.when(F.col("event") == "create_collection", F.col("seqno"))
    return _combine_cuts(
        events.select(
            "cid",
            "vbucket",
            (F.col("event") == "drop_collection").alias("dropped"),
            creates.alias("first_create"),
            creates.alias("last_create"),
        )
    )


def _combine_cuts(parts: DataFrame) -> DataFrame:
    return parts.groupBy("cid", "vbucket").agg(
        F.max("dropped").alias("dropped"),
        F.min("first_create").alias("first_create"),
        F.max("last_create").alias("last_create"),
    )


def live(deleted: Column, expiry: Column) -> Column:
    """The silver view's rule: not deleted, and no expiry or one still ahead."""
    return ~deleted & ((expiry == 0) | (expiry > F.unix_timestamp()))


def bronze_live_documents(alive: DataFrame, cuts: DataFrame) -> DataFrame:
    """The live documents bronze implies, computed without silver: per (collection, key) the
    newest surviving committed change, minus drops and flushes, that is a mutation whose
    expiry is not past (``collection_id``, ``key`` as text, ``seqno``)."""
    return live_of(newest_changes(alive, cuts))


def newest_changes(alive: DataFrame, cuts: DataFrame) -> DataFrame:
    """Per (collection, key) of ``alive``'s data events, minus drops and flushes: the newest
    (``cid``, ``key`` as text, ``change``: ``op``, ``expiration``, ``seqno``)."""
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
    return newest.select("cid", F.col("key").cast("string").alias("key"), "change")


def live_of(newest: DataFrame) -> DataFrame:
    """The :func:`newest_changes` that are live documents: a mutation whose expiry is not
    past (``collection_id``, ``key``, ``seqno``)."""
    deleted = F.col("change.op") != Mutation.op
    expiry = F.coalesce(F.col("change.expiration"), F.lit(0))
    return newest.where(live(deleted, expiry)).select(
        F.col("cid").alias("collection_id"), "key", F.col("change.seqno").alias("seqno")
    )


def cluster_branches(base: DataFrame, carried: DataFrame | None = None) -> DataFrame:
    """Per vbucket, the cluster's history as the captures last recorded it: ``log``, the
    newest failover log (of a stream request's success, or of a DCP_GET_FAILOVER_LOG reply,
    newest first), ``log_session`` the session it came from, and ``high``, the newest high
    seqno recorded (GET_ALL_VB_SEQNOS) in that session or a later one (null when none).

    "That session or later", not "after the log": a session records its high seqnos just
    before its failover logs (the capture agent's last step), and both say what the node held
    as the session ended. A high seqno of an older session may predate a failover the log
    shows, so it bounds nothing. ``carried``: the :func:`cluster_parts` of frames not in
    ``base``."""
    parts = cluster_parts(base)
    if carried is not None:
        parts = _combine_cluster(parts.unionByName(carried))
    logs = parts.where(F.col("newest").isNotNull()).select(
        "vbucket", F.col("newest.log").alias("log"), F.col("newest.at").alias("log_at")
    )
    highs = parts.where(F.col("high").isNotNull()).select(
        F.col("vbucket").alias("h_vbucket"), "high"
    )
    joined = logs.join(highs, logs["vbucket"] == highs["h_vbucket"], how="left")
    return joined.select(
        "vbucket",
        "log",
        F.col("log_at.session_id").alias("log_session"),
        F.when(F.col("high.at") >= F.col("log_at"), F.col("high.seqno")).alias("high"),
    )


def cluster_parts(base: DataFrame) -> DataFrame:
    """Per vbucket of ``base``: the newest failover log recorded (``newest``: ``log``, the
    session ``at``, its position ``p``) and the newest high seqno (``high``: ``seqno``,
    ``at``, ``p``). Partial rows combine: the newer position wins."""
    session = F.struct("session_started_at", "session_id")
    op, ok = F.col("op"), F.col("status") == 0
    logs = base.where(
        op.isin(StreamRequestResponse.op, FailoverLogResponse.op)
        & ok
        & F.col("failover_log").isNotNull()
    ).select(
        "vbucket",
        F.struct(
            F.col("failover_log").alias("log"), session.alias("at"), history_position().alias("p")
        ).alias("newest"),
    )
    highs = (
        base.where((op == VbSeqnosResponse.op) & ok & F.col("high_seqnos").isNotNull())
        .select(
            history_position().alias("p"), session.alias("at"), F.explode("high_seqnos").alias("h")
        )
        .select(
            F.col("h.vbucket").alias("vbucket"),
            F.struct(F.col("h.seqno").alias("seqno"), "at", "p").alias("high"),
        )
    )
    return _combine_cluster(logs.unionByName(highs, allowMissingColumns=True))


def _combine_cluster(parts: DataFrame) -> DataFrame:
    return parts.groupBy("vbucket").agg(
        F.max_by("newest", "newest.p").alias("newest"), F.max_by("high", "high.p").alias("high")
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
