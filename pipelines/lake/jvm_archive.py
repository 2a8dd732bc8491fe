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

Only the JVMs that :func:`pipelines.lake.spark_session.build_spark_session` starts itself,
with a local master and Spark's own class path, map it. Sessions that put a jar on the
driver's class path (``spark.driver.extraClassPath``: a Derby network catalog, as follow mode
uses) and ``spark-submit`` launches (the DAGs, the Thrift server, which put the Delta jars
there) start with a class path no archive made here matches, and map none.

``build-support/jvm_archive.py`` writes it (``make setup`` runs it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

ARCHIVE_ENV = "DCP_CDC_JVM_ARCHIVE"
"""Environment variable naming the archive to use (or to write), instead of the checkout's;
empty: use none."""
CHECKOUT_ARCHIVE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "jvm"
"""Where ``make setup`` writes the archive, when this package runs from a checkout."""


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
    return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", "-Xlog:cds=off,cds+dynamic=off"]
