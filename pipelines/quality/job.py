"""The quality job: five Great Expectations suites over a bucket's bronze and silver tables
and its landing.

Per bucket and run:

1. bronze events are read once and placed in their streams and snapshots; compact metric
   frames are computed from that (:mod:`pipelines.quality.frames`, ``streams``, ``branches``,
   ``metrics``): one row per stream, vbucket, collection and capture file. Silver's tables
   are read for coverage and reconciliation; the state bronze implies is computed without
   silver. The landing is listed for the files a missing one holds back
   (:func:`pipelines.bronze.held_back.held_back_now`), one row per capture session;
2. Great Expectations validates each suite's frame (:mod:`pipelines.quality.validate`) and
   writes its Data Docs;
3. the results are appended to ``quality.<bucket>_results`` (one row per expectation), and a
   one-page summary is written next to the Data Docs, under
   ``<warehouse>/quality/<bucket>/``.

The catalog is asked for the tables a check reads and writes once, at its start, with their
versions (:func:`pinned_versions`; a call or two per database): the reads take the tables'
locations from that (:func:`~pipelines.lake.table_entries.known`).

A failed expectation of severity ``error`` fails the run (``main`` exits 1 naming it);
``warn`` is reported only. ``python -m pipelines.quality.job --config F [--bucket B]``, or
``dcp-cdc check``.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, BucketConfig, is_uri
from dcp_cdc.logs import log_context
from pipelines import schemas, tables
from pipelines.bronze import store
from pipelines.bronze.held_back import held_back_now
from pipelines.bronze.plan import LogState
from pipelines.errors import DataQualityError, FullCheckNeeded, NotOnDriver
from pipelines.lake import delta_io, delta_rs, table_entries
from pipelines.lake.spark_session import session_for
from pipelines.observe.batch_metrics import RunMetrics, pushed
from pipelines.quality import carry
from pipelines.quality import report as reporting
from pipelines.quality.compute import Metrics, compute
from pipelines.quality.report import OpenSnapshot, QualityReport
from pipelines.quality.small import carried as columnar_state
from pipelines.quality.small.columnar import compute_columnar
from pipelines.quality.small.compute import compute_small
from pipelines.quality.small.incremental import compute_incremental
from pipelines.quality.suites import SUITES, Check, checks, held_back_rows

# Great Expectations is imported by validate() (import_soon() starts it in a thread while
# Spark computes the metric frames): its import takes seconds a check need not wait for.
from pipelines.quality.validate import import_soon, validate
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.quality")
SUMMARY_NAME = tables.SUMMARY_NAME
SCREENSHOT_NAME = "summary.png"
DOCS_NAME = "data_docs"
UPLOAD_CHUNK_BYTES = 1 << 20
"""How much of a report file one call hands the JVM when it is uploaded."""


def pinned_versions(spark: SparkSession, bucket: str) -> dict[str, int]:
    """The current Delta version of every table a check of ``bucket`` reads (for
    :func:`check_bucket`'s ``at``), the tables that exist only; taken between two
    micro-batches. The catalog gives the tables' locations, a call per database and not per
    table (:func:`~pipelines.lake.table_entries.entries`); the versions come from the
    tables' logs, the registry's rows through delta-rs at its version (no Spark job)."""
    return _pinned(spark, bucket)[0]


def _pinned(spark: SparkSession, bucket: str) -> tuple[dict[str, int], dict[str, str | None]]:
    """:func:`pinned_versions`, and the catalog's entries of those tables and of their
    collections' views (for :func:`~pipelines.lake.table_entries.known`)."""
    names = BucketTables(bucket)
    wanted = [names.events, names.quarantine, names.ingest_log, names.stream_state]
    wanted += [names.pending, names.purges, names.registry]
    known = table_entries.entries(spark, [*wanted, *_written(names)])
    pinned = {t: delta_io.location_version(spark, known[t] or "") for t in wanted if known.get(t)}
    if names.registry in pinned:
        location = known[names.registry] or ""
        registry = delta_rs.read_columns(
            location,
            ("status", "table_name"),
            table=names.registry,
            version=pinned[names.registry],
            options=delta_rs.storage_options(spark, location),
        )
        views = [r["table_name"] for r in registry.to_pylist() if r["status"] in tables.WITH_TABLES]
        collections = [tables.all_rows(v) for v in views]
        known |= table_entries.entries(spark, collections)
        known |= dict.fromkeys(table_entries.names(spark, views))  # views: no location
        pinned |= {
            t: delta_io.location_version(spark, known[t] or "") for t in collections if known.get(t)
        }
    return pinned, known


def _known(
    spark: SparkSession, bucket: str, at: Mapping[str, int] | None
) -> tuple[dict[str, int], dict[str, str | None]]:
    """The versions a check reads (``at``, else :func:`pinned_versions` now) and the catalog's
    entries of those tables, of their collections' views and of the tables a check writes."""
    if at is None:
        return _pinned(spark, bucket)
    views = [tables.view_of(t) for t in at if t.endswith(tables.ALL_SUFFIX)]
    known = table_entries.entries(spark, [*at, *_written(BucketTables(bucket))])
    return dict(at), known | dict.fromkeys(table_entries.names(spark, views))


def _written(names: BucketTables) -> tuple[str, ...]:
    """The tables a check writes to: its results and its states."""
    return (names.results, names.check_state, names.check_columns)


def landing_frame(
    spark: SparkSession,
    config: AppConfig,
    bucket: BucketConfig,
    at: Mapping[str, int] | None = None,
    now: dt.datetime | None = None,
    *,
    log_rows: list[dict[str, Any]] | None = None,
) -> Metrics:
    """The ``landing_continuity`` metric frame: the ingest log (at its version in ``at``, or
    ``log_rows`` read there already) against the landing listed now."""
    table = BucketTables(bucket.name).ingest_log
    if log_rows is None:
        log_rows = store.read_log_rows(spark, table, (at or {}).get(table))
    state = LogState.of(log_rows)
    rows = held_back_rows(
        {r["session_id"] for r in state.ingested.values()},
        held_back_now(config, bucket, state),
        now=now or dt.datetime.now(dt.UTC),
        after_s=config.quality.held_back_after_s,
    )
    return Metrics(rows, tuple(schemas.HELD_BACK_METRICS.fieldNames()))


def open_snapshots(stream_rows: list[dict[str, Any]]) -> list[OpenSnapshot]:
    return [
        OpenSnapshot(
            vbucket=r["vbucket"],
            session_id=r["session_id"],
            stream_no=r["stream_no"],
            start=r["open_start"],
            end=r["open_end"],
            last_seqno=r["open_last_seqno"],
            missing_from=r["open_missing_from"],
            resumed=not r["latest"],
        )
        for r in sorted(
            stream_rows,
            key=lambda r: (r["vbucket"], r["session_started_at"], r["session_id"], r["stream_no"]),
        )
        if r["open_detail"] is not None
    ]


def counts(metrics: dict[str, Metrics]) -> dict[str, int]:
    streams = metrics["snapshot_completeness"].rows
    recon = metrics["silver_reconciliation"].rows
    files = metrics["bronze_integrity"].rows
    return {
        "capture_files": len(files),
        "bronze_frames": sum(r["frames"] for r in files),
        "quarantined_malformed": sum(r["malformed"] for r in files),
        "quarantined_cut_tails": sum(r["truncated"] for r in files),
        "sessions": len({r["session_id"] for r in streams}),
        "streams": len(streams),
        "vbuckets": len(metrics["stream_coverage"].rows),
        "snapshots": sum(r["snapshots"] for r in streams),
        "open_snapshots_now": sum(1 for r in streams if r["open_detail"] and r["latest"]),
        "open_snapshots_resumed": sum(1 for r in streams if r["open_detail"] and not r["latest"]),
        "collections": len(recon),
        "live_documents_bronze": sum(r["bronze_live"] for r in recon),
        "live_documents_silver": sum(r["silver_live"] for r in recon),
        "held_back_files": sum(r["held_back_files"] for r in metrics["landing_continuity"].rows),
    }


def check_bucket(
    spark: SparkSession,
    config: AppConfig,
    bucket: BucketConfig,
    *,
    screenshot: bool = False,
    at: Mapping[str, int] | None = None,
    full: bool = False,
) -> QualityReport:
    """Run the five suites on one bucket: results table, Data Docs and summary page. ``at``
    (:func:`pinned_versions`): read the tables at those versions, not as they are now.

    The metric frames start from what the last check carried (:mod:`pipelines.quality.compute`:
    the frames since it, the same rows as a check over everything) once bronze holds
    ``quality.incremental_from_bytes``; ``full``, a smaller bronze or a state that cannot
    answer reads all of bronze. From that size on, the state for the next check is saved."""
    started = time.perf_counter()
    import_soon()
    all_checks = checks(config.quality)
    pinned, known = _known(spark, bucket.name, at)
    events = BucketTables(bucket.name).events
    if events not in known and not spark.catalog.tableExists(events):
        raise DataQualityError(
            f"bucket {bucket.name!r}: {events} does not exist; ingest it before checking it"
        )
    # the tables' locations from the catalog once, not again at each read of the check
    with table_entries.known(known):
        report = _checked(
            spark, config, bucket, pinned, all_checks, screenshot=screenshot, full=full
        )
    report.seconds = time.perf_counter() - started
    log.info(report.render(), extra={"run_id": report.run_id})
    return report


def _checked(
    spark: SparkSession,
    config: AppConfig,
    bucket: BucketConfig,
    pinned: Mapping[str, int],
    all_checks: tuple[Check, ...],
    *,
    screenshot: bool,
    full: bool,
) -> QualityReport:
    """:func:`check_bucket` of the tables at ``pinned``: the metric frames, Great
    Expectations, the results, the summary page."""
    name = bucket.name
    names = BucketTables(name)
    events = names.events
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    run_id = f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    size = delta_io.table_size(spark, events, pinned.get(events))[1]
    computed = None
    if size < config.quality.columnar_below_bytes:
        computed = _columnar(spark, config, name, pinned, size, full=full)
    if computed is None and size < min(
        config.quality.on_driver_below_bytes, config.quality.incremental_from_bytes
    ):
        computed = _on_driver(spark, config, name, pinned, size, columnar=False)
    if computed is None:
        computed = _in_spark(spark, config, name, pinned, size, full=full)
    metrics: dict[str, Metrics] = dict(computed.metrics)
    metrics["landing_continuity"] = landing_frame(
        spark, config, bucket, pinned, now, log_rows=computed.log_rows
    )
    assert set(metrics) == {s.name for s in SUITES}
    target = tables.report_location(config, name)
    local = Path(tempfile.mkdtemp(prefix="dcp-cdc-quality-")) if is_uri(target) else Path(target)
    shutil.rmtree(local / DOCS_NAME, ignore_errors=True)  # the site shows this run only
    local.mkdir(parents=True, exist_ok=True)
    results = validate(
        {s: m.pandas() for s, m in metrics.items()},
        all_checks,
        docs_dir=local / DOCS_NAME,
        run_name=run_id,
        run_time=now,
        max_examples=config.quality.max_examples,
    )
    entity = {s.name: s.entity for s in SUITES}
    report = QualityReport(name, run_id, now.isoformat(), results_table=names.results)
    report.outcomes = [
        reporting.outcome_from_result(
            c,
            results[c.key],
            entity=entity[c.suite],
            max_examples=config.quality.max_examples,
            rows=metrics[c.suite].rows,
        )
        for c in all_checks
    ]
    unfinished = open_snapshots(metrics["snapshot_completeness"].rows)
    report.open_snapshots = [s for s in unfinished if not s.resumed]
    report.resumed_snapshots = [s for s in unfinished if s.resumed]
    report.counts = counts(metrics)
    report.full_because = computed.full_because
    _append_results(spark, config, report, now)
    (local / SUMMARY_NAME).write_text(reporting.render_summary(report), encoding="utf-8")
    if screenshot:
        report.screenshot_path = str(
            reporting.screenshot(local / SUMMARY_NAME, local / SCREENSHOT_NAME)
        )
    if is_uri(target):
        _upload(spark, local, target)
        shutil.rmtree(local, ignore_errors=True)
        if report.screenshot_path:
            report.screenshot_path = f"{target}/{SCREENSHOT_NAME}"
    report.report_path = f"{target}/{SUMMARY_NAME}"
    report.data_docs_path = f"{target}/{DOCS_NAME}/index.html"
    return report


@dataclass(frozen=True)
class _Frames:
    """A check's metric frames (all but ``landing_continuity``), why it read all of bronze
    (None: it started from the last check's state) and, when the driver read it, the ingest
    log's rows at the pinned version."""

    metrics: dict[str, Metrics]
    full_because: str | None
    log_rows: list[dict[str, Any]] | None = None


def _on_driver(
    spark: SparkSession,
    config: AppConfig,
    bucket: str,
    pinned: Mapping[str, int],
    size: int,
    *,
    columnar: bool,
) -> _Frames | None:
    """The metric frames computed in the driver, over columns
    (:mod:`pipelines.quality.small.columnar`) or over rows (:mod:`pipelines.quality.small`),
    or None when the bucket holds what only the row or Spark check takes."""
    compute_in_driver = compute_columnar if columnar else compute_small
    setting = "columnar_below_bytes" if columnar else "on_driver_below_bytes"
    named = f"[quality] {setting}"
    try:
        found = compute_in_driver(spark, bucket, pinned)
    except NotOnDriver as exc:
        way = "over columns" if columnar else "in the driver"
        log.info("the quality check of %s does not run %s: %s", bucket, way, exc)
        return None
    limit = getattr(config.quality, setting)
    why = (
        f"bronze ({size:,} bytes) is below {named} ({limit:,}): "
        f"the driver reads {'its columns' if columnar else 'it'} whole"
    )
    return _Frames(found.metrics, why, found.ingest_log)


def _columnar(
    spark: SparkSession,
    config: AppConfig,
    bucket: str,
    pinned: Mapping[str, int],
    size: int,
    *,
    full: bool,
) -> _Frames | None:
    """The metric frames over columns in the driver: from the last columnar check's state
    (:mod:`pipelines.quality.small.incremental`) from ``quality.incremental_from_bytes`` on,
    else, or when the state cannot answer, over everything (keeping the state for the next
    from that size on); None when the bucket holds what only the row or Spark check takes."""
    keep = size >= config.quality.incremental_from_bytes
    if not keep:
        return _on_driver(spark, config, bucket, pinned, size, columnar=True)
    why = "asked for"
    if not full:
        state = columnar_state.read(spark, bucket)
        why = "no state of an earlier check"
        if state is not None:
            try:
                found, after = compute_incremental(spark, bucket, pinned, state)
            except (FullCheckNeeded, NotOnDriver) as exc:
                why = str(exc)
            else:
                columnar_state.write(spark, bucket, after, config.tables.properties)
                return _Frames(found.metrics, None, found.ingest_log)
    log.info("the quality check of %s reads all of bronze over columns: %s", bucket, why)
    try:
        everything = compute_columnar(spark, bucket, pinned, keep=True)
    except NotOnDriver as exc:
        log.info("the quality check of %s does not run over columns: %s", bucket, exc)
        return None
    if everything.state is not None:
        columnar_state.write(spark, bucket, everything.state, config.tables.properties)
    return _Frames(everything.metrics, why, everything.ingest_log)


def _in_spark(
    spark: SparkSession,
    config: AppConfig,
    bucket: str,
    pinned: Mapping[str, int],
    size: int,
    *,
    full: bool,
) -> _Frames:
    """The metric frames Spark computes (:mod:`pipelines.quality.compute`): from the last
    check's state from ``quality.incremental_from_bytes`` on, else over all of bronze."""
    small = size < config.quality.incremental_from_bytes
    metric_session = delta_io.static_plan_session(
        spark, interpreted=size < config.spark.interpreted_below_bytes
    )
    computed = compute(
        metric_session,
        bucket,
        pinned,
        None if full or small else carry.read(metric_session, bucket),
        full=full,
        save=None
        if small
        else lambda s: carry.write(metric_session, bucket, s, config.tables.properties),
    )
    if small and not full:
        computed.full_because = (
            f"bronze ({size:,} bytes) is below quality.incremental_from_bytes "
            f"({config.quality.incremental_from_bytes:,})"
        )
    return _Frames(dict(computed.metrics), computed.full_because)


def _append_results(
    spark: SparkSession, config: AppConfig, report: QualityReport, checked_at: dt.datetime
) -> None:
    table = BucketTables(report.bucket).results
    if not table_entries.exists(spark, table):
        delta_io.ensure_database(spark, table)
        made_with = {**delta_io.FREQUENT_COMMITS, **config.tables.properties}  # a commit a check
        delta_io.create_table(spark, table, schemas.QUALITY_RESULTS, made_with)
    rows = [{**r, "checked_at": checked_at} for r in reporting.result_rows(report)]
    if not store.append_from_driver(spark, table, rows, schemas.QUALITY_RESULTS):
        delta_io.append(spark.createDataFrame(rows, schema=schemas.QUALITY_RESULTS), table)


def _upload(spark: SparkSession, local: Path, target: str) -> None:
    """Copy the report folder to a Hadoop filesystem location (object storage), a file at a
    time through the filesystem's output stream. Not ``copyFromLocalFile``: S3A's (hadoop-aws
    3.5.0) runs each file's upload in its bounded thread pool and waits there for the PUT,
    which needs the same pool, and a driver hung in it for good under the Airflow rehearsal."""
    jvm: Any = spark._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    fs = hadoop_path(target).getFileSystem(spark._jsc.hadoopConfiguration())
    fs.delete(hadoop_path(f"{target}/{DOCS_NAME}"), True)
    for item in sorted(p for p in local.rglob("*") if p.is_file()):
        out = fs.create(hadoop_path(f"{target}/{item.relative_to(local).as_posix()}"), True)
        try:
            with open(item, "rb") as handle:
                while chunk := handle.read(UPLOAD_CHUNK_BYTES):
                    out.write(chunk)
        finally:
            out.close()


def prune_results(spark: SparkSession, config: AppConfig, bucket: BucketConfig) -> int:
    """Delete result rows older than ``quality.results_retention_days``; returns how many."""
    table = BucketTables(bucket.name).results
    if not spark.catalog.tableExists(table):
        return 0
    days = config.quality.results_retention_days
    done = spark.sql(
        f"DELETE FROM {table} WHERE checked_at < current_timestamp() - INTERVAL {days} DAYS"
    ).collect()
    return int(done[0]["num_affected_rows"]) if done else 0


# --- entry point -------------------------------------------------------------------------


def run(
    config: AppConfig,
    bucket: str | None = None,
    *,
    spark: SparkSession | None = None,
    screenshot: bool = False,
    full: bool = False,
) -> list[QualityReport]:
    """Check every configured bucket (or one); builds the Spark session if none is given.
    Each bucket's check pushes its metrics when ``[pushgateway] url`` is set."""
    checks(config.quality)  # unknown severity overrides fail before Spark starts
    buckets = config.bucket(bucket)
    import_soon()  # while the JVM starts
    session = spark or session_for(config, "dcp-cdc-quality")
    reports = []
    for b in buckets:
        with log_context(bucket=b.name), pushed(config.pushgateway, "check", b.name) as report:
            checked = check_bucket(session, config, b, screenshot=screenshot, full=full)
            report(RunMetrics(steps={"check": checked.seconds}, quality_passed=checked.passed))
            reports.append(checked)
    return reports


def failed_errors(reports: Sequence[QualityReport]) -> list[str]:
    return [f"{r.bucket}: {key}" for r in reports for key in r.failed_errors]


# ``python -m pipelines.quality.job`` and ``spark-submit pipelines/quality/job.py``: the ``check`` verb of the command line
# (imported here only, so that the job module does not import the command line).
if __name__ == "__main__":
    from pipelines.app.cli import job_main

    raise SystemExit(job_main("check"))
