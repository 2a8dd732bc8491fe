"""Where ``dcp-cdc status`` finds each stage's positions, cheaply: only small tables and
metadata, never a scan of bronze's events or of silver's collection tables.

- silver: its stream state (one row per vbucket): the consistent seqno, the last save (the
  last apply that moved it), open snapshots, and the CAS of the newest change applied in
  each vbucket (``last_cas``, whose time is the ``_modified_at`` of silver's newest row);
- bronze: the ingest log's rows of ingested files, per capture session the end state of its
  last file (the end seqno of the last snapshot marker of each vbucket; a session's end
  state carries those of its earlier files), the highest per vbucket over sessions;
- quality: the results of the newest run (its rows alone);
- the landing: the files a missing earlier file of their session holds back (the landing
  listed, the header of each file not ingested read: what ingest would plan);
- capture and cluster: the agent's checkpoint (a small JSON document, local or in an object
  store) and the data nodes' high seqnos, asked with the capture section's settings
  (:mod:`pipelines.status.agent_side`, no Spark).

The stages are read from silver back to the cluster: while the pipeline runs, a stage read
later can only have moved further, so a stage never reads ahead of the one before it because
of the order of the reads.

Bronze's measure counts a snapshot as in bronze once its marker is: a snapshot whose last
changes are still in files not ingested counts in whole, so bronze's lag behind the capture
is a lower bound (by at most one snapshot per vbucket, while a file ends inside one). After
a failover that rolled a vbucket back, bronze's highest snapshot end stays on the old branch
until the new one passes it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.protocol import cas_time
from pipelines import tables
from pipelines.bronze import store
from pipelines.bronze.held_back import held_back_now
from pipelines.bronze.plan import HeldBack
from pipelines.spark_session import session_for
from pipelines.status.agent_side import capture_stage, cluster_stage, not_asked
from pipelines.status.lag import BucketStatus, QualityResult, Stage, snapshot_ends
from pipelines.tables import BucketTables


def _micros(value: int | None) -> dt.datetime | None:
    """Microseconds since the epoch (``unix_micros``: no session time zone in the way)."""
    if value is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=value)


def silver_stage(spark: SparkSession, names: BucketTables) -> tuple[Stage, dt.datetime | None]:
    """Silver's consistent seqno per vbucket, its last apply, and the time of the newest
    change it applied (by CAS)."""
    if not spark.catalog.tableExists(names.stream_state):
        return Stage("silver", None, note="no silver stream state yet (dcp-cdc apply)"), None
    rows = (
        spark.table(names.stream_state)
        .select(
            "vbucket",
            "consistent_seqno",
            F.col("open_snapshot_start").isNotNull().alias("open"),
            F.unix_micros("updated_at").alias("updated_us"),
            F.get_json_object("state", "$.last_cas").alias("last_cas"),
        )
        .collect()
    )
    positions = {r["vbucket"]: r["consistent_seqno"] or 0 for r in rows}
    saved = max((r["updated_us"] for r in rows if r["updated_us"] is not None), default=None)
    newest = max((int(r["last_cas"]) for r in rows if r["last_cas"]), default=0)
    open_snapshots = sum(1 for r in rows if r["open"])
    note = None
    if open_snapshots:
        note = (
            f"{open_snapshots} vbucket{'s' if open_snapshots > 1 else ''} inside a snapshot "
            "not yet complete in bronze (applied once it is)"
        )
    return Stage("silver", positions, _micros(saved), note), cas_time(newest)


def bronze_stage(spark: SparkSession, names: BucketTables) -> Stage:
    """Bronze's snapshot ends per vbucket and its last ingest, from the ingest log."""
    if not spark.catalog.tableExists(names.ingest_log):
        return Stage("bronze", None, note="no bronze tables yet (dcp-cdc ingest)")
    sessions = (
        spark.table(names.ingest_log)
        .where(F.col("status") == "ingested")
        .groupBy("session_id")
        .agg(
            F.max_by("end_state", "file_sequence").alias("end_state"),
            F.max(F.unix_micros("logged_at")).alias("logged_us"),
        )
        .collect()
    )
    positions = snapshot_ends([r["end_state"] for r in sessions])
    logged = max((r["logged_us"] for r in sessions if r["logged_us"] is not None), default=None)
    note = None if sessions else "no capture file ingested yet"
    return Stage("bronze", positions, _micros(logged), note)


def held_back(
    spark: SparkSession, config: AppConfig, bucket: BucketConfig, names: BucketTables
) -> tuple[HeldBack, ...]:
    """The landing's files a missing earlier file of their session holds back: the ingest
    log against the landing listed (the header of each file not ingested is read)."""
    if not spark.catalog.tableExists(names.ingest_log):
        return ()
    state = store.read_log(spark, names.ingest_log)
    return tuple(held_back_now(config, bucket, state))


def last_quality(
    spark: SparkSession, config: AppConfig, names: BucketTables
) -> QualityResult | None:
    """The newest quality run's result (its rows only), or None before the first check."""
    if not spark.catalog.tableExists(names.results):
        return None
    results = spark.table(names.results)
    newest = (
        results.select("run_id", F.unix_micros("checked_at").alias("checked_us"))
        .orderBy(F.col("checked_us").desc(), F.col("run_id").desc())
        .limit(1)
        .collect()
    )
    if not newest:
        return None
    run_id = newest[0]["run_id"]

    def failed(severity: str) -> Any:
        return F.sum((~F.col("success") & (F.col("severity") == severity)).cast("int"))

    counts = (
        results.where(F.col("run_id") == run_id)
        .agg(
            F.count(F.lit(1)).alias("expectations"),
            failed("error").alias("errors"),
            failed("warn").alias("warnings"),
        )
        .collect()[0]
    )
    checked_at = _micros(newest[0]["checked_us"])
    assert checked_at is not None  # every result row has its run's time
    return QualityResult(
        run_id=run_id,
        checked_at=checked_at,
        expectations=counts["expectations"],
        failed_errors=counts["errors"] or 0,
        failed_warnings=counts["warnings"] or 0,
        report=tables.report_page(config, names.bucket),
    )


def bucket_status(
    spark: SparkSession, config: AppConfig, bucket: BucketConfig, *, cluster: bool = True
) -> BucketStatus:
    """One bucket's status, read from silver back to the cluster (``cluster``: ask it)."""
    names = BucketTables(bucket.name)
    silver, newest = silver_stage(spark, names)
    bronze = bronze_stage(spark, names)
    quality = last_quality(spark, config, names)
    held = held_back(spark, config, bucket, names)
    capture = capture_stage(config, bucket)
    asked = cluster_stage(config, bucket) if cluster else not_asked("--no-cluster")
    return BucketStatus(bucket.name, (asked, capture, bronze, silver), newest, quality, held)


def run(
    config: AppConfig,
    bucket: str | None = None,
    *,
    cluster: bool = True,
    spark: SparkSession | None = None,
) -> list[BucketStatus]:
    """Every configured bucket's status (or the one named)."""
    buckets = config.bucket(bucket)
    session = spark or session_for(config, "dcp-cdc-status")
    return [bucket_status(session, config, b, cluster=cluster) for b in buckets]
