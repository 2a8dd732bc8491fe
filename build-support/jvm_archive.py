"""Write the class-data archive local Spark JVMs map at start (``make setup`` runs this):
one small Spark job whose JVM writes the classes it loaded when it exits
(``-XX:ArchiveClassesAtExit``). :mod:`pipelines.lake.jvm_archive` says where the archive goes
and how a session maps it.

    python build-support/jvm_archive.py [--force]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pipelines.lake import jvm_archive


def _workload(warehouse: Path, archive: Path) -> None:
    """Start a session whose JVM writes its loaded classes to ``archive`` at exit, and run
    what the jobs run (Delta writes, a MERGE with the change feed, time travel, windows,
    Arrow both ways), so that the classes they load are archived too."""
    from pyspark import SparkContext

    from pipelines.lake.spark_session import build_spark_session

    os.environ[jvm_archive.ARCHIVE_ENV] = ""  # this JVM writes the archive: it maps none
    options = f"-XX:ArchiveClassesAtExit={archive} -Xlog:cds=off,cds+dynamic=off"
    spark = build_spark_session(
        "dcp-cdc-class-archive",
        warehouse,
        extra_conf={"spark.driver.extraJavaOptions": options},
    )
    spark.sql("CREATE DATABASE IF NOT EXISTS archive")
    spark.range(2000).selectExpr(
        "id", "cast(id % 64 as int) vb", "cast(id as string) key", "to_json(struct(id)) doc"
    ).write.format("delta").option("delta.enableChangeDataFeed", "true").saveAsTable("archive.t")
    changes = spark.range(500).selectExpr(
        "id * 3 as id", "cast(id % 64 as int) vb", "cast(id as string) key", "'{}' doc"
    )
    changes.createOrReplaceTempView("changes")
    spark.sql(
        "MERGE INTO archive.t USING changes c ON t.id = c.id "
        "WHEN MATCHED AND c.id % 2 = 0 THEN DELETE WHEN MATCHED THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    spark.sql(
        "SELECT vb, count(*), max(key) FROM ("
        " SELECT *, row_number() OVER (PARTITION BY vb ORDER BY id DESC) AS r"
        " FROM archive.t VERSION AS OF 0) WHERE r = 1 GROUP BY vb"
    ).localCheckpoint(eager=True).toPandas()
    spark.read.option("readChangeFeed", "true").option("startingVersion", 1).table(
        "archive.t"
    ).groupBy("_change_type").count().collect()
    spark.createDataFrame(spark.table("archive.t").limit(100).toPandas()).write.format(
        "delta"
    ).mode("append").saveAsTable("archive.t")
    spark.sql("DESCRIBE HISTORY archive.t").collect()
    gateway = SparkContext._gateway
    spark.stop()
    if gateway is not None and getattr(gateway, "proc", None) is not None:
        # the JVM writes the archive as it exits: once its stdin closes, it exits
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=600)


def build(path: Path) -> None:
    """Write the archive at ``path`` (replacing it whole: a JVM never sees half of one); in
    the checkout's folder, the archives of earlier installations go."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dcp-cdc-archive-") as scratch:
        partial = Path(scratch) / "spark.jsa"
        _workload(Path(scratch) / "warehouse", partial)
        if not partial.is_file():
            raise RuntimeError(
                f"the JVM wrote no class-data archive at {partial}: does its java "
                "(JAVA_HOME, or java on PATH) support -XX:ArchiveClassesAtExit (JDK 13+)?"
            )
        staged = path.with_suffix(".partial")
        shutil.copyfile(partial, staged)
        staged.replace(path)
    if path.parent == jvm_archive.CHECKOUT_ARCHIVE_DIR:
        for old in path.parent.glob("spark-*.jsa"):
            if old != path:
                old.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jvm_archive.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="write it even if it exists")
    args = parser.parse_args(argv)
    path = jvm_archive.archive_path()
    if path is None:
        print(f"{jvm_archive.ARCHIVE_ENV} is empty: no class-data archive")
        return 0
    if path.is_file() and not args.force:
        print(f"class-data archive: {path} (present)")
        return 0
    started = time.monotonic()
    build(path)
    size, seconds = path.stat().st_size >> 20, time.monotonic() - started
    print(f"class-data archive: {path} ({size} MiB, {seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
