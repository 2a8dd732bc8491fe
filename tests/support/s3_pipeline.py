"""Bronze, silver, quality and maintenance with every table on S3: ``python -m
tests.support.s3_pipeline`` (a process of its own, since the S3 jars join a JVM only at start).

The simulator writes captures to a local landing folder; one dcp-cdc session (S3 jars, the
conditional-put log store) whose warehouse directory is ``--warehouse-uri`` on the moto server
ingests them, applies them to silver, compares silver with the simulator's truth, runs the
quality suites and maintenance (tombstone purge, OPTIMIZE, VACUUM), and prints a JSON summary.
The catalog stays the embedded one in ``--catalog`` (a shared catalog service is another
matter: docs/object-storage.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--catalog", type=Path, required=True)
    parser.add_argument("--warehouse-uri", required=True)
    parser.add_argument("--s3-conf", required=True, help="JSON of spark.hadoop.fs.s3a.* settings")
    args = parser.parse_args(argv)

    from dcp_cdc.config import AppConfig, BucketConfig
    from dcp_cdc.simulator import simulate
    from pipelines.bronze.job import ingest_bucket
    from pipelines.lake.spark_session import build_spark_session
    from pipelines.maintenance import job as maintenance
    from pipelines.quality.job import check_bucket
    from pipelines.silver.job import apply_bucket
    from tests.support.truth import assert_equal_to_truth

    timings: dict[str, float] = {}
    started = time.monotonic()
    bucket = "s3lake"
    result = simulate(args.out, bucket=bucket, seed=7, vbuckets=8, docs=60, ops=240)
    s3_conf = json.loads(args.s3_conf)
    config = AppConfig(
        landing=str(args.out / "landing"),
        warehouse=str(args.catalog),
        buckets=[BucketConfig(name=bucket)],
        spark={"conf": s3_conf, "shuffle_partitions": 2},
        maintenance={"vacuum_retention_hours": 0},
        silver={"tombstone_retention_hours": 0},
    )
    spark = build_spark_session(
        "dcp-cdc-s3-pipeline",
        args.catalog,
        shuffle_partitions=2,
        extra_conf=s3_conf | {"spark.sql.warehouse.dir": args.warehouse_uri},
        tables_on_s3=True,
        log_store=config.storage.log_store,
    )
    timings["session"] = time.monotonic() - started

    def step(name: str, since: float) -> float:
        now = time.monotonic()
        timings[name] = round(now - since, 1)
        return now

    mark = time.monotonic()
    ingested = ingest_bucket(spark, config, config.buckets[0])
    mark = step("ingest", mark)
    apply_bucket(spark, config, config.buckets[0])
    mark = step("apply", mark)
    assert_equal_to_truth(spark, bucket, result)
    report = check_bucket(spark, config, config.buckets[0])
    mark = step("check", mark)
    summary = maintenance.maintain_bucket(spark, config, config.buckets[0])
    mark = step("maintain", mark)
    assert_equal_to_truth(spark, bucket, result)  # maintenance changed nothing visible
    locations = sorted(
        {
            row["location"]
            for table in ("bronze.s3lake_events", "silver.s3lake__ingest_state")
            if spark.catalog.tableExists(table)
            for row in spark.sql(f"DESCRIBE DETAIL {table}").select("location").collect()
        }
    )
    print(
        "SUMMARY "
        + json.dumps(
            {
                "events": ingested.events if hasattr(ingested, "events") else None,
                "failed_errors": list(report.failed_errors),
                "optimized": len(summary.optimized),
                "vacuumed": len(summary.vacuumed),
                "locations": locations,
                "seconds": timings,
            }
        ),
        flush=True,
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
