"""Maintenance of a bucket's tables: OPTIMIZE, VACUUM, tombstone purge, quality retention.

Run daily by the ``dcp_cdc_maintenance`` DAG, or by hand (``dcp-cdc maintain``,
``python -m pipelines.maintenance.job --config F [--bucket B]``). Per bucket, in this order:

1. **tombstone purge**: deletion and expiration tombstones older than
   ``silver.tombstone_retention_hours`` leave the silver ``_all`` tables
   (:func:`pipelines.silver.job.purge_tombstones`);
2. **quality retention**: rows of ``quality.<bucket>_results`` older than
   ``quality.results_retention_days`` are deleted
   (:func:`pipelines.quality.job.prune_results`);
3. **OPTIMIZE** every Delta table of the bucket: small files are compacted; the
   liquid-clustered tables (bronze events by ``(vbucket, by_seqno)``, silver by
   ``(_vbucket, key)``) are clustered incrementally, which is what a Z-order would give them
   (and Delta refuses ``ZORDER BY`` on a clustered table);
4. **VACUUM** every table with ``maintenance.vacuum_retention_hours``.

Deletes come first so that OPTIMIZE rewrites the files they touched (their deletion vectors
are applied) and VACUUM can then remove what both left behind, on the same day.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.logs import log_context
from pipelines.lake import delta_io
from pipelines.lake.spark_session import session_for
from pipelines.quality.job import prune_results
from pipelines.silver.job import purge_tombstones
from pipelines.tables import BucketTables, all_rows, history

log = logging.getLogger("dcp_cdc.maintenance")
DELTA_MIN_SAFE_RETENTION_HOURS = 168
"""``delta.deletedFileRetentionDuration``'s default: VACUUM refuses less unless told."""


@dataclass
class MaintenanceSummary:
    bucket: str
    purged: dict[str, int] = field(default_factory=dict)  # silver table -> tombstones removed
    quality_rows_deleted: int = 0
    optimized: dict[str, tuple[int, int]] = field(default_factory=dict)  # files (removed, added)
    vacuumed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def render(self) -> str:
        removed = sum(r for r, _ in self.optimized.values())
        added = sum(a for _, a in self.optimized.values())
        lines = [
            f"maintenance of bucket {self.bucket!r}: {sum(self.purged.values())} tombstones "
            f"purged, {self.quality_rows_deleted} old quality results deleted, "
            f"{len(self.optimized)} tables with several files optimized ({removed} files "
            f"compacted into {added}), "
            f"{len(self.vacuumed)} vacuumed, {self.seconds:.1f} s"
        ]
        lines += [f"  {t}: {n} tombstones purged" for t, n in sorted(self.purged.items()) if n]
        return "\n".join(lines)


def bucket_tables(spark: SparkSession, bucket: str) -> list[str]:
    """Every Delta table of ``bucket`` that exists: bronze, silver (support tables, the live
    layer's pending table, and the ``_all`` and history tables of each collection not
    retired) and quality."""
    tables = BucketTables(bucket)
    names = [*tables.bronze.values(), *tables.silver_support, tables.pending]
    if spark.catalog.tableExists(tables.registry):
        live = spark.table(tables.registry).where("status != 'retired'")
        for r in sorted(live.select("table_name").collect()):
            names += [all_rows(r["table_name"]), history(r["table_name"])]
    names += [tables.results, tables.check_state, tables.check_columns]
    return [name for name in names if spark.catalog.tableExists(name)]


def optimize(spark: SparkSession, table: str) -> tuple[int, int]:
    """OPTIMIZE ``table``; (files removed, files added). An apply or ingest that commits
    while it compacts may win the race (the files it read were rewritten): it is tried again
    on the new version, like every other write (:func:`delta_io.with_retry`)."""
    rows = delta_io.with_retry(
        f"OPTIMIZE {table}", lambda: spark.sql(f"OPTIMIZE {table}").collect()
    )
    if not rows:
        return 0, 0
    metrics = rows[0]["metrics"]
    return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])


@contextmanager
def _retention_check(spark: SparkSession, *, enabled: bool) -> Iterator[None]:
    """Delta's refusal to VACUUM below its safe retention, off while the block runs when the
    configuration asks for less (readers and time travel older than that break)."""
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    if enabled:
        yield
        return
    with delta_io.session_conf(spark, {key: "false"}):
        yield


def maintain_bucket(
    spark: SparkSession, config: AppConfig, bucket: BucketConfig
) -> MaintenanceSummary:
    started = time.perf_counter()
    settings = config.maintenance
    summary = MaintenanceSummary(bucket.name)
    summary.purged = purge_tombstones(spark, config, bucket)
    summary.quality_rows_deleted = prune_results(spark, config, bucket)
    tables = bucket_tables(spark, bucket.name)
    if settings.optimize:
        for table in tables:
            # One file has nothing to compact, and Delta would still plan a job for it.
            if spark.sql(f"DESCRIBE DETAIL {table}").collect()[0]["numFiles"] > 1:
                summary.optimized[table] = optimize(spark, table)
    hours = settings.vacuum_retention_hours
    with _retention_check(spark, enabled=hours >= DELTA_MIN_SAFE_RETENTION_HOURS):
        for table in tables:
            spark.sql(f"VACUUM {table} RETAIN {hours} HOURS")
            summary.vacuumed.append(table)
    summary.seconds = time.perf_counter() - started
    log.info(summary.render())
    return summary


def run(
    config: AppConfig, bucket: str | None = None, *, spark: SparkSession | None = None
) -> list[MaintenanceSummary]:
    buckets = config.bucket(bucket)
    session = spark or session_for(config, "dcp-cdc-maintenance")
    summaries = []
    for b in buckets:
        with log_context(bucket=b.name):
            summaries.append(maintain_bucket(session, config, b))
    return summaries


# ``python -m pipelines.maintenance.job`` and ``spark-submit pipelines/maintenance/job.py``: the ``maintain`` verb of the command line
# (imported here only, so that the job module does not import the command line).
if __name__ == "__main__":
    from pipelines.app.cli import job_main

    raise SystemExit(job_main("maintain"))
