"""The class-data archive of the local Spark JVM: the classes a session loads, parsed and
verified once (``make setup``) and mapped into every later JVM instead of being loaded from
Spark's jars again (the JDK's application class-data sharing, a dynamic archive written with
``-XX:ArchiveClassesAtExit``).

A local session's JVM spends seconds of its start loading and verifying some 20,000 classes
of Spark, Hive and Hadoop; with the archive it maps them. The archive holds the classes of
Spark's own class path (the pyspark installation); Delta's, which a session adds from
``spark.jars`` through Spark's class loader, load as before. The JVM checks the archive
against itself and the class path it starts with (``-Xshare:auto``): an archive of another
JVM or of changed jars is ignored, and the JVM loads its classes as without one.

Only JVMs that :func:`pipelines.lake.spark_session.spark_conf` starts with a local master use
it; ``spark-submit`` launches (the DAGs, the Thrift server) put the Delta jars on the
driver's class path, which no archive made here matches.

``python -m pipelines.lake.jvm_archive`` writes the archive when it is missing (``make
setup`` runs it; ``--force`` writes it again).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ARCHIVE_ENV = "DCP_CDC_JVM_ARCHIVE"
"""Environment variable naming the archive to use (or to write), instead of the checkout's;
empty: use none."""
CHECKOUT_ARCHIVE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "jvm"
"""Where ``make setup`` writes the archive, when this package runs from a checkout."""

log = logging.getLogger("dcp_cdc.spark")


def _installation_key() -> str:
    """What the archive's classes come from: the pyspark installation (its jars) and the
    ``java`` that would run them."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else shutil.which("java")
    java_path = str(Path(java).resolve()) if java else "java"
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    digest = hashlib.sha256("\n".join([java_path, str(jars), *names]).encode()).hexdigest()
    return f"pyspark-{pyspark.__version__}-{digest[:12]}"


def archive_path() -> Path | None:
    """The archive local sessions use or ``make setup`` writes: ``$DCP_CDC_JVM_ARCHIVE``
    (empty: none), else one per installation in the checkout's ``.cache/jvm``."""
    chosen = os.environ.get(ARCHIVE_ENV)
    if chosen is not None:
        return Path(chosen) if chosen.strip() else None
    return CHECKOUT_ARCHIVE_DIR / f"spark-{_installation_key()}.jsa"


def java_options() -> list[str]:
    """The JVM options that map the archive, if it exists; none otherwise."""
    path = archive_path()
    if path is None or not path.is_file():
        return []
    # auto: an archive the JVM does not accept is skipped, silently (cds logging off)
    return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", "-Xlog:cds=off"]


def _workload(warehouse: Path, archive: Path) -> None:
    """Start a session whose JVM writes its loaded classes to ``archive`` at exit, and run
    what the jobs run (Delta writes, a MERGE with the change feed, time travel, windows,
    Arrow both ways), so that the classes they load are archived too."""
    from pyspark import SparkContext

    from pipelines.lake.spark_session import build_spark_session

    os.environ[ARCHIVE_ENV] = ""  # this JVM writes the archive: it maps none
    options = f"-XX:ArchiveClassesAtExit={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
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
    """Write the archive at ``path`` (replacing it whole: a JVM never sees half of one)."""
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
    if path.parent == CHECKOUT_ARCHIVE_DIR:  # archives of earlier installations go
        for old in path.parent.glob("spark-*.jsa"):
            if old != path:
                old.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="write it even if it exists")
    args = parser.parse_args(argv)
    path = archive_path()
    if path is None:
        print(f"{ARCHIVE_ENV} is empty: no class-data archive")
        return 0
    if path.is_file() and not args.force:
        print(f"class-data archive: {path} (present)")
        return 0
    started = time.monotonic()
    build(path)
    print(
        f"class-data archive: {path} ({path.stat().st_size >> 20} MiB, "
        f"{time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
