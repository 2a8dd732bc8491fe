"""The freshness benchmark's peer (``python -m benchmarks.freshness --peer``): Delta's
upsert-from-streaming pattern, fed by the same bronze, at the same load, on the same machine.

The capture agent and our ingest fill bronze as in our run (follow mode, its apply switched
off: :class:`IngestOnly`). The peer is one Structured Streaming query over the bronze events
table (``spark.readStream.format("delta").table(...)``, a checkpoint of its own,
``trigger(processingTime="0 seconds")``: a micro-batch as soon as the last one ends) whose
``foreachBatch`` (:meth:`Peer.upsert`) does what Delta's documentation shows for upserts from
a stream: it keeps the data events (mutations, deletions, expirations:
:data:`dcp_cdc.events.DATA_OPS`), the newest per (collection id, key) by seqno
(:func:`newest_changes`), caches them, and MERGEs each collection's rows into a Delta table of
its own (``peer.fresh__c<collection id in hex>``, keyed by ``key``): a newer seqno updates
the row (``whenMatchedUpdateAll`` with ``s._seqno > t._seqno``, which also makes a replayed
batch harmless), a new key is inserted. A deletion or expiration is kept as a tombstone
(``_deleted``), as silver's ``_all`` tables keep it, so that a deletion's seqno is visible to
the probe. The tables are made as silver's ``_all`` tables are (the same table properties:
deletion vectors and the change data feed as ``[silver]`` says; clustered by ``_vbucket``,
``key``), in the same Spark session settings (:func:`pipelines.lake.spark_session.session_for`).

It is the canonical pattern, not a correct CDC: it ignores snapshots (a change is applied
whether or not its snapshot is whole), rollbacks and failovers (a vbucket's seqnos that a new
vb uuid replaces stay applied), and collection drops and flushes (their rows stay). The
steady workload of the test producer has none of these after the initial load, so the peer's
tables can equal the producer's truth, and the benchmark checks whether they do.

Its freshness is measured as ours (:class:`benchmarks.freshness.Probe`): the end of a
streaming micro-batch is the query's commit file in its checkpoint (``commits/<batch id>``,
written after ``foreachBatch`` returns); the peer's tables as of then show, per vbucket, the
highest seqno applied, and a change is visible from the newest of their commits.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery

from benchmarks.freshness import BUCKET, Probe, Side, Ticks, median
from dcp_cdc.config import AppConfig
from dcp_cdc.events import DATA_OPS
from pipelines import schemas
from pipelines.bronze import store
from pipelines.bronze.job import ingest_bucket
from pipelines.follow.loop import Follower
from pipelines.follow.progress import Batch, BucketProgress
from pipelines.lake import delta_io
from pipelines.silver.registry import collection_properties
from pipelines.silver.transforms import version_rows

DATABASE = "peer"

ROWS = T.StructType(
    [
        f
        for f in schemas.SILVER.fields
        if f.name not in ("_vb_uuid", "_change", "_ingest_run_id", "_modified_at")
    ]
)
"""A peer table: a collection's documents by key, tombstones included."""


def peer_table(collection_id: int) -> str:
    """The peer's table of a collection (the benchmark's own name: not one of dcp-cdc's)."""
    return f"{DATABASE}.{BUCKET}__c{collection_id:x}"


def newest_changes(events: DataFrame) -> DataFrame:
    """Bronze events → the newest data event per (collection id, key) by seqno, as
    :data:`ROWS`: of the columns silver makes of a change
    (:func:`pipelines.silver.transforms.version_rows`: the user's xattrs only), those
    :data:`ROWS` keeps."""
    newest = Window.partitionBy("collection_id", "key").orderBy(F.col("by_seqno").desc())
    ranked = (
        events.where(F.col("op").isin(*DATA_OPS))
        .withColumn("_rank", F.row_number().over(newest))
        .where(F.col("_rank") == 1)
    )
    return version_rows(ranked).select(*ROWS.fieldNames())


class IngestOnly(Follower):
    """Follow mode with its apply switched off: each micro-batch ingests what landed into
    bronze; the peer's query applies it."""

    def micro_batch(self, progress: BucketProgress) -> Batch:
        started = time.perf_counter()
        ingested = ingest_bucket(self.spark, self.config, progress.bucket, hook=self.hook)
        ingest_s = time.perf_counter() - started
        progress.batches += 1
        progress.frames += ingested.frames
        batch = Batch(
            progress.bucket.name,
            progress.batches,
            ingested.frames,
            ingest_s,
            0.0,
            files=ingested.files,
            held_back=tuple(ingested.held_back),
        )
        self._say(
            f"{time.strftime('%H:%M:%S')} {progress.bucket.name}: batch {batch.number}, "
            f"{batch.frames} frames ingested in {ingest_s:.1f} s (no apply: the peer's)"
        )
        if self.on_batch is not None:
            self.on_batch(batch, progress)
        return batch


class PeerProbe(Probe):
    """The probe over the peer: a batch ends with the query's checkpoint commit; the peer's
    tables show its rows."""

    def __init__(self, tables: Path, checkpoint: Path, ticks: Ticks, period: float) -> None:
        super().__init__(tables, ticks, period)
        self.commits = checkpoint / "commits"

    def batches(self) -> list[tuple[int, float]]:
        found = []
        for commit in self.commits.glob("*"):
            if commit.name.isdigit():
                try:
                    found.append((int(commit.name), commit.stat().st_mtime))
                except FileNotFoundError:  # an old batch's, purged by the query meanwhile
                    continue
        return sorted(found)

    def tables(self) -> list[Path]:
        return list(self.silver.glob(f"{BUCKET}__c*"))


class _Progress(StreamingQueryListener):
    """The peer query's micro-batches that ran (their ``addBatch``): when each ended, its
    input rows, its seconds (``triggerExecution``) and those of its ``foreachBatch``."""

    def __init__(self) -> None:
        self.batches: list[dict[str, float]] = []

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryProgress(self, event: Any) -> None:
        took = event.progress.durationMs
        if "addBatch" in took:
            self.batches.append(
                {
                    "at": time.time(),
                    "rows": event.progress.numInputRows,
                    "trigger_s": took["triggerExecution"] / 1000,
                    "foreach_batch_s": took["addBatch"] / 1000,
                }
            )

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        return None


class Peer(Side):
    """The peer's side of the freshness benchmark (:class:`benchmarks.freshness.Side`)."""

    name = "peer"

    def __init__(self, spark: SparkSession, config: AppConfig, work: Path) -> None:
        super().__init__(spark, config)
        self.checkpoint = work / "peer_checkpoint"
        self.properties = collection_properties(config)
        self.made: dict[int, str] = {}
        self.progress = _Progress()
        self.query: StreamingQuery | None = None
        self.began_at = float("inf")

    def loop(self) -> type[IngestOnly]:
        return IngestOnly

    def started(self) -> None:
        """The query starts over bronze (made now if the first ingest found nothing) and
        applies what it holds (the initial load) before the workload starts."""
        events = store.ensure_tables(self.spark, self.config, BUCKET).events
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
        self.spark.streams.addListener(self.progress)
        self.query = (
            self.spark.readStream.format("delta")
            .table(events)
            .writeStream.queryName("freshness_peer")
            .foreachBatch(self.upsert)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime="0 seconds")
            .start()
        )
        self.query.processAllAvailable()
        self.began_at = time.time()

    def upsert(self, batch: DataFrame, batch_id: int) -> None:
        """One micro-batch of the stream: each collection's newest changes MERGEd into its
        table."""
        rows = newest_changes(batch).persist()
        try:
            collections = [r[0] for r in rows.select("_collection_id").distinct().collect()]
            for collection_id in sorted(collections):
                (
                    DeltaTable.forName(self.spark, self._table(collection_id))
                    .alias("t")
                    .merge(
                        rows.where(F.col("_collection_id") == collection_id).alias("s"),
                        "t.key = s.key",
                    )
                    .whenMatchedUpdateAll(condition="s._seqno > t._seqno")
                    .whenNotMatchedInsertAll()
                    .execute()
                )
        finally:
            rows.unpersist()

    def _table(self, collection_id: int) -> str:
        if collection_id not in self.made:
            table = peer_table(collection_id)
            delta_io.create_table(
                self.spark, table, ROWS, self.properties, cluster_by=("_vbucket", "key")
            )
            self.made[collection_id] = table
        return self.made[collection_id]

    def probe(self, ticks: Ticks, period: float) -> Probe:
        tables = Path(self.config.warehouse) / f"{DATABASE}.db"
        return PeerProbe(tables, self.checkpoint, ticks, period)

    def finish(self) -> None:
        """The last files ingested, and the query through them."""
        ingest_bucket(self.spark, self.config, self.config.buckets[0])
        if self.query is not None:
            self.query.processAllAvailable()

    def live_rows(self) -> dict[tuple[int, str], int]:
        found = {}
        for table in self.made.values():
            for r in (
                self.spark.table(table)
                .where(~F.col("_deleted"))
                .select("_collection_id", "key", "_seqno")
                .collect()
            ):
                found[(r["_collection_id"], r["key"])] = r["_seqno"]
        return found

    def figures(self, batches: list[dict[str, Any]]) -> dict[str, Any]:
        stream = [b for b in self.progress.batches if b["at"] >= self.began_at]
        return {
            "batches": len(stream),
            "batch_s_median": median([b["trigger_s"] for b in stream]),
            "foreach_batch_s_median": median([b["foreach_batch_s"] for b in stream]),
            "rows_per_batch_median": median([b["rows"] for b in stream]),
            "ingest_batches": len(batches),
            "ingest_s_median": median([b["ingest_s"] for b in batches]),
            "frames_per_batch_median": median([b["frames"] for b in batches]),
            "tables": sorted(self.made.values()),
        }

    def close(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.spark.streams.removeListener(self.progress)
