"""Silver apply: one batch of walked changes MERGEd into collection tables of growing size.

For each table size (default 1M and 10M live keys) the same kind of batch (default 1M
changes: 70 % updates, 10 % deletions, 20 % inserts, spread over every vbucket; see
:mod:`benchmarks.changes`) goes through the product's ``merge_changes`` (newest change per
key, then one Delta MERGE per collection). Before every run the table is restored to its
built version (``RESTORE TABLE ... TO VERSION AS OF``), so each run does the same work.

Cases per size: ``silver_rows`` alone (the newest-per-key window, written nowhere) and the
whole ``merge_changes``. The table and batch of each size are built once and cached under
``benchmarks/.data/apply`` (the 10M table takes minutes). The result says how the apply time
grows with the table: the goal is at most 1.5x from 1M to 10M keys.

Each size runs with deletion vectors on and off (``--deletion-vectors``), on tables of their
own, the product's default properties otherwise: with them a MERGE marks the rows it changes
in the files it touches instead of rewriting those files.

``--document-variant on`` measures tables with the companion column ``doc_variant`` too
(``[silver] document_variant``: the MERGE parses each document it writes), each case with the
table's size (``DESCRIBE DETAIL``'s ``sizeInBytes``), and what turning the setting on costs a
table of that size once: the UPDATE that fills the column of a table made without it (on a
shallow clone of the built table, so the cached table stays as built).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

from benchmarks.changes import DELETE, UPDATE, change_rows, table_rows
from benchmarks.common import Case, report, timed

DATA = Path(__file__).resolve().parent / ".data" / "apply"
GENERATOR = 2  # bump when benchmarks/changes.py changes what it builds
ROWS_PER_FILE = 250_000
_METRICS = (
    "numSourceRows",
    "numTargetRowsUpdated",
    "numTargetRowsInserted",
    "numTargetFilesAdded",
    "numTargetFilesRemoved",
    "numTargetDeletionVectorsAdded",
    "numTargetDeletionVectorsRemoved",
    "numTargetBytesAdded",
    "numTargetBytesRemoved",
    "numTargetRowsCopied",
    "scanTimeMs",
    "rewriteTimeMs",
    "executionTimeMs",
    "materializeSourceTimeMs",
)


def table_properties(
    deletion_vectors: bool = True, change_data_feed: bool = True
) -> dict[str, str]:
    """The Delta properties of the benchmarks' tables (ours and AutoCDC's alike): the
    product's defaults, deletion vectors and change data feed as asked."""
    from dcp_cdc.config import TableConfig

    return TableConfig().properties | {
        "delta.enableDeletionVectors": str(deletion_vectors).lower(),
        "delta.enableChangeDataFeed": str(change_data_feed).lower(),
    }


def bucket_of(
    keys: int,
    deletion_vectors: bool = True,
    change_data_feed: bool = True,
    document_variant: bool = False,
) -> str:
    return (
        f"bench_{keys}"
        + ("" if deletion_vectors else "_nodv")
        + ("" if change_data_feed else "_nocdf")
        + ("_variant" if document_variant else "")
    )


def registry_of(
    keys: int,
    deletion_vectors: bool = True,
    change_data_feed: bool = True,
    document_variant: bool = False,
) -> list[dict[str, Any]]:
    from pipelines.tables import BucketTables

    bucket = bucket_of(keys, deletion_vectors, change_data_feed, document_variant)
    name = BucketTables(bucket).collection("_default", "_default")
    return [{"collection_id": 0, "table_name": name, "status": "live"}]


def session(event_log: Path | None = None) -> Any:
    """The product's session settings (``[spark]`` defaults) on the benchmark's warehouse."""
    from dcp_cdc.config import SparkConfig
    from pipelines.lake.spark_session import build_spark_session

    defaults = SparkConfig()
    extra = dict(defaults.conf)
    if event_log is not None:
        event_log.mkdir(parents=True, exist_ok=True)
        extra |= {"spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log.as_uri()}
    return build_spark_session(
        "dcp-cdc-bench-apply",
        DATA / "warehouse",
        master=defaults.master,
        shuffle_partitions=defaults.shuffle_partitions,
        extra_conf=extra,
    )


def prepare(
    spark: Any,
    keys: int,
    changes: int,
    *,
    fresh: bool = False,
    deletion_vectors: bool = True,
    change_data_feed: bool = True,
    document_variant: bool = False,
) -> tuple[str, int, Path]:
    """The ``_all`` table of ``keys`` keys (built or reused), its built version, and the
    parquet folder of the change batch."""
    from pyspark.sql import functions as F

    from pipelines import schemas
    from pipelines.silver import registry
    from pipelines.tables import all_rows, view_of

    dv, cdf, variant = deletion_vectors, change_data_feed, document_variant
    table = all_rows(registry_of(keys, dv, cdf, variant)[0]["table_name"])
    marker = DATA / f"table-{bucket_of(keys, dv, cdf, variant)}.json"
    batch = DATA / f"changes-g{GENERATOR}-{keys}-{changes}.parquet"
    properties = table_properties(dv, cdf)
    wanted = {"generator": GENERATOR, "keys": keys, "properties": properties}
    built = json.loads(marker.read_text()) if marker.exists() else {}
    if fresh or {k: built.get(k) for k in wanted} != wanted or not spark.catalog.tableExists(table):
        print(f"  building {table} ({keys:,} keys)", flush=True)
        marker.unlink(missing_ok=True)
        spark.sql(f"DROP TABLE IF EXISTS {table}")
        registry.ensure_support_tables(spark, bucket_of(keys, dv, cdf, variant), properties)
        registry.ensure_collection_table(
            spark, view_of(table), properties, document_variant=variant
        )
        files = max(1, keys // ROWS_PER_FILE)
        rows = table_rows(spark, keys)
        if variant:
            rows = rows.withColumn(schemas.DOCUMENT_VARIANT, F.try_parse_json("doc"))
        (
            rows.repartitionByRange(files, "_vbucket", "key")
            .sortWithinPartitions("_vbucket", "key")
            .write.format("delta")
            .option("optimizeWrite", "false")  # keep the (vbucket, key) ranges of the files
            .mode("append")
            .saveAsTable(table)
        )
        version = spark.sql(f"DESCRIBE HISTORY {table} LIMIT 1").first()["version"]
        marker.write_text(json.dumps(wanted | {"version": version}) + "\n")
    for old in DATA.glob("changes-*.parquet"):  # of an older generator: the same for any table
        if not old.name.startswith(f"changes-g{GENERATOR}-"):
            shutil.rmtree(old)
    if not batch.exists():
        print(f"  building a batch of {changes:,} changes", flush=True)
        change_rows(spark, keys, changes).write.parquet(str(batch))
    return table, json.loads(marker.read_text())["version"], batch


def jvm_cpu_seconds(spark: Any) -> float:
    """CPU seconds the Spark JVM has used (all its threads): unlike wall time, barely
    affected by other work on the machine."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def last_merge_metrics(spark: Any, table: str) -> dict[str, int]:
    row = spark.sql(f"DESCRIBE HISTORY {table} LIMIT 1").first()
    metrics = row["operationMetrics"] or {}
    return {k: int(metrics[k]) for k in _METRICS if k in metrics}


def table_bytes(spark: Any, table: str) -> int:
    """The size of the data files of ``table``'s current version."""
    return int(spark.sql(f"DESCRIBE DETAIL {table}").first()["sizeInBytes"])


def measure_fill(spark: Any, table: str, version: int, runs: int) -> list[float]:
    """Seconds of turning ``[silver] document_variant`` on for ``table`` (made without it, at
    its built ``version``): the column added and filled, on a fresh shallow clone each run."""
    from pipelines import schemas
    from pipelines.silver import registry

    clone = f"{table}_fill"
    seconds = []
    for _ in range(runs):
        spark.sql(f"DROP TABLE IF EXISTS {clone}")
        spark.sql(f"CREATE TABLE {clone} SHALLOW CLONE {table} VERSION AS OF {version}")
        spark.sql(f"ALTER TABLE {clone} ADD COLUMNS ({schemas.DOCUMENT_VARIANT} VARIANT)")
        took, filled = timed(lambda: registry.fill_document_variant(spark, clone), 1)
        if filled != spark.table(clone).where("doc IS NOT NULL").count():
            raise AssertionError(f"{clone}: {filled} rows filled")
        seconds += took
    spark.sql(f"DROP TABLE IF EXISTS {clone}")
    return seconds


def measure(
    spark: Any,
    keys: int,
    changes: int,
    runs: int,
    *,
    fresh: bool = False,
    dv: bool = True,
    variant: bool = False,
    fill: bool = False,
) -> list[Case]:
    from pipelines import schemas
    from pipelines.silver import store, transforms

    table, version, batch = prepare(
        spark, keys, changes, fresh=fresh, deletion_vectors=dv, document_variant=variant
    )
    walked = spark.read.schema(schemas.WALKED).parquet(str(batch))
    registry = registry_of(keys, dv, document_variant=variant)

    def newest_rows() -> None:
        transforms.silver_rows(walked).write.format("noop").mode("overwrite").save()

    rows_seconds, _ = timed(newest_rows, runs)
    merge_seconds: list[float] = []
    merge_cpu: list[float] = []
    merged: dict[str, int] = {}
    built_bytes = 0
    for _ in range(runs):
        spark.sql(f"RESTORE TABLE {table} TO VERSION AS OF {version}")
        built_bytes = built_bytes or table_bytes(spark, table)
        cpu = jvm_cpu_seconds(spark)
        seconds, merged = timed(
            lambda: store.merge_changes(
                spark, bucket_of(keys, dv, document_variant=variant), registry, walked
            ),
            1,
        )
        merge_cpu.append(jvm_cpu_seconds(spark) - cpu)
        merge_seconds += seconds
    metrics = last_merge_metrics(spark, table)
    live = spark.table(table).where("NOT _deleted").count()
    inserts = changes - int(changes * UPDATE) - int(changes * DELETE)
    expected = keys - int(changes * DELETE) + inserts
    if live != expected or sum(merged.values()) != changes:
        raise AssertionError(
            f"{table}: expected {expected} live rows and {changes} rows merged, "
            f"got {live} and {merged}"
        )
    size = f"{keys // 1_000_000}M" if keys >= 1_000_000 else f"{keys // 1000}k"
    if variant:  # every live document's VARIANT is its JSON parsed, no tombstone has one
        column = schemas.DOCUMENT_VARIANT
        wrong = spark.table(table).where(
            f"CASE WHEN _deleted THEN {column} IS NOT NULL "
            f"ELSE {column} IS NULL OR to_json({column}) != to_json(parse_json(doc)) END"
        )
        if wrong.count():
            raise AssertionError(f"{table}: {wrong.count()} rows whose {column} is not doc's")
    setting = ("DVs on" if dv else "DVs off") + (", VARIANT" if variant else "")
    size += f", {setting}"
    cases = [
        Case(f"silver_rows -> {size} keys", changes, "changes", rows_seconds),
        Case(
            f"merge_changes -> {size}",
            changes,
            "changes",
            merge_seconds,
            extra={
                "table_keys": keys,
                "rows_merged": sum(merged.values()),
                "jvm_cpu_s": merge_cpu,
                "jvm_cpu_median_s": statistics.median(merge_cpu),
                "live_rows_after": live,
                "merge_metrics": metrics,
                "setting": setting,
                "table_bytes_built": built_bytes,
                "table_bytes_after": table_bytes(spark, table),
            },
        ),
    ]
    if fill:
        cases.append(
            Case(
                f"fill doc_variant -> {size.removesuffix(', VARIANT')}",
                keys,
                "rows",
                measure_fill(spark, table, version, runs),
            )
        )
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.apply", description=__doc__)
    parser.add_argument(
        "--keys", default="1000000,10000000", help="comma-separated table sizes (live keys)"
    )
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fresh", action="store_true", help="rebuild the cached tables")
    parser.add_argument("--event-log", type=Path, help="write Spark event logs here")
    parser.add_argument(
        "--deletion-vectors",
        default="on,off",
        help="comma-separated: on, off (the tables' delta.enableDeletionVectors)",
    )
    parser.add_argument(
        "--document-variant",
        default="off",
        help="comma-separated: off, on (tables with the doc_variant column, [silver] "
        "document_variant; with off too, the fill of a table made without it is measured)",
    )
    args = parser.parse_args(argv)
    sizes = [int(k) for k in args.keys.split(",")]
    settings = [v.strip() == "on" for v in args.deletion_vectors.split(",")]
    variants = [v.strip() == "on" for v in args.document_variant.split(",")]
    spark = session(args.event_log)
    try:
        cases: list[Case] = []
        for dv in settings:
            for variant in variants:
                for keys in sizes:
                    cases += measure(
                        spark,
                        keys,
                        args.changes,
                        args.runs,
                        fresh=args.fresh,
                        dv=dv,
                        variant=variant,
                        fill=not variant and True in variants,
                    )
    finally:
        spark.stop()
    merges = [c for c in cases if c.name.startswith("merge_changes")]
    merges[0].baseline = True
    growth, cpu_growth = {}, {}
    for setting in dict.fromkeys(m.extra["setting"] for m in merges):  # growth with the table
        same = [m for m in merges if m.extra["setting"] == setting]
        for m in same[1:]:
            growth[f"{m.name} / {same[0].name}"] = m.median / same[0].median
            cpu_growth[f"{m.name} / {same[0].name}"] = (
                m.extra["jvm_cpu_median_s"] / same[0].extra["jvm_cpu_median_s"]
            )
    report(
        "apply",
        cases,
        params={
            "changes": args.changes,
            "keys": sizes,
            "runs": args.runs,
            "time_growth": growth,
            "cpu_growth": cpu_growth,
        },
    )
    for m in merges:
        print(
            f"  {m.name}: JVM CPU {m.extra['jvm_cpu_median_s']:.1f} s (median), table "
            f"{m.extra['table_bytes_built'] / 2**20:.1f} MiB built, "
            f"{m.extra['table_bytes_after'] / 2**20:.1f} MiB after"
        )
    for what, ratio in growth.items():
        print(f"  growth {what}: wall {ratio:.2f}x, JVM CPU {cpu_growth[what]:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
