"""Silver against the simulator's truth: the live rows of every collection table, the truth's
documents, and the assertion that they are equal field by field."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dcp_cdc.protocol import cas_time
from dcp_cdc.simulator import SimulationResult
from pipelines.lake.delta_io import static_plan_session
from pipelines.schemas import SILVER
from pipelines.silver.live import bucket_rows
from pipelines.tables import BucketTables, all_rows


def silver_live(
    spark: SparkSession, bucket: str, *, compacted: bool = False
) -> dict[tuple[int, str], dict[str, Any]]:
    """Every non-deleted row of every live collection (expired ones included) as its view
    shows it (the live layer's pending rows overlaid: one query for the bucket), or with
    ``compacted`` as its ``_all`` table holds it (no pending row overlaid)."""
    registry = spark.table(BucketTables(bucket).registry).where("status != 'retired'").collect()
    views = sorted({(r["table_name"], r["collection_id"]) for r in registry})
    if not views:
        return {}
    if compacted:
        shown = [spark.table(all_rows(view)).select(*SILVER.fieldNames()) for view, _ in views]
        table = shown[0]
        for more in shown[1:]:
            table = table.unionByName(more)
    else:
        table = bucket_rows(static_plan_session(spark), bucket, views, SILVER.fieldNames())
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    for r in table.where(~F.col("_deleted")).collect():
        assert (r["_collection_id"], r["key"]) not in rows
        rows[(r["_collection_id"], r["key"])] = r.asDict()
    return rows


def truth_live(result: SimulationResult) -> dict[tuple[int, str], dict[str, Any]]:
    """The documents the bucket holds at the end, by collection id and key."""
    docs = {}
    for line in (result.out / "truth" / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["key"] if "key" in d else base64.b64decode(d["key_b64"]).decode("utf-8", "replace")
        docs[(d["collection_id"], key)] = d
    return docs


def assert_equal_to_truth(
    spark: SparkSession,
    bucket: str,
    result: SimulationResult,
    key_prefix: str = "",
    *,
    compacted: bool = False,
) -> None:
    """Live silver rows (of keys with ``key_prefix``) equal the truth: keys, bodies, user
    xattrs, seqno, rev seqno, expiry, flags, cas, the time of the cas and vbucket
    (``compacted``: the ``_all`` tables alone, :func:`silver_live`)."""
    live = silver_live(spark, bucket, compacted=compacted)
    silver = {k: v for k, v in live.items() if k[1].startswith(key_prefix)}
    truth = truth_live(result)
    assert set(silver) == set(truth), (
        f"missing {sorted(set(truth) - set(silver))[:3]}, extra {sorted(set(silver) - set(truth))[:3]}"
    )
    for ident, d in truth.items():
        row = silver[ident]
        if d["is_json"]:
            assert row["doc"] == d["value"] and row["doc_binary"] is None
        else:
            assert row["doc_binary"] == base64.b64decode(d["value_b64"]) and row["doc"] is None
        user = {k: v for k, v in (d["xattrs"] or {}).items() if not k.startswith("_")}
        assert (row["xattrs"] or {}) == user
        assert (row["_seqno"], row["_rev_seqno"], row["_expiry"], row["_flags"]) == (
            d["seqno"],
            d["rev_seqno"],
            d["expiry"],
            d["flags"],
        )
        assert row["_cas"] == (d["cas"] - (1 << 64) if d["cas"] >= 1 << 63 else d["cas"])
        assert utc(row["_modified_at"]) == cas_time(d["cas"])
        assert row["_vbucket"] == d["vbucket"]


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """A timestamp as collected (naive, the machine's local time) as an aware UTC one."""
    return value.astimezone(dt.UTC) if value is not None else None
