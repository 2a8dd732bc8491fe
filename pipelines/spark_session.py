"""The one place that builds Spark sessions for dcp-cdc.

Every session gets Delta Lake (SQL extension and ``DeltaCatalog``) from jars resolved once by
``make setup`` into ``.cache/jars``; nothing is downloaded at run time (no
``spark.jars.packages``, so no ivy, unlike ``delta.configure_spark_with_delta_pip``). Tables
registered in the catalog persist across sessions: the catalog is Spark's built-in Hive metastore
on an embedded Derby database kept in ``<warehouse>/metastore_db``, with ``derby.log`` beside it,
so a session writes nothing to the working directory.

Embedded Derby admits one JVM at a time: two live Spark processes cannot share a warehouse.
While a session runs, asking for one on another warehouse is an error. JVM options (the jars,
``derby.system.home``) are fixed by the first session of a Python process: after ``stop()`` a
new session may use another warehouse, but ``derby.log`` stays where the first one put it.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from dcp_cdc.errors import DcpError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JARS_DIR_ENV = "DCP_CDC_JARS_DIR"
"""Environment variable naming a folder of Delta jars to use instead of ``.cache/jars``."""

DEFAULT_JARS_DIR = Path(__file__).resolve().parent.parent / ".cache" / "jars"
LOG4J2_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")
METASTORE_DIR_NAME = "metastore_db"
_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


class SparkSetupError(DcpError):
    """The local Spark set-up is missing or conflicts with the session asked for."""


def delta_jars_dir() -> Path:
    """The folder the Delta jars are taken from: ``$DCP_CDC_JARS_DIR`` or ``.cache/jars``."""
    override = os.environ.get(JARS_DIR_ENV)
    return Path(override).expanduser().resolve() if override else DEFAULT_JARS_DIR


def find_delta_jars(jars_dir: str | Path | None = None) -> list[Path]:
    """Every jar in ``jars_dir`` (default :func:`delta_jars_dir`), which must hold delta-spark."""
    folder = Path(jars_dir).expanduser().resolve() if jars_dir is not None else delta_jars_dir()
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not any(jar.name.startswith("delta-spark_") for jar in jars):
        raise SparkSetupError(
            f"Delta Lake jars not found: expected delta-spark_2.13-*.jar in {folder}, got "
            f"{len(jars)} jar(s). Run `make setup` to resolve them from Maven Central, or set "
            f"{JARS_DIR_ENV} to a folder that has them."
        )
    return jars


def spark_conf(
    app_name: str,
    warehouse: Path,
    *,
    master: str,
    shuffle_partitions: int,
    jars: Sequence[Path],
) -> dict[str, str]:
    """The configuration :func:`build_spark_session` starts a session with (no JVM needed)."""
    metastore = warehouse / METASTORE_DIR_NAME
    java_options = (
        f"-Dderby.system.home={warehouse}",
        "-Duser.timezone=UTC",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}",
    )
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.jars": ",".join(str(jar) for jar in jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={metastore};create=true"
        ),
        # Spark's launcher splits this string shell-style, so quoted paths may hold spaces.
        _DRIVER_JAVA_OPTIONS: " ".join(shlex.quote(opt) for opt in java_options),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        # Delta replays its log with 50 partitions by default: far too many for small tables.
        "spark.databricks.delta.snapshotPartitions": str(shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    if master.startswith("local"):
        conf |= {
            # Local mode runs every task in the driver JVM: its default 1g heap is far too
            # small for a million decoded frames (this machine has 24 GiB).
            "spark.driver.memory": "6g",
            # Loopback only: a local session must start with no network (and no DNS) at all.
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            # Python workers run in this interpreter's environment, not whatever is on PATH.
            "spark.pyspark.python": sys.executable,
        }
    return conf


def build_spark_session(
    app_name: str,
    warehouse: str | Path,
    *,
    master: str = "local[2]",
    shuffle_partitions: int = 4,
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A Delta-enabled session whose catalog and tables live under ``warehouse``.

    ``extra_conf`` is applied last and may override any setting, except that its
    ``spark.driver.extraJavaOptions`` are appended to the session's own. If this process
    already runs a session, it is returned (with ``extra_conf``'s runtime settings applied)
    provided it uses the same warehouse; a different warehouse raises :class:`SparkSetupError`.
    """
    from pyspark.sql import SparkSession

    warehouse_dir = Path(warehouse).expanduser().resolve()
    jars = find_delta_jars()
    active = SparkSession.getActiveSession()
    if active is not None:
        current = _local_path(active.conf.get("spark.sql.warehouse.dir") or "")
        if current != warehouse_dir:
            raise SparkSetupError(
                f"a Spark session on warehouse {current} is already running in this process; "
                f"expected none, or one on {warehouse_dir}. Stop it first (spark.stop())."
            )

    warehouse_dir.mkdir(parents=True, exist_ok=True)
    conf = spark_conf(
        app_name,
        warehouse_dir,
        master=master,
        shuffle_partitions=shuffle_partitions,
        jars=jars,
    )
    extra = dict(extra_conf or {})
    # The session's own JVM options (Derby home, timezone, logging) must survive: append.
    extra_java = extra.pop(_DRIVER_JAVA_OPTIONS, "").strip()
    if extra_java:
        conf[_DRIVER_JAVA_OPTIONS] += " " + extra_java
    conf.update(extra)
    if master.startswith("local"):
        # Local Python workers start from PYSPARK_PYTHON (the conf alone reaches only
        # spark-submit): the interpreter of this venv, unless the caller chose another.
        os.environ.setdefault("PYSPARK_PYTHON", conf["spark.pyspark.python"])
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _local_path(location: str) -> Path:
    """``/a/b`` from ``file:/a/b``, ``file:///a/b`` or ``/a/b``."""
    parsed = urlparse(location)
    return Path(parsed.path if parsed.scheme == "file" else location).resolve()
