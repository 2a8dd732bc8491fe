"""What the jobs do with a bucket's data: bronze ingest (``[ingest]``), the Delta tables
(``[tables]``), silver apply (``[silver]``), the quality suites (``[quality]``) and the daily
maintenance (``[maintenance]``)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from dcp_cdc.config.base import ConfigModel


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
    on_driver_below_bytes: Annotated[int, Field(ge=0)] = 32 << 20
    """A run whose capture files hold fewer bytes than this is scanned, decoded and written in
    the driver's Python, by the same functions Spark's tasks run, one after the other: no
    Spark job (a scheduled small run starts no executor for its ingest), where the tasks'
    way costs two jobs and the Python workers they start. From this many bytes on, Spark's
    tasks do it, in parallel. 0: Spark always does."""
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
    one task (a 1M-change MERGE takes 47 s with it, 32 s without, on 2 cores); with many
    partitions turn it on, as ``conf/cluster.example.toml`` does. The small tables every run,
    micro-batch and check commits to (bronze's, silver's stream state, registry, purge marks
    and pending rows, the quality results and the check's state) get
    ``delta.checkpointInterval = 100`` unless set here: a checkpoint costs such a commit 1-3 s
    on 2 cores."""


class SilverConfig(ConfigModel):
    """Silver apply."""

    retire: Literal["archive", "drop"] = "archive"
    """What happens to a collection's table once its drop reached every vbucket: ``archive``
    renames it ``<table>__dropped_<cid>_<yyyymmdd>``, ``drop`` removes it."""
    eager_apply: bool = False
    """Also apply the changes of a vbucket's unfinished snapshot at once (they are not yet a
    consistent point of the bucket); off: they wait until the snapshot completes."""
    walk_on_driver_below: Annotated[int, Field(ge=0)] = 200_000
    """An apply with fewer frames to walk walks them in the driver's Python, by the same
    columnar function Spark's Python workers run, one table of them: no shuffle into the
    walk's groups, no Arrow streams to and from workers; the driver holds the frames, their
    documents included, while it walks them. From this many frames on, the driver walks them
    in chunks of this many when it knows the run's files (``walk_in_chunks``), else Spark
    walks them (a job that reads the filter's columns only counts them first). On 2 cores the
    driver walks some 30,000 frames a second from the run's files, Spark some 10,000 (follow
    mode at 5,000 changes a second, 64 vbuckets). 0: Spark always walks."""
    walk_in_chunks: bool = True
    """When the apply knows the run's data files (``dcp-cdc run``, follow mode) and they hold
    ``walk_on_driver_below`` frames or more, the driver walks them all the same, at most that
    many frames and 64 MiB of the files at a time (the vbuckets split into chunks, each walked
    alone: a vbucket's walk needs only its own frames), and commits the rows itself: straight
    into the collection tables when silver holds nothing yet (an initial load), else into the
    live layer's pending table. Its memory follows the chunk, not the run; its local
    temporary folder holds the run's walked rows and their newest versions, about twice the
    run's documents uncompressed, until the apply ends. On 2 cores the
    initial load of 1M small documents on 1,024 vbuckets (1,017,066 frames) walks in 14.5 s
    this way, the driver's peak RSS 637 MB (its walk in one piece: 2.3 GB), where Spark's
    walk takes 46.5 s and its append 16.3 s more; 1M documents of 0.5-4 KB walk in 27.3 s
    and go into their tables in 8.7 s (through the pending table, the compaction's MERGE of
    them takes 67 s). Off: Spark walks them (which a cluster's many executors may do
    faster)."""
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
    live_layer: bool = True
    """Apply through the live layer: each apply appends its changes for every collection to
    one pending table per bucket (``silver.<bucket>__pending``: one commit whatever the
    number of collections), and each collection's view shows its ``_all`` table overlaid
    with them; a compaction MERGEs them into the ``_all`` tables when the pending table holds
    ``compact_files`` files or ``compact_bytes`` bytes, and before what needs the tables
    complete (a rollback with rows to retract, a drop or flush, a retire, history tables, a
    backfill, the tombstone purge). Readers of the ``_all`` tables and their change feed see
    a change at its compaction; the views, the typed views and the quality check see it at
    its apply. Off: every apply MERGEs into each collection table it touches (pending rows a
    run with the layer on left are compacted first)."""
    compact_files: Annotated[int, Field(ge=1)] = 30
    """With ``live_layer``: compact when the pending table holds this many files (an apply's
    append writes one, or one per 250,000 rows when Spark writes a large one)."""
    compact_bytes: Annotated[int, Field(ge=1)] = 64 * 1024 * 1024
    """With ``live_layer``: compact when the pending table holds this many bytes."""
    tombstone_retention_hours: Annotated[int, Field(ge=0)] = 168
    """How long deletion and expiration tombstones stay in ``..._all`` tables before the
    maintenance purge removes them. After the purge, a replayed older event of such a key in
    its vbucket at or below the purged seqno is still refused (``__tombstone_purges``)."""


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
    incremental_from_bytes: Annotated[int, Field(ge=0)] = 64 * 1024 * 1024
    """The size of a bucket's bronze events table (from its Delta log) from which a check
    reads only what arrived since the last one and keeps its state for the next: over
    columns (below ``columnar_below_bytes``: ``quality.<bucket>_check_columns``) or in Spark
    (``quality.<bucket>_check_state``); below it every check reads all of bronze and keeps
    nothing, which costs less on a small table than the state's bookkeeping (docs on
    quality: what a check reads)."""
    on_driver_below_bytes: Annotated[int, Field(ge=0)] = 4 * 1024 * 1024
    """The size of a bucket's bronze events table (from its Delta log) below which a check
    computes its metric frames in the driver's Python, reading bronze and silver through
    delta-rs at the versions it pinned: no Spark job, where Spark's check of a small bucket
    pays for dozens of small jobs and the JVM's compiling of each (docs on quality: what a
    check reads). Above it (and from ``incremental_from_bytes`` on, whichever is lower)
    Spark computes them. 0: Spark always does."""
    columnar_below_bytes: Annotated[int, Field(ge=0)] = 4 * 1024**3
    """The size of a bucket's bronze events table below which a check computes its metric
    frames in the driver over Arrow columns (``pipelines.quality.small.columnar``: bronze's
    items as columns, its control frames as rows), all of bronze every time, no Spark job:
    about 10 s for 1,000,000 frames where Spark's check over everything takes minutes. Above
    it, or for a bucket whose bronze holds frames with required columns null, the row check
    (below ``on_driver_below_bytes``) or Spark's does. The driver holds a share of the
    vbuckets of at most 1,500,000 frames at a time (about 2 GB at 1,000,000), the others
    spilled to local Arrow files. 0: never."""

    @field_validator("severity")
    @classmethod
    def _expectation_keys(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _EXPECTATION_KEY.fullmatch(k)]
        if bad:
            raise ValueError(f"keys must look like 'suite' or 'suite.expectation', got {bad}")
        return value


class MaintenanceConfig(ConfigModel):
    """The daily maintenance job (``python -m pipelines.maintenance.job``, ``dcp-cdc maintain``);
    it also purges tombstones (``silver.tombstone_retention_hours``) and old quality results
    (``quality.results_retention_days``)."""

    optimize: bool = True
    """OPTIMIZE every table: compacts small files and re-clusters the liquid-clustered ones
    (bronze events by ``(vbucket, by_seqno)``, silver by ``(_vbucket, key)``)."""
    vacuum_retention_hours: Annotated[int, Field(ge=0)] = 168
    """VACUUM removes files unreferenced for longer than this; time travel and change data
    feed reads further back stop working. Below 168 Delta's safety check is turned off for
    the maintenance session only."""
