"""Configuration: pydantic models (frozen, ``extra="forbid"``) and the one loader.

A file in ``conf/`` is TOML. Relative local paths in it (``landing``, ``warehouse``, a
bucket's ``landing``) are relative to the file's own folder, so a job finds the same data
whatever directory it starts in (an Airflow worker's is anyone's guess). A wrong or missing setting fails with
:class:`ConfigError` naming the file and the field, before any Spark session starts.

The capture section (``[buckets.capture]``) is :mod:`dcp_cdc.config.capture`; the reference
generated from these models' docstrings is :mod:`dcp_cdc.config.reference`;
``python -m dcp_cdc.config --check FILE`` validates a file and prints it with every default.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dcp_cdc.config.base import ConfigModel
from dcp_cdc.config.capture import (
    CAPTURE_DIR,
    COLLECTION_PATTERN,
    WILDCARD_HOSTS,
    CaptureConfig,
    CaptureDirs,
    default_staging,
    is_object_store,
    listen_host,
)
from dcp_cdc.config.storage import StorageConfig, unsafe_log_store
from dcp_cdc.errors import ConfigError

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_uri(location: str) -> bool:
    """True for ``scheme://...`` locations; plain paths are local."""
    return bool(_URI.match(location))


PROJECTION_TYPES = re.compile(
    r"string|boolean|int|bigint|float|double|date|timestamp|decimal\((\d{1,2}),\s*(\d{1,2})\)"
)
"""The Spark SQL types a projected column may have."""


class ProjectionColumn(ConfigModel):
    """One typed column of a projection: a document path and the type to read it as."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
    """The column's name in the view (a plain SQL identifier)."""
    path: Annotated[str, Field(pattern=r"^\$(\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]{1,9}\])+$")]
    """Where in the document: ``$.a.b``, ``$.items[0].sku`` (object keys of letters, digits and
    ``_``)."""
    type: str = "string"
    """Its Spark SQL type: ``string``, ``boolean``, ``int``, ``bigint``, ``float``,
    ``double``, ``date``, ``timestamp`` or ``decimal(p, s)``. A value that is missing or does
    not convert reads as null; a string converts to a date or timestamp it spells (ISO 8601),
    and a number with more decimals than ``s`` is rounded."""

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        kind = value.strip().lower()
        found = PROJECTION_TYPES.fullmatch(kind)
        if found is None:
            raise ValueError(
                f"{value!r} is not a projection type: string, boolean, int, bigint, float, "
                "double, date, timestamp or decimal(p, s)"
            )
        if found.group(1) is not None:
            precision, scale = int(found.group(1)), int(found.group(2))
            if not (1 <= precision <= 38 and scale <= precision):
                raise ValueError(f"{value!r}: decimal(p, s) needs 1 <= p <= 38 and s <= p")
        return kind.replace(" ", "")


PROJECTION_RESERVED = frozenset({"key", "_modified_at", "_seqno", "_vbucket"})
"""Columns every projection view has besides the declared ones."""


class ProjectionConfig(ConfigModel):
    """A typed view of one collection's live documents (``[[buckets.projections]]``):
    ``silver.<bucket>__<scope>__<collection>__typed`` with ``key``, one column per entry of
    ``columns`` and ``_modified_at``, ``_seqno``, ``_vbucket``, for tools that want ordinary
    columns. Each document is parsed once per row (as a VARIANT) whatever the number of
    columns."""

    collection: Annotated[str, Field(pattern=COLLECTION_PATTERN)]
    """``scope.collection`` as Couchbase names them (``inventory.airline``)."""
    columns: Annotated[list[ProjectionColumn], Field(min_length=1)]
    """The typed columns, in view order: ``{ name = "city", path = "$.address.city" }``."""

    @model_validator(mode="after")
    def _distinct_names(self) -> ProjectionConfig:
        seen: set[str] = set()
        for column in self.columns:
            folded = column.name.lower()  # Spark resolves names without case
            if folded in PROJECTION_RESERVED:
                raise ValueError(
                    f"column {column.name!r} of {self.collection}: the view has it already "
                    f"({', '.join(sorted(PROJECTION_RESERVED))})"
                )
            if folded in seen:
                raise ValueError(f"column {column.name!r} of {self.collection} is declared twice")
            seen.add(folded)
        return self

    @property
    def scope_and_name(self) -> tuple[str, str]:
        scope, _, name = self.collection.partition(".")
        return scope, name


class BucketConfig(ConfigModel):
    """One Couchbase bucket whose captures land in the landing location."""

    name: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.%-]+$")]
    """The bucket's name; the capture headers' ``bucket`` must match it."""
    landing: str | None = None
    """Where this bucket's captures land; default: the global landing location."""
    capture: CaptureConfig | None = None
    """The capture agent that records this bucket from a Couchbase cluster: the
    ``[buckets.capture]`` table below. Default: none (captures arrive some other way)."""
    projections: list[ProjectionConfig] = Field(default_factory=list)
    """Typed views of collections (``[[buckets.projections]]`` below); default none."""
    history: bool | list[Annotated[str, Field(pattern=COLLECTION_PATTERN)]] = False
    """History tables (SCD type 2: every version of every document,
    ``silver.<bucket>__<scope>__<collection>__history``): ``true`` for every collection, or
    the ``scope.collection`` names that keep one (``["inventory.airline"]``). Each costs its
    apply a MERGE per run (the versions of the keys the run changed). Default: none."""

    def keeps_history(self, scope: str, name: str) -> bool:
        """Whether the collection ``scope.name`` has a history table."""
        if isinstance(self.history, bool):
            return self.history
        return f"{scope}.{name}" in self.history

    @model_validator(mode="after")
    def _one_projection_per_collection(self) -> BucketConfig:
        named = [p.collection for p in self.projections]
        twice = sorted({c for c in named if named.count(c) > 1})
        if twice:
            raise ValueError(f"more than one projection of {', '.join(twice)}")
        return self


class IngestConfig(ConfigModel):
    """Bronze ingest of capture files."""

    chunk_bytes: Annotated[int, Field(ge=1 << 16, le=1 << 30)] = 64 << 20
    """Bytes of a capture file decoded at once inside a task, and of Snappy values one batch
    may decompress: a task's memory peaks under 8 × `chunk_bytes` (8 × its largest value, at
    most 64 MiB, when that is more)."""
    max_file_bytes: Annotated[int, Field(ge=1 << 10)] = 64 << 30
    """Capture files larger than this are reported and left alone."""
    quarantine_raw_bytes: Annotated[int, Field(ge=0, le=1 << 20)] = 4096
    """Raw bytes kept per quarantined record."""
    max_files_per_run: Annotated[int, Field(ge=0)] = 0
    """0 = every new file."""
    writer: Literal["arrow", "spark"] = "arrow"
    """Who writes the events' Parquet files: ``arrow``, the decode tasks themselves (pyarrow,
    columnar; the driver commits them in one Delta transaction), or ``spark``, Spark's Delta
    writer (row at a time, slower; kept as the reference the tests compare
    with). Either way a run commits once, exactly once."""
    jvm_jit: Literal["c1", "tiered"] = "c1"
    """The JIT compiler of a JVM started for ingest alone (``dcp-cdc ingest``, ``python -m
    pipelines.bronze.job``, the DAGs' ingest task) with the ``arrow`` writer: ``c1`` compiles
    quickly and shallowly, enough for a JVM that mostly waits for the Python tasks that decode
    and write (10M events in 19.1 s instead of 21.7 s on 2 cores: the JVM's CPU halves).
    ``tiered`` is the JVM's default, with C2, which heavy JVM work needs: Spark's own writer
    (10M events: 170 s with C1 alone) and a MERGE (1M changes: 31 s with C2, 46 s without).
    So the ``spark`` writer, and a JVM that also applies (``dcp-cdc run``, follow mode), keep
    it whatever this says."""


class TableConfig(ConfigModel):
    """Delta tables."""

    properties: dict[str, str] = Field(
        default_factory=lambda: {"delta.enableDeletionVectors": "false"}
    )
    """Delta table properties set when a table is created. Deletion vectors are off by
    default (silver's ``_all`` tables follow ``[silver] deletion_vectors`` instead): some
    readers (delta-rs's pyarrow reader, ``deltalake`` 1.6 ``to_pyarrow_table``) refuse tables
    with that reader feature, and turning it off later leaves the feature in the protocol.
    Optimized writes (``delta.autoOptimize.optimizeWrite``) are off by default too: with few
    shuffle partitions a MERGE writes few files anyway, and an optimized write bins them into
    one task (a 1M-change MERGE took 47 s with it, 32 s without, on 2 cores); with many
    partitions turn it on, as ``conf/cluster.example.toml`` does."""


class SilverConfig(ConfigModel):
    """Silver apply."""

    retire: Literal["archive", "drop"] = "archive"
    """What happens to a collection's table once its drop reached every vbucket: ``archive``
    renames it ``<table>__dropped_<cid>_<yyyymmdd>``, ``drop`` removes it."""
    eager_apply: bool = False
    """Also apply the changes of a vbucket's unfinished snapshot at once (they are not yet a
    consistent point of the bucket); off: they wait until the snapshot completes."""
    deletion_vectors: bool = True
    """Deletion vectors on the ``_all`` tables (set when a table is created): a MERGE then
    marks the rows it replaces in the files it touches instead of rewriting those files, so
    its cost follows the batch (on 2 cores, 10,000 changes into 1M keys: 6.8 s with them,
    12.5 s without; 1M changes into 10M keys: 39.7 s and 47.8 s; into 1M keys 20.0 s and
    15.7 s). Readers must support
    them: Spark, Delta Kernel, delta-rs's SQL reader (``deltalake.QueryBuilder``), not
    ``deltalake``'s ``to_pyarrow_table``. Off: those readers too, every MERGE rewrites."""
    change_data_feed: bool = True
    """Delta's change data feed on the ``_all`` tables (set when a table is created): every
    MERGE also writes each change's before and after image, which incremental readers
    (``readChangeFeed``, ``table_changes``) consume. It costs the MERGE a full read of the
    rows it replaces (on 2 cores, 1M changes into 1M keys: 18.7 s with it, 12.0 s without, in a
    warm JVM). Off: the MERGE reads and writes only what it applies; an
    existing table keeps what it was created with
    (``ALTER TABLE ... SET TBLPROPERTIES (delta.enableChangeDataFeed = false)`` changes it)."""
    document_variant: bool = False
    """Also keep each JSON document as a VARIANT: a column ``doc_variant`` (``doc`` parsed,
    ``try_parse_json``; null for binary documents, tombstones and a body flagged JSON that is
    not) next to ``doc``, which stays JSON text for every reader. Spark SQL then reads fields
    without parsing (``doc_variant:customer.tier::string``, ``variant_get``), and typed views
    (``[[buckets.projections]]``) read it instead of parsing ``doc`` (1M documents on 2 cores:
    an aggregation of three fields 1.15 s instead of 2.09 s, through a typed view 1.01 s
    instead of 2.17 s, a filter 0.72 s instead of 0.92 s). Off by default: only Spark gains,
    the documents take 64 % more space, a MERGE writes half as much again (1M changes into 1M
    keys: 94 MiB instead of 63 MiB, in about the same time: 18.6 s and 18.4 s), and the
    column puts Delta's ``variantType`` reader feature
    on the table, which a reader that does not know it must refuse (the whole table, ``doc``
    too); the feature stays once there. On: a table without the column gains it at the next
    apply run that has changes, filled for the rows it holds (one UPDATE that rewrites them).
    Turned off again: a table that has the column keeps it, and every MERGE keeps it filled."""
    live_layer: bool = False
    """Apply through the live layer: each apply appends its changes for every collection to
    one pending table per bucket (``silver.<bucket>__pending``: one commit whatever the
    number of collections), and each collection's view shows its ``_all`` table overlaid
    with them; a compaction MERGEs them into the ``_all`` tables when the pending table holds
    ``compact_files`` files or ``compact_bytes`` bytes, and before what needs the tables
    complete (a rollback, a drop or flush, a retire, history tables, a backfill, the tombstone
    purge). Readers of the ``_all`` tables and their change feed see a change at its
    compaction; the views, the typed views and the quality check see it at its apply. Off:
    every apply MERGEs into each collection table it touches (pending rows a run with the
    layer on left are compacted first)."""
    compact_files: Annotated[int, Field(ge=1)] = 30
    """With ``live_layer``: compact when the pending table holds this many files (an apply's
    append writes one)."""
    compact_bytes: Annotated[int, Field(ge=1)] = 64 * 1024 * 1024
    """With ``live_layer``: compact when the pending table holds this many bytes."""
    tombstone_retention_hours: Annotated[int, Field(ge=0)] = 168
    """How long deletion and expiration tombstones stay in ``..._all`` tables before the
    maintenance purge removes them. After the purge, a replayed older event of such a key in
    its vbucket at or below the purged seqno is still refused (``__tombstone_purges``)."""


class FollowConfig(ConfigModel):
    """Follow mode (``dcp-cdc run --follow``): one long-running Spark session that ingests
    what lands and applies it to silver in micro-batches."""

    interval_s: Annotated[float, Field(gt=0, le=3600)] = 2.0
    """Seconds from the start of one micro-batch to the start of the next (a batch that takes
    longer is followed at once)."""
    rotate_seconds: Annotated[float, Field(ge=0.01, le=3600)] = 1.0
    """The capture agent run by follow mode closes its files at least this often (the lower of
    this and ``buckets.capture.rotate_seconds``): a change waits in staging no longer."""
    check_every_s: Annotated[float, Field(ge=0)] = 3600.0
    """Seconds between quality checks while following (0: only on demand, ``SIGUSR1``). A
    check runs beside the micro-batches (in a thread, Spark's fair scheduler sharing the
    cores), reading every table as of one moment between two of them."""
    metrics_port: Annotated[int | None, Field(ge=1, le=65535)] = None
    """Serve follow mode's Prometheus metrics (``/metrics``: micro-batch and step seconds,
    rows merged, freshness, quality) and its health (``/healthz``, ``/readyz``) over HTTP on
    this port (docs/metrics.md). Default: off. The capture agents it runs serve their own
    (``buckets.capture.metrics_port``), in their own processes."""
    metrics_host: Annotated[str, Field(min_length=1, max_length=253)] = "127.0.0.1"
    """The address ``metrics_port`` listens on: the loopback interface by default; ``0.0.0.0``
    (or ``::``) for every interface. The endpoint has no authentication."""
    unready_after_failed_batches: Annotated[int, Field(ge=1, le=1000)] = 3
    """A bucket whose micro-batches failed this many times in a row fails ``/readyz`` until
    one succeeds (a failed micro-batch is tried again at the next interval)."""
    stop_after_failed_batches: Annotated[int, Field(ge=1, le=100_000)] = 10
    """Follow mode gives up, stopping its agents and exiting with the last error, when a
    bucket's micro-batches failed this many times in a row (1: at the first failure), so that
    a supervisor restarts it. An error no retry cures (the configuration, credentials, a table
    or bucket that is not there) ends follow mode at the first failure."""

    @field_validator("metrics_host")
    @classmethod
    def _metrics_host(cls, value: str) -> str:
        return listen_host(value)

    @model_validator(mode="after")
    def _unready_before_stopping(self) -> FollowConfig:
        if self.unready_after_failed_batches > self.stop_after_failed_batches:
            raise ValueError(
                f"unready_after_failed_batches ({self.unready_after_failed_batches}) is above "
                f"stop_after_failed_batches ({self.stop_after_failed_batches}): follow mode "
                "would stop before it is unready"
            )
        return self


class PushgatewayConfig(ConfigModel):
    """Batch runs (``dcp-cdc ingest``, ``apply``, ``check``, ``run``, and so the Airflow
    tasks) push their metrics to a Prometheus Pushgateway when they end (docs/metrics.md)."""

    url: str | None = None
    """The Pushgateway, ``http://host:9091`` (or ``https://``). Default: none, nothing is
    pushed. A push that fails is logged and does not fail the run."""
    job: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "dcp_cdc"
    """The ``job`` label of the pushed groups (each run's group is this, its bucket and its
    verb)."""
    timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    """Seconds a push may take."""

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.match(r"^https?://[^/\s@]+(/\S*)?$", value):
            # not echoed: credentials written into the URL must not reach the message
            raise ValueError(
                "expected http://host:port or https://host:port, without a user or password"
            )
        return value


Severity = Literal["error", "warn"]
_EXPECTATION_KEY = re.compile(r"[a-z][a-z_]*(\.[a-z][a-z_]*)?")


class QualityConfig(ConfigModel):
    """The data-quality suites (``dcp-cdc check``, ``pipelines/quality``)."""

    quarantine_threshold: Annotated[int, Field(ge=0)] = 0
    """Malformed frames (quarantine records other than a session's cut tail) a bucket may
    hold before ``bronze_integrity.quarantine_within_threshold`` fails."""
    held_back_after_s: Annotated[float, Field(gt=0)] = 3600.0
    """Seconds a capture file may wait for a missing earlier file of its session, counted
    from its arrival (its modification time in the landing), before
    ``landing_continuity.no_file_held_back`` fails and follow mode's ``/readyz`` reports it."""
    severity: dict[str, Severity] = Field(default_factory=dict)
    """Severity overrides: ``"suite.expectation"`` or a whole ``"suite"`` → ``error`` (fails
    the run) or ``warn`` (reported only). Names are checked against the suites at run time."""
    max_examples: Annotated[int, Field(ge=1, le=1000)] = 20
    """Failing rows kept per expectation in the results table and the report."""
    results_retention_days: Annotated[int, Field(ge=1)] = 90
    """How long rows of ``quality.<bucket>_results`` are kept (pruned by the maintenance DAG)."""

    @field_validator("severity")
    @classmethod
    def _expectation_keys(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _EXPECTATION_KEY.fullmatch(k)]
        if bad:
            raise ValueError(f"keys must look like 'suite' or 'suite.expectation', got {bad}")
        return value


@dataclass(frozen=True, slots=True)
class MetastoreAddress:
    """A catalog service of ``[spark] metastore``: ``scheme`` is ``thrift`` (a Hive metastore;
    ``endpoints`` may be several) or ``derby`` (a Derby network server, ``database`` its path
    on the server's machine when the address names one)."""

    scheme: Literal["thrift", "derby"]
    endpoints: tuple[tuple[str, int], ...]
    database: str | None = None

    def __str__(self) -> str:
        hosts = ",".join(
            f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{port}"
            for host, port in self.endpoints
        )
        return hosts + (self.database or "")


_METASTORE_ENDPOINT = re.compile(
    r"(thrift|derby)://(\[[0-9a-fA-F:.]+\]|[^:/\[\]\s,]+):(\d{1,5})(/.*)?"
)


def metastore_address(value: str) -> MetastoreAddress:
    """``value`` (``[spark] metastore``) parsed; a ValueError says what was expected."""
    expected = (
        "expected thrift://HOST:PORT (a Hive metastore; several separated by commas) or "
        f"derby://HOST:PORT[/ABSOLUTE/PATH] (a Derby network server), got {value!r}"
    )
    parts = [part.strip() for part in value.split(",")]
    found = [_METASTORE_ENDPOINT.fullmatch(part) for part in parts]
    matches = [m for m in found if m is not None and 0 < int(m.group(3)) < 65536]
    if not parts or len(matches) != len(parts):
        raise ValueError(expected)
    schemes = {m.group(1) for m in matches}
    if len(schemes) != 1:
        raise ValueError(expected)
    scheme = matches[0].group(1)
    database = matches[0].group(4)
    if scheme == "derby" and (len(matches) > 1 or database == "/"):
        raise ValueError(expected)
    if scheme == "thrift" and any(m.group(4) for m in matches):
        raise ValueError(expected)
    endpoints = tuple((m.group(2).strip("[]"), int(m.group(3))) for m in matches)
    return MetastoreAddress("thrift" if scheme == "thrift" else "derby", endpoints, database)


class SparkConfig(ConfigModel):
    """Spark sessions of the jobs."""

    master: str = "local[2]"
    """The master of sessions a job builds itself (``dcp-cdc``, ``python -m``); under
    ``spark-submit`` (and so under Airflow) the submitter's ``--master`` wins."""
    shuffle_partitions: Annotated[int, Field(ge=1)] = 4
    """``spark.sql.shuffle.partitions``."""
    metastore: str | None = None
    """A catalog service several processes share: a Hive metastore (``thrift://host:9083``,
    several separated by commas) or a Derby network server (``derby://127.0.0.1:1527``, which
    ``dcp-cdc metastore start`` runs; its database ``<warehouse>/metastore_db`` unless the
    address ends in ``/<absolute path>``). Default: the Derby network server recorded for a
    local warehouse when one runs (follow mode and the Thrift server start one), else an
    embedded Derby database in ``<warehouse>/metastore_db``, one process at a time."""
    conf: dict[str, str] = Field(default_factory=dict)
    """Any other Spark settings, applied last (e.g. ``spark.hadoop.fs.s3a.*``, which the
    landing location's reader takes its S3 credentials and endpoint from too)."""
    py_files: str | None = "auto"
    """The code of ``dcp_cdc`` and ``pipelines`` shipped to the executors by every entry
    point (``dcp-cdc``, ``python -m``, ``spark-submit``, the DAGs): a path or URI of a zip
    (``make pyfiles``), ``auto`` (with a master that is not local, a zip of the installed
    packages, built once per content) or empty (the executors' Python has the package)."""
    jars_dir: str | None = None
    """The folder of the Delta Lake jars. Default: ``$DCP_CDC_JARS_DIR``, else the checkout's
    ``.cache/jars`` (``make setup``) when running from one."""

    @field_validator("metastore")
    @classmethod
    def _metastore_address(cls, value: str | None) -> str | None:
        if value is not None:
            metastore_address(value)  # a ValueError names what was expected
        return value


class AirflowConfig(ConfigModel):
    """How the DAGs in ``dags/`` schedule the jobs (read when Airflow parses the DAG file)."""

    schedule: str | None = "@hourly"
    """Schedule of each bucket's pipeline DAG: a cron expression or preset; empty: manual runs
    only."""
    maintenance_schedule: str | None = "@daily"
    """Schedule of the maintenance DAG (``dcp_cdc_maintenance``)."""
    start_date: dt.date = dt.date(2026, 1, 1)
    """The first logical date of the DAGs."""
    catchup: bool = False
    """Run the intervals missed since ``start_date`` (each run takes whatever landed anyway)."""
    retries: Annotated[int, Field(ge=0)] = 2
    """Retries of a failed task (a failed quality check is not retried)."""
    retry_delay_seconds: Annotated[int, Field(ge=0)] = 300
    """Delay before the first retry."""
    retry_exponential_backoff: Annotated[float, Field(ge=0)] = 2.0
    """Multiplier of the delay at each further retry; 0: a constant delay."""
    max_retry_delay_seconds: Annotated[int, Field(ge=0)] = 3600
    """Upper bound of the retry delay."""
    execution_timeout_minutes: Annotated[int, Field(ge=1)] = 120
    """A task running longer is stopped and fails (then retried)."""
    spark_conn_id: str = "dcp_cdc_spark"
    """The Airflow connection ``spark-submit`` takes the master (and deploy mode) from:
    ``local[2]`` here, ``yarn`` or ``spark://`` or ``k8s://`` on a cluster."""
    spark_submit: str | None = None
    """The ``spark-submit`` a worker runs: a path, or a name on its PATH. Default: the one of
    the pyspark installed beside Airflow, else ``spark-submit`` from the PATH."""
    application_dir: str | None = None
    """Where ``spark-submit`` finds the entry scripts (``bronze/job.py``, ...): a path or URI
    of the ``pipelines`` folder. Default: the installed ``pipelines`` package."""
    driver_memory: str | None = None
    """``spark.driver.memory`` (default: 6g with a local master, Spark's own otherwise)."""
    pool: str | None = None
    """The Airflow pool of every task. With the embedded Derby catalog only one Spark job may
    use the warehouse at a time: give such a deployment a pool with one slot."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: object) -> object:
        if isinstance(data, dict) and "py_files" in data:
            raise ValueError(
                "py_files moved to [spark] py_files (every entry point ships the code from it, "
                "not only the DAGs)"
            )
        return data


class MaintenanceConfig(ConfigModel):
    """The daily maintenance job (``python -m pipelines.maintenance``, ``dcp-cdc maintain``);
    it also purges tombstones (``silver.tombstone_retention_hours``) and old quality results
    (``quality.results_retention_days``)."""

    optimize: bool = True
    """OPTIMIZE every table: compacts small files and re-clusters the liquid-clustered ones
    (bronze events by ``(vbucket, by_seqno)``, silver by ``(_vbucket, key)``)."""
    vacuum_retention_hours: Annotated[int, Field(ge=0)] = 168
    """VACUUM removes files unreferenced for longer than this; time travel and change data
    feed reads further back stop working. Below 168 Delta's safety check is turned off for
    the maintenance session only."""


LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches: 127.0.0.0/8, ``::1``, ``localhost``.
    A host name is not resolved: any other name counts as reachable from outside."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class ThriftConfig(ConfigModel):
    """The JDBC/ODBC server of the catalog (``dcp-cdc thrift-server``, Spark's Thrift server,
    HiveServer2 protocol). Its ``--host``, ``--port`` and ``--insecure-open`` override these."""

    host: str = "127.0.0.1"
    """Address to listen on. Any address but loopback (127.0.0.0/8, ``::1``, ``localhost``)
    needs ``authentication`` ``ldap`` or ``kerberos``, or ``allow_unauthenticated = true``."""
    port: Annotated[int, Field(ge=1, le=65535)] = 10000
    """Port to listen on."""
    authentication: Literal["none", "ldap", "kerberos"] = "none"
    """``none``: any user name and password is accepted (loopback only, unless
    ``allow_unauthenticated``); ``ldap``: the password is checked by binding to ``ldap_url`` as
    the user (``hive.server2.authentication = LDAP``); ``kerberos``: clients need a ticket for
    ``kerberos_principal`` (``hive.server2.authentication = KERBEROS``)."""
    ldap_url: str | None = None
    """``ldap://host:389`` or ``ldaps://host:636`` (``hive.server2.authentication.ldap.url``);
    several separated by spaces."""
    ldap_base_dn: str | None = None
    """A user ``u`` binds as ``uid=u,<ldap_base_dn>``
    (``hive.server2.authentication.ldap.baseDN``)."""
    ldap_user_dn_pattern: str | None = None
    """Instead of ``ldap_base_dn``: DN patterns with ``%s`` for the user, separated by ``:``
    (``uid=%s,ou=people,dc=example,dc=com``; ``hive.server2.authentication.ldap.userDNPattern``)."""
    ldap_domain: str | None = None
    """Appended as ``user@<ldap_domain>`` to names without one (Active Directory;
    ``hive.server2.authentication.ldap.Domain``)."""
    kerberos_principal: str | None = None
    """The server's principal, ``hive/_HOST@REALM``
    (``hive.server2.authentication.kerberos.principal``)."""
    kerberos_keytab: str | None = None
    """The keytab file of ``kerberos_principal``
    (``hive.server2.authentication.kerberos.keytab``)."""
    allow_unauthenticated: bool = False
    """Serve a non-loopback ``host`` without authentication: anyone who reaches it reads
    every table, under any name (the server logs a warning at start)."""

    @model_validator(mode="after")
    def _authenticated_unless_loopback(self) -> ThriftConfig:
        if self.authentication == "ldap" and not self.ldap_url:
            raise ValueError('ldap_url: required with authentication = "ldap"')
        if self.ldap_url and not all(
            url.startswith(("ldap://", "ldaps://")) for url in self.ldap_url.split()
        ):
            raise ValueError(f"ldap_url: expected ldap://... or ldaps://..., got {self.ldap_url!r}")
        if self.authentication == "kerberos" and not (
            self.kerberos_principal and self.kerberos_keytab
        ):
            raise ValueError(
                'kerberos_principal, kerberos_keytab: both required with authentication = "kerberos"'
            )
        unused = [
            name
            for name, method in _AUTH_FIELDS.items()
            if getattr(self, name) is not None and method != self.authentication
        ]
        if self.allow_unauthenticated and self.authentication != "none":
            unused.append("allow_unauthenticated")
        if unused:
            raise ValueError(
                f"{', '.join(unused)}: set, but authentication is {self.authentication!r}"
            )
        if (
            self.authentication == "none"
            and not self.allow_unauthenticated
            and not is_loopback(self.host)
        ):
            raise ValueError(
                f"authentication: host {self.host!r} is not loopback, so the server needs "
                'authentication = "ldap" or "kerberos", or allow_unauthenticated = true '
                "(dcp-cdc thrift-server --insecure-open) to serve every table to anyone"
            )
        return self


_AUTH_FIELDS = {
    "ldap_url": "ldap",
    "ldap_base_dn": "ldap",
    "ldap_user_dn_pattern": "ldap",
    "ldap_domain": "ldap",
    "kerberos_principal": "kerberos",
    "kerberos_keytab": "kerberos",
}


class AppConfig(ConfigModel):
    """The whole configuration of a dcp-cdc deployment."""

    landing: str
    """Where capture files land: a local path or any Hadoop URI (``s3a://...``)."""
    warehouse: str
    """The Spark warehouse: Delta tables and (when local) the Derby metastore."""
    buckets: Annotated[list[BucketConfig], Field(min_length=1)]
    """The buckets whose captures land there (at least one)."""
    ingest: IngestConfig = IngestConfig()
    tables: TableConfig = TableConfig()
    silver: SilverConfig = SilverConfig()
    quality: QualityConfig = QualityConfig()
    spark: SparkConfig = SparkConfig()
    airflow: AirflowConfig = AirflowConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    follow: FollowConfig = FollowConfig()
    pushgateway: PushgatewayConfig = PushgatewayConfig()
    thrift: ThriftConfig = ThriftConfig()
    storage: StorageConfig = StorageConfig()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = None
    """Log level. Unset: INFO for the jobs run by ``spark-submit`` or ``python -m`` and for
    ``dcp-cdc capture``, WARNING for the other verbs (which print their summaries on stdout).
    ``$DCP_CDC_LOG_LEVEL`` overrides it."""
    log_format: Literal["text", "json"] = "text"
    """How log lines are written on stderr: ``text`` (time, level, logger, message), or
    ``json``, one JSON object per line with ``bucket``, ``vbucket`` and ``run_id`` where they
    apply (docs/commands.md, "Logs"). Secrets are masked in both. ``$DCP_CDC_LOG_FORMAT``
    overrides it."""

    @field_validator("landing", "warehouse")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _catalog_reachable(self) -> AppConfig:
        if (
            is_uri(self.warehouse)
            and not self.warehouse.startswith("file:")
            and not (self.spark.metastore or "spark.hadoop.hive.metastore.uris" in self.spark.conf)
        ):
            raise ValueError(
                f"warehouse {self.warehouse!r} is not a local path: set spark.metastore to a "
                "shared Hive metastore (thrift://host:9083) or to the Derby server `dcp-cdc "
                "metastore start` runs, with the local path of its database "
                "(derby://127.0.0.1:PORT/ABSOLUTE/PATH); the embedded Derby catalog only "
                "lives in a local warehouse"
            )
        metastore = self.spark.metastore
        if (
            metastore is not None
            and is_uri(self.warehouse)
            and not self.warehouse.startswith("file:")
            and metastore_address(metastore).scheme == "derby"
            and metastore_address(metastore).database is None
        ):
            raise ValueError(
                f"spark.metastore {metastore!r} names no database and warehouse "
                f"{self.warehouse!r} is not a local path to keep one in: add it to the address "
                "(derby://HOST:PORT/ABSOLUTE/PATH on the server's machine)"
            )
        return self

    @model_validator(mode="after")
    def _several_writers_on_s3(self) -> AppConfig:
        on_s3 = is_uri(self.warehouse) and self.warehouse.split(":", 1)[0] in ("s3a", "s3")
        problem = unsafe_log_store(on_s3, self.storage, self.spark.conf)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _capture_lands_locally(self) -> AppConfig:
        for index, bucket in enumerate(self.buckets):
            landing = self.landing_for(bucket)
            capture = bucket.capture
            if capture is None:
                continue
            local = not is_uri(landing) or landing.startswith("file:")
            if not local and not is_object_store(landing):
                raise ValueError(
                    f"buckets[{index}].capture: landing {landing!r} is neither a local path "
                    "nor s3:// (s3a://); the capture agent makes its files durable with fsync "
                    "and an atomic rename, or with an object store's atomic PUT"
                )
            if local and capture.staging_dir is not None:
                raise ValueError(
                    f"buckets[{index}].capture.staging_dir: only for an s3:// landing; a local "
                    "landing stages in its own .dcp-cdc-capture folder (the atomic rename needs "
                    "the same file system)"
                )
            state = capture.state_dir
            if state is not None and is_uri(state) and not is_object_store(state):
                raise ValueError(
                    f"buckets[{index}].capture.state_dir: {state!r} is neither a local path "
                    "nor s3:// (s3a://)"
                )
        return self

    @model_validator(mode="after")
    def _metrics_ports_apart(self) -> AppConfig:
        """Agents of several buckets, and follow mode itself, run on one host in follow mode:
        their metrics ports must not meet."""
        taken: dict[int, tuple[str, str]] = {}
        if self.follow.metrics_port is not None:
            taken[self.follow.metrics_port] = ("follow", self.follow.metrics_host)
        for index, bucket in enumerate(self.buckets):
            capture = bucket.capture
            if capture is None or capture.metrics_port is None:
                continue
            port, host = capture.metrics_port, capture.metrics_host
            if port in taken:
                other, other_host = taken[port]
                if host == other_host or WILDCARD_HOSTS.intersection((host, other_host)):
                    raise ValueError(
                        f"buckets[{index}].capture.metrics_port: {port} on {host} is "
                        f"{other}'s too; give each agent, and follow mode, its own port"
                    )
            taken.setdefault(port, (f"buckets[{index}]", host))
        return self

    def bucket(self, name: str | None) -> list[BucketConfig]:
        """The buckets a command works on: all of them, or the one named."""
        if name is None:
            return list(self.buckets)
        for b in self.buckets:
            if b.name == name:
                return [b]
        known = ", ".join(b.name for b in self.buckets)
        raise ConfigError(f"bucket {name!r} is not configured (configured: {known})")

    def landing_for(self, bucket: BucketConfig) -> str:
        return bucket.landing or self.landing

    def capture_dirs(self, bucket: BucketConfig) -> CaptureDirs:
        """The folders of ``bucket``'s capture agent: staging is ``<landing>/.dcp-cdc-capture``,
        the state folder ``capture.state_dir`` or the same. With an ``s3://`` landing, staging
        is ``capture.staging_dir`` (default: below the temporary folder) and the checkpoint
        is kept in the store, below ``<landing>/.dcp-cdc-capture``, unless ``state_dir``."""
        landing = self.landing_for(bucket)
        capture = bucket.capture
        state = capture.state_dir if capture is not None else None
        chosen: Path | str | None = None
        if state:
            chosen = state if is_object_store(state) else Path(state).expanduser()
        if is_object_store(landing):
            given = capture.staging_dir if capture is not None else None
            staging = Path(given).expanduser() if given else default_staging(landing)
            beside = f"{landing.rstrip('/')}/{CAPTURE_DIR}"
            return CaptureDirs(landing, staging, chosen if chosen is not None else beside)
        folder = Path(landing.removeprefix("file://").removeprefix("file:"))
        staging = folder / CAPTURE_DIR
        return CaptureDirs(folder, staging, chosen if chosen is not None else staging)


def _anchored(location: object, folder: Path) -> object:
    """A relative local path as seen from ``folder``; URIs, absolute paths and anything that
    is not a string (validation reports those) as they are."""
    if not isinstance(location, str) or not location.strip() or is_uri(location):
        return location
    path = Path(location).expanduser()
    return location if path.is_absolute() else os.path.normpath(folder / path)


CONFIG_ENV = "DCP_CDC_CONFIG"
LOCAL_CONFIG = Path("conf", "local.toml")
DEFAULT_WORKDIR = "work"
"""Where the built-in configuration keeps its data, relative to the working directory."""
DEMO_BUCKET = "travel-sample"

CONFIG_RULE = (
    "--config FILE, else $DCP_CDC_CONFIG, else ./conf/local.toml of the working directory, "
    "else the same settings built in (data under ./work/)"
)
"""How every verb of the command line finds its configuration, as its help says it."""


def find_config(*candidates: Path) -> Path | None:
    """The configuration file to use when none is named: ``$DCP_CDC_CONFIG``, else the first
    of ``candidates`` that is a file, else ``conf/local.toml`` of the working directory; None
    when there is none. The one rule of the command line and the DAGs."""
    chosen = os.environ.get(CONFIG_ENV)
    if chosen:
        return Path(chosen).expanduser().resolve()
    for candidate in (*candidates, Path.cwd() / LOCAL_CONFIG):
        if candidate.is_file():
            return candidate.resolve()
    return None


def builtin_settings() -> dict[str, object]:
    """The settings of ``conf/local.toml``, built in for an installed package that runs
    outside a checkout; its data under ``./work/``. A unit test keeps the two equal."""
    work = Path(DEFAULT_WORKDIR).resolve()
    return {
        "landing": str(work / "landing"),
        "warehouse": str(work / "warehouse"),
        "buckets": [{"name": DEMO_BUCKET}],
        # the demo's sample carries one malformed frame on purpose (conf/local.toml says why)
        "quality": {"quarantine_threshold": 1},
    }


def load_config(path: str | Path | None, **overrides: object) -> AppConfig:
    """Read and validate ``path``; ``overrides`` replace top-level keys (e.g. for tests) and
    are taken as given (relative paths in them stay relative to the working directory).

    ``path=None`` is the configuration of a command given no ``--config``
    (:data:`CONFIG_RULE`): the file :func:`find_config` finds, else :func:`builtin_settings`."""
    if path is None:
        found = find_config()
        if found is None:
            return _validated(builtin_settings() | overrides, "the built-in configuration")
        path = found
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: configuration file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    folder = file.resolve().parent
    for key in ("landing", "warehouse"):
        if key in raw:
            raw[key] = _anchored(raw[key], folder)
    spark = raw.get("spark")
    if isinstance(spark, dict):
        for key in ("py_files", "jars_dir"):
            if key in spark and spark[key] != "auto":
                spark[key] = _anchored(spark[key], folder)
    for bucket in raw.get("buckets", []) if isinstance(raw.get("buckets"), list) else []:
        if isinstance(bucket, dict) and "landing" in bucket:
            bucket["landing"] = _anchored(bucket["landing"], folder)
        capture = bucket.get("capture") if isinstance(bucket, dict) else None
        if isinstance(capture, dict):
            for key in (
                "password_file",
                "tls_ca_file",
                "tls_cert_file",
                "tls_key_file",
                "state_dir",
                "staging_dir",
            ):
                if key in capture:
                    capture[key] = _anchored(capture[key], folder)
    thrift = raw.get("thrift")
    if isinstance(thrift, dict) and "kerberos_keytab" in thrift:
        thrift["kerberos_keytab"] = _anchored(thrift["kerberos_keytab"], folder)
    raw.update(overrides)
    return _validated(raw, str(file))


def _validated(raw: dict[str, object], source: str) -> AppConfig:
    try:
        return AppConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid configuration: {_problems(exc)}") from None


def _problems(exc: ValidationError, *section: str) -> str:
    """Each error of ``exc`` as ``field.path: message`` (inside ``section``), joined by ``; ``."""
    return "; ".join(
        f"{_location((*section, *err['loc'])) or '(top level)'}: {err['msg']}"
        for err in exc.errors()
    )


def _location(path: tuple[object, ...]) -> str:
    """``buckets[0].capture.username``: a field's place, list items by index."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def thrift_settings(config: AppConfig, **overrides: object) -> ThriftConfig:
    """``config``'s ``[thrift]`` with the command line's overrides (``host``, ``port``,
    ``allow_unauthenticated``; None: keep the file's), validated again as a whole: a
    non-loopback ``--host`` without authentication fails here, before Spark starts."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return ThriftConfig.model_validate(config.thrift.model_dump() | given)
    except ValidationError as exc:
        raise ConfigError(f"invalid Thrift server settings: {_problems(exc, 'thrift')}") from None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dcp_cdc.config",
        description="Check a configuration file (its reference: python -m dcp_cdc.config.reference).",
    )
    parser.add_argument(
        "--check", metavar="FILE", required=True, help="validate FILE and print it with defaults"
    )
    args = parser.parse_args(argv)
    try:
        print(load_config(args.check).model_dump_json(indent=2))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
