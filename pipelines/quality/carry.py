"""What a check carries to the next: ``quality.<bucket>_check_state``.

A check that starts from it reads only the bronze frames of the ingest runs committed since
(and the unsettled tail of each stream they continue), not all of bronze
(:mod:`pipelines.quality.compute`). Each kind of record is a small DataFrame, kept as one
JSON row per record beside its schema, all written in one Delta commit that replaces the
last check's:

- ``seeds``: per (session, vbucket), where its unsettled tail starts (``cut_*``, the run of
  that frame), the windows' values just before it, and the last position checked;
- ``settled`` and ``tails``: per stream, what its frames before and from the cut say of it
  (:func:`pipelines.quality.streams.stream_partials`);
- ``data_max``: per (session, vbucket, vb uuid), the highest data seqno before and from the
  cut; ``duplicates``: the repeated seqnos found;
- ``branches``, ``cluster``, ``cuts``, ``dead``, ``files``: the newest failover logs that
  opened streams, the cluster's recorded history, collection drops and creates, the changes
  rollbacks removed, and each capture file's counts;
- ``reconciliation``: the last ``silver_reconciliation`` rows; ``apart`` in the meta record
  names the first collection whose bronze and silver sides differed then.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines import schemas
from pipelines.lake import delta_io, table_entries
from pipelines.tables import BucketTables

FORMAT = 1
"""The layout of the records; a state of another format is not read (the check runs full)."""
KINDS = (
    "seeds",
    "settled",
    "tails",
    "data_max",
    "duplicates",
    "branches",
    "cluster",
    "cuts",
    "dead",
    "files",
    "reconciliation",
)
META = "meta"


@dataclass
class Carried:
    """A check's carried state: the table versions it read (``at``), the last bronze run it
    read of the events and quarantine tables (``txns``: their ``txnVersion``), when it ran,
    and its records."""

    at: dict[str, int]
    txns: dict[str, int | None]
    apart: str | None = None
    """The first collection whose bronze and silver sides differed (None: none did)."""
    checked_at: float = field(default_factory=time.time)
    frames: dict[str, DataFrame] = field(default_factory=dict)
    held: DataFrame | None = None
    """The local copy the frames of a state read back filter (:meth:`release` frees it)."""

    def release(self) -> None:
        if self.held is not None:
            self.held.unpersist()

    def __getitem__(self, kind: str) -> DataFrame:
        return self.frames[kind]


def read(spark: SparkSession, bucket: str) -> Carried | None:
    """The state the last check of ``bucket`` left, or None (no check yet, or one of another
    format)."""
    table = BucketTables(bucket).check_state
    if not table_entries.exists(spark, table):
        return None
    # read once: each kind is a filter of the same local copy, not a scan of the table
    rows = spark.table(table).localCheckpoint(eager=True)
    meta_rows = rows.where(F.col("kind") == META).collect()
    if len(meta_rows) != 1:
        return None
    meta = json.loads(meta_rows[0]["row"])
    if meta.get("format") != FORMAT or set(meta.get("schemas", {})) != set(KINDS):
        rows.unpersist()
        return None
    frames = {
        kind: rows.where(F.col("kind") == kind)
        .select(F.from_json("row", T.StructType.fromJson(json.loads(s))).alias("r"))
        .select("r.*")
        for kind, s in meta["schemas"].items()
    }
    return Carried(
        at={k: int(v) for k, v in meta["at"].items()},
        txns=dict(meta["txns"]),
        apart=meta["apart"],
        checked_at=float(meta["checked_at"]),
        frames=frames,
        held=rows,
    )


def write(
    spark: SparkSession, bucket: str, carried: Carried, properties: Mapping[str, str]
) -> None:
    """Replace ``bucket``'s state by ``carried`` (one commit)."""
    table = BucketTables(bucket).check_state
    if not table_entries.exists(spark, table):
        delta_io.ensure_database(spark, table)
        made_with = {**delta_io.FREQUENT_COMMITS, **properties}  # a commit every check
        delta_io.create_table(spark, table, schemas.CHECK_STATE, made_with)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "at": carried.at,
        "txns": carried.txns,
        "apart": carried.apart,
        "checked_at": carried.checked_at,
        "schemas": {k: carried[k].schema.json() for k in KINDS},
    }
    records = [
        carried[k].select(F.lit(k).alias("kind"), F.to_json(F.struct("*")).alias("row"))
        for k in KINDS
    ]
    everything = spark.createDataFrame([(META, json.dumps(meta))], schema=schemas.CHECK_STATE)
    for r in records:
        everything = everything.unionByName(r)
    delta_io.replace_rows(everything, table)
