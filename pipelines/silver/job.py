"""The silver apply job: bronze events → one current-state Delta table per collection.

Per run and bucket:

1. read the bronze frames no run has consumed yet (from the oldest run holding an unfinished
   snapshot of some vbucket) and walk each vbucket's frames in session order
   (:mod:`pipelines.silver.walk`, inside ``applyInArrow``): only complete snapshots commit;
2. register collections from committed system events (``silver.<bucket>__collections``);
3. retract rolled-back changes: every key of vbucket V with ``_seqno > R`` returns to its last
   state at or before R on the surviving branch, rebuilt from bronze;
4. apply drops and flushes: rows of the collection in V below the event's seqno go;
5. MERGE the newest committed change per key into its collection's table, only where it is
   newer than the row (replays and reordered batches are harmless); deletions and expirations
   become tombstones;
6. save each vbucket's position and state (``silver.<bucket>__stream_state``).

The table a user queries, ``silver.<bucket>__<scope>__<collection>``, is a view of live
documents (no tombstones, nothing past its expiry) over ``..._all``, which keeps tombstones.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from dcp_cdc.config import AppConfig, BucketConfig, load_config
from dcp_cdc.errors import ConfigError, DcpError
from dcp_cdc.naming import identifier
from pipelines.bronze.job import table_names as bronze_tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("dcp_cdc.silver")
MAX_COMMIT_ATTEMPTS = 5


class SilverConflictError(DcpError):
    """Another writer kept winning the Delta commit race on a silver table."""


def bucket_prefix(bucket: str) -> str:
    return f"silver.{identifier(bucket)}"


def collection_table(bucket: str, scope: str, collection: str) -> str:
    """The name users query (a view of live documents); ``_all`` holds tombstones too."""
    return f"{bucket_prefix(bucket)}__{identifier(scope)}__{identifier(collection)}"


def registry_table(bucket: str) -> str:
    return f"{bucket_prefix(bucket)}__collections"


def state_table(bucket: str) -> str:
    return f"{bucket_prefix(bucket)}__stream_state"


def purges_table(bucket: str) -> str:
    return f"{bucket_prefix(bucket)}__tombstone_purges"


@dataclass
class ApplySummary:
    bucket: str
    frames: int = 0
    changes: int = 0
    rollbacks: list[tuple[int, int]] = field(default_factory=list)
    rebuilt_keys: int = 0
    dropped_rows: int = 0
    ignored: int = 0
    tables: dict[str, int] = field(default_factory=dict)  # table -> rows merged
    open_snapshots: int = 0
    seconds: float = 0.0

    def render(self) -> str:
        lines = [
            f"silver apply of bucket {self.bucket!r}: {self.frames} frames read, {self.changes} "
            f"committed changes into {len(self.tables)} tables, {len(self.rollbacks)} rollbacks "
            f"({self.rebuilt_keys} keys rebuilt), {self.dropped_rows} rows removed by drops and "
            f"flushes, {self.ignored} changes to dropped collections ignored, "
            f"{self.open_snapshots} vbuckets with an open snapshot, {self.seconds:.1f} s"
        ]
        lines += [f"  {t}: {n} changes" for t, n in sorted(self.tables.items())]
        return "\n".join(lines)


# --- the run -----------------------------------------------------------------------------


def apply_bucket(
    spark: SparkSession,
    config: AppConfig,
    bucket: BucketConfig,
    *,
    collection: str | None = None,
    rebuild: bool = False,
) -> ApplySummary:
    """One run for one bucket. ``collection`` (``SCOPE.NAME``) alone merges only that
    collection's changes; with ``rebuild`` (a backfill) it names the one table to rebuild."""
    from pyspark.sql import functions as F

    from pipelines.silver import transforms

    started = time.perf_counter()
    summary = ApplySummary(bucket.name)
    name = bucket.name
    transforms.ensure_support_tables(spark, name, config.tables.properties)
    bronze = bronze_tables(name)
    if not spark.catalog.tableExists(bronze["events"]):
        log.info("no bronze table for bucket %s yet", name)
        return summary
    states = transforms.read_states(spark, state_table(name))
    if rebuild:
        emptied = empty_tables(spark, name, collection)
        log.info("rebuilding %s of bucket %s from all of bronze", ", ".join(emptied), name)
        # Every vbucket is walked from its first frame again; the tables not emptied see
        # only changes they already hold, which the MERGE guard leaves alone.
        states = {}
    frames, again = transforms.unconsumed_frames(spark, bronze, states)
    if again:
        log.info("vbuckets %s got frames of an older session late: walked again", sorted(again))
    walked = transforms.walk_vbuckets(
        spark, frames, states, again, eager=config.silver.eager_apply
    ).cache()
    try:
        controls = [
            r.asDict(recursive=True) for r in walked.where(F.col("kind") != "change").collect()
        ]
        summary.frames = sum(r["frames"] or 0 for r in controls if r["kind"] == "state")
        new_states = {
            r["vbucket"]: json.loads(r["state"]) for r in controls if r["kind"] == "state"
        }
        if not new_states:
            summary.seconds = time.perf_counter() - started
            return summary
        summary.ignored = sum(r["ignored"] or 0 for r in controls if r["kind"] == "state")
        summary.open_snapshots = sum(1 for s in new_states.values() if s["open_snapshot"])
        changes = walked.where(F.col("kind") == "change")
        change_cids = {
            r["collection_id"] for r in changes.select("collection_id").distinct().collect()
        }
        registry = transforms.update_registry(
            spark, name, controls, config.tables.properties, change_cids
        )
        rollbacks = [
            (r["vbucket"], r["rollback_seqno"]) for r in controls if r["kind"] == "rollback"
        ]
        summary.rollbacks = rollbacks
        if collection is not None and not rebuild:
            scope, _, coll = collection.partition(".")
            keep = [
                c["collection_id"] for c in registry if c["scope"] == scope and c["name"] == coll
            ]
            changes = changes.where(F.col("collection_id").isin(keep))
        if rollbacks:
            summary.rebuilt_keys = transforms.rebuild_rolled_back(
                spark, name, bronze["events"], registry, rollbacks, new_states
            )
        summary.dropped_rows = transforms.apply_drops(spark, name, registry, controls)
        summary.tables = transforms.merge_changes(spark, name, registry, changes)
        summary.changes = sum(summary.tables.values())
        transforms.retire_dropped(spark, name, registry, new_states, config)
        transforms.save_states(spark, state_table(name), states, new_states)
    finally:
        walked.unpersist()
    summary.seconds = time.perf_counter() - started
    log.info(summary.render())
    return summary


def empty_tables(spark: SparkSession, bucket: str, collection: str | None) -> list[str]:
    """Delete every row of the bucket's collection tables (or of ``SCOPE.NAME``'s alone) and
    their tombstone-purge marks, the first step of a rebuild; returns the tables emptied."""
    registry = (
        [r.asDict() for r in spark.table(registry_table(bucket)).collect()]
        if spark.catalog.tableExists(registry_table(bucket))
        else []
    )
    live = [r for r in registry if r["status"] != "retired"]
    if collection is not None:
        chosen = [r for r in live if f"{r['scope']}.{r['name']}" == collection]
        if not chosen:
            known = ", ".join(sorted(f"{r['scope']}.{r['name']}" for r in live)) or "none"
            raise ConfigError(
                f"collection {collection!r} is not a live collection of bucket {bucket!r} "
                f"(known: {known})"
            )
        live = chosen
    tables = [f"{r['table_name']}_all" for r in live]
    marks = purges_table(bucket)
    for table in tables:
        if spark.catalog.tableExists(table):
            spark.sql(f"DELETE FROM {table}")
        # The table holds no key now: a purge mark would refuse every change at or below it,
        # live documents too. The walk over bronze brings the purged tombstones back.
        if spark.catalog.tableExists(marks):
            spark.sql(f"DELETE FROM {marks} WHERE table_name = '{table}'")
    return tables


def purge_tombstones(
    spark: SparkSession, config: AppConfig, bucket: BucketConfig
) -> dict[str, int]:
    """Maintenance: tombstones older than ``silver.tombstone_retention_hours`` leave every
    collection table of ``bucket``; returns rows removed per table (the user-facing name)."""
    from pipelines.silver import transforms

    if not spark.catalog.tableExists(registry_table(bucket.name)):
        return {}
    transforms.ensure_support_tables(spark, bucket.name, config.tables.properties)
    registry = [
        r.asDict(recursive=True) for r in spark.table(registry_table(bucket.name)).collect()
    ]
    purged = transforms.purge_tombstones(
        spark, bucket.name, registry, config.silver.tombstone_retention_hours
    )
    log.info("tombstone purge of bucket %s: %s", bucket.name, purged or "nothing to purge")
    return purged


def run(
    config: AppConfig,
    bucket: str | None = None,
    *,
    collection: str | None = None,
    rebuild: bool = False,
    spark: SparkSession | None = None,
) -> list[ApplySummary]:
    from pipelines.spark_session import session_for

    buckets = config.bucket(bucket)
    session = spark or session_for(config, "dcp-cdc-silver")
    return [
        apply_bucket(session, config, b, collection=collection, rebuild=rebuild) for b in buckets
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc apply`` besides ``--config`` and ``--bucket``."""
    parser.add_argument(
        "--collection", metavar="SCOPE.NAME", help="only this collection's table"
    )
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="a backfill: empty the tables (or --collection's) and apply all of bronze again",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc apply``: one summary per bucket."""
    config = load_config(args.config)
    for summary in run(config, args.bucket, collection=args.collection, rebuild=args.rebuild):
        out.write(summary.render() + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.silver.job`` and ``spark-submit pipelines/silver/job.py``."""
    from pipelines.cli import job_main

    return job_main("apply", argv)


if __name__ == "__main__":
    raise SystemExit(main())
