"""``dcp-cdc status``'s stages as the Spark catalog's queries compute them: the reference the
reader without a JVM (:mod:`pipelines.status.read`, delta-rs) is held to, written with Spark's
own functions (``max_by``, ``get_json_object``, ``unix_micros``) so that the two do not
share their arithmetic.
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
from pipelines.status.lag import QualityResult, Stage, snapshot_ends
from pipelines.tables import BucketTables


def _micros(value: int | None) -> dt.datetime | None:
    if value is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=value)


def silver_stage(spark: SparkSession, names: BucketTables) -> tuple[Stage, dt.datetime | None]:
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
    if not spark.catalog.tableExists(names.ingest_log):
        return ()
    state = store.read_log(spark, names.ingest_log)
    return tuple(held_back_now(config, bucket, state))


def last_quality(
    spark: SparkSession, config: AppConfig, names: BucketTables
) -> QualityResult | None:
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
    assert checked_at is not None
    return QualityResult(
        run_id=run_id,
        checked_at=checked_at,
        expectations=counts["expectations"],
        failed_errors=counts["errors"] or 0,
        failed_warnings=counts["warnings"] or 0,
        report=tables.report_page(config, names.bucket),
    )
