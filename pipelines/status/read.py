"""Where ``dcp-cdc status`` finds each stage's positions, cheaply: only small tables and
metadata, never a scan of bronze's events or of silver's collection tables, and no JVM where
the tables' location is known (:mod:`pipelines.status.tables_read`; what each table says:
:mod:`pipelines.status.table_stages`).

- silver: its stream state (one row per vbucket): the consistent seqno, the last save (the
  last apply that moved it), open snapshots, and the CAS of the newest change applied in
  each vbucket (``last_cas``, whose time is the ``_modified_at`` of silver's newest row);
- bronze: the ingest log's rows of ingested files, per capture session the end state of its
  last file (the end seqno of the last snapshot marker of each vbucket; a session's end
  state carries those of its earlier files), the highest per vbucket over sessions;
- quality: the results of the newest run (its rows alone);
- the landing: the files a missing earlier file of their session holds back (the ingest log
  read for bronze against the landing listed, the header of each file not ingested read:
  what ingest would plan);
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

from dcp_cdc.config import AppConfig, BucketConfig
from pipelines import tables
from pipelines.bronze.held_back import held_back_now
from pipelines.status import table_stages
from pipelines.status.agent_side import capture_stage, cluster_stage, not_asked
from pipelines.status.lag import BucketStatus
from pipelines.status.tables_read import (
    DeltaFiles,
    TableSource,
    WarehouseThenCatalog,
    own_catalog,
)
from pipelines.tables import BucketTables


def tables_for(config: AppConfig) -> TableSource:
    """How ``config``'s tables are read: from the warehouse alone when the catalog is its own
    (:func:`~pipelines.status.tables_read.own_catalog`), else from the warehouse and, for a
    table not there, from the catalog through Spark."""
    files = DeltaFiles(config)
    if own_catalog(config):
        return files

    def catalog() -> TableSource:
        from pipelines.status.spark_tables import SparkTables  # pyspark: only now

        return SparkTables.of(config)

    return WarehouseThenCatalog(files, catalog)


def bucket_status(
    config: AppConfig,
    bucket: BucketConfig,
    *,
    cluster: bool = True,
    source: TableSource | None = None,
) -> BucketStatus:
    """One bucket's status, read from silver back to the cluster (``cluster``: ask it), its
    tables from ``source`` (by default :func:`tables_for`)."""
    source = source or tables_for(config)
    names = BucketTables(bucket.name)
    state = source.read(names.stream_state, table_stages.STATE_COLUMNS)
    silver, newest = table_stages.silver_stage(state)
    log = source.read(names.ingest_log, table_stages.LOG_COLUMNS)
    bronze = table_stages.bronze_stage(log)
    results = source.read(names.results, table_stages.RESULTS_COLUMNS)
    quality = table_stages.last_quality(results, tables.report_page(config, bucket.name))
    held = () if log is None else held_back_now(config, bucket, table_stages.log_state(log))
    capture = capture_stage(config, bucket)
    asked = cluster_stage(config, bucket) if cluster else not_asked("--no-cluster")
    return BucketStatus(bucket.name, (asked, capture, bronze, silver), newest, quality, tuple(held))


def run(
    config: AppConfig,
    bucket: str | None = None,
    *,
    cluster: bool = True,
    source: TableSource | None = None,
) -> list[BucketStatus]:
    """Every configured bucket's status (or the one named)."""
    source = source or tables_for(config)
    return [bucket_status(config, b, cluster=cluster, source=source) for b in config.bucket(bucket)]
