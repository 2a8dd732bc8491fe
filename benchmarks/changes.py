"""Synthetic silver inputs for the apply and peer benchmarks, built with Spark (deterministic).

- A silver collection table (``..._all``, the product's own schema, clustering and
  properties) of ``keys`` live documents: key ``doc::<index, 10 digits>``, vbucket as
  Couchbase maps it (CRC32 of the key, 1024 vbuckets), a ~200-byte JSON body, seqno
  ``index + 1``, rev seqno 1. Written in (vbucket, key) order, so files hold key ranges of
  few vbuckets, as OPTIMIZE would leave a clustered table.
- A batch of ``changes`` walked change rows (:data:`pipelines.schemas.WALKED`, what
  ``merge_changes`` takes): 70 % updates of existing keys, 10 % deletions of existing keys,
  20 % inserts of new keys. The existing keys are spread evenly over the whole table
  (index ``j * 1_000_003 mod keys``, distinct), as a real batch spreads over every vbucket.
  Every change has a seqno above the table's (``keys + 1 + j``), so each one wins its MERGE.

Seqnos increase with the key index across vbuckets rather than per vbucket: MERGE only ever
compares the seqnos of one key, so this changes nothing for the apply.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.schemas import SILVER, WALKED
from pipelines.silver.transforms import modified_at

VBUCKETS = 1024
STRIDE = 1_000_003  # prime: j * STRIDE mod keys visits distinct keys, evenly spread
UPDATE, DELETE = 0.7, 0.1  # the rest are inserts
COLLECTION_ID = 0
INITIAL_RUN, BATCH_RUN = "bench-initial", "bench-batch"
CAS_BASE = 0x17A8B0D8E6F40000


def key_of(index: Column) -> Column:
    return F.format_string("doc::%010d", index)


def vbucket_of(key: Column) -> Column:
    """Couchbase's key → vbucket map (``dcp_cdc.simulator.model.vbucket_of``)."""
    crc = F.crc32(key.cast("binary"))
    return ((F.shiftright(crc, 16).bitwiseAND(0x7FFF)) % VBUCKETS).cast("int")


def vb_uuid_of(vbucket: Column) -> Column:
    return F.xxhash64(F.lit("vb-uuid"), vbucket)


def doc_of(index: Column, version: Column) -> Column:
    """A ~200-byte JSON order document; ``version`` changes its content."""
    h = F.xxhash64(index, version).bitwiseAND(F.lit(0x7FFF_FFFF_FFFF_FFFF))
    return F.format_string(
        '{"id":%d,"type":"order","version":%d,"customer":{"name":"customer-%05d","tier":"%s"},'
        '"items":[{"sku":"sku-%04d","qty":%d},{"sku":"sku-%04d","qty":%d}],'
        '"total":%d.%02d,"note":"héllo wörld"}',
        index,
        version,
        h % 100_000,
        F.substring(F.lit("abc"), (h % 3 + 1).cast("int"), 1),
        F.shiftright(h, 8) % 10_000,
        h % 9 + 1,
        F.shiftright(h, 24) % 10_000,
        h % 5 + 1,
        F.shiftright(h, 40) % 1000,
        h % 100,
    )


def table_rows(spark: SparkSession, keys: int) -> DataFrame:
    """The silver table's rows (:data:`pipelines.schemas.SILVER`), in write order."""
    idx = F.col("id")
    rows = spark.range(keys).select(
        key_of(idx).alias("key"),
        doc_of(idx, F.lit(1)).alias("doc"),
        F.lit(None).cast("binary").alias("doc_binary"),
        F.lit(None).cast("map<string,string>").alias("xattrs"),
        F.lit(COLLECTION_ID).cast("long").alias("_collection_id"),
        vbucket_of(key_of(idx)).alias("_vbucket"),
        vb_uuid_of(vbucket_of(key_of(idx))).alias("_vb_uuid"),
        (idx + 1).alias("_seqno"),
        F.lit(1).cast("long").alias("_rev_seqno"),
        (F.lit(CAS_BASE) + idx).alias("_cas"),
        F.lit(0).cast("long").alias("_flags"),
        F.lit(0).cast("long").alias("_expiry"),
        F.lit(False).alias("_deleted"),
        F.lit("upsert").alias("_change"),
        F.lit("2026-01-01 00:00:00").cast("timestamp").alias("_applied_at"),
        F.lit(INITIAL_RUN).alias("_ingest_run_id"),
        modified_at("_cas").alias("_modified_at"),
    )
    return rows.select(*SILVER.fieldNames())


def change_rows(spark: SparkSession, keys: int, changes: int) -> DataFrame:
    """``changes`` walked change rows against a table of ``keys`` keys (see the module)."""
    if changes * (UPDATE + DELETE) > keys:
        raise ValueError(f"{changes} changes need at least {changes * (UPDATE + DELETE):.0f} keys")
    j = F.col("id")
    updates, deletes = int(changes * UPDATE), int(changes * DELETE)
    existing = j < updates + deletes
    index = F.when(existing, (j * STRIDE) % keys).otherwise(keys + j - updates - deletes)
    op = (
        F.when(j < updates, "mutation")
        .when(j < updates + deletes, "deletion")
        .otherwise("mutation")
    )
    mutation = op == "mutation"
    seqno = F.lit(keys + 1) + j
    out = (
        spark.range(changes)
        .withColumn("index", index)
        .withColumn("op", op)
        .select(
            F.lit("change").alias("kind"),
            vbucket_of(key_of(F.col("index"))).alias("vbucket"),
            F.col("op"),
            F.lit(COLLECTION_ID).cast("long").alias("collection_id"),
            key_of(F.col("index")).cast("binary").alias("key"),
            F.when(mutation, doc_of(F.col("index"), seqno).cast("binary"))
            .otherwise(F.lit(b"").cast("binary"))
            .alias("value"),
            mutation.alias("is_json"),
            seqno.alias("by_seqno"),
            F.when(existing, 2).otherwise(1).cast("long").alias("rev_seqno"),
            (F.lit(CAS_BASE) + seqno * 65536).alias("cas"),
            F.lit(0).cast("long").alias("flags"),
            F.lit(0).cast("long").alias("expiration"),
            vb_uuid_of(vbucket_of(key_of(F.col("index")))).alias("in_vb_uuid"),
            F.lit(BATCH_RUN).alias("ingest_run_id"),
        )
    )
    return out.select(
        *[
            F.col(f.name) if f.name in out.columns else F.lit(None).cast(f.dataType).alias(f.name)
            for f in WALKED.fields
        ]
    )
