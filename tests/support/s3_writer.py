"""One driver of the several-writers test: ``python -m tests.support.s3_writer``.

It builds a dcp-cdc session (its own local catalog, tables on S3 at the moto server the
arguments name) and, for each round, waits until every writer reached the round (files in
``--sync``), then appends one row to each table, its commit labelled ``w<id>-r<round>``
(Delta's ``userMetadata``). The test then reads the tables' logs: with a log store safe for
several drivers every label is there; with Delta's single-driver store some are lost.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _barrier(sync: Path, writer: int, writers: int, step: str, timeout_s: float = 120) -> None:
    (sync / f"{step}-w{writer}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(sync.glob(f"{step}-w*"))) < writers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"writer {writer}: the others never reached {step}")
        time.sleep(0.005)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writer", type=int, required=True)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--tables", nargs="+", required=True, help="s3a:// table locations")
    parser.add_argument("--sync", type=Path, required=True)
    parser.add_argument("--warehouse", type=Path, required=True)
    parser.add_argument("--log-store", required=True)
    parser.add_argument("--s3-conf", required=True, help="JSON of spark.hadoop.fs.s3a.* settings")
    args = parser.parse_args(argv)

    from pyspark.sql import types as T

    from pipelines.spark_session import build_spark_session

    spark = build_spark_session(
        f"s3-writer-{args.writer}",
        args.warehouse,
        shuffle_partitions=1,
        extra_conf=json.loads(args.s3_conf) | {"spark.driver.memory": "1g"},
        tables_on_s3=True,
        log_store=args.log_store,
    )
    schema = T.StructType(
        [
            T.StructField("writer", T.IntegerType(), False),
            T.StructField("round", T.IntegerType(), False),
        ]
    )
    _barrier(args.sync, args.writer, args.writers, "started")
    for round_ in range(args.rounds):
        rows = spark.createDataFrame([(args.writer, round_)], schema)
        _barrier(args.sync, args.writer, args.writers, f"round{round_:03d}")
        for table in args.tables:
            (
                rows.write.format("delta")
                .mode("append")
                .option("userMetadata", f"w{args.writer}-r{round_}")
                .save(table)
            )
    print(f"writer {args.writer}: {args.rounds} rounds committed", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
