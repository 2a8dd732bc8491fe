"""The one place that builds Spark sessions for dcp-cdc.

Every session gets Delta Lake (SQL extension and ``DeltaCatalog``) from jars resolved once by
``make setup`` into ``.cache/jars`` (or the folder ``$DCP_CDC_JARS_DIR`` or ``[spark] jars_dir``
names); nothing is downloaded at run time (no ``spark.jars.packages``, so no ivy, unlike
``delta.configure_spark_with_delta_pip``). Local tables commit through dcp-cdc's log store
(``dcp-cdc-local-logstore.jar``, built by ``make setup`` into the same folder), which keeps
every commit when several processes write the same tables (:mod:`dcp_cdc.config.storage`).
Every session of a job gets the code its executors run from ``[spark] py_files``
(:mod:`pipelines.lake.shipping`), whoever started it. Tables
registered in the catalog persist across sessions: the catalog is Spark's built-in Hive metastore
on an embedded Derby database kept in ``<warehouse>/metastore_db``, with ``derby.log`` beside it,
so a session writes nothing to the working directory.

Embedded Derby admits one JVM at a time: two live Spark processes cannot share a warehouse
(the second gets a :class:`~pipelines.errors.CatalogError` at once; a catalog whose creation
was killed is set aside and made again: :mod:`pipelines.catalog.embedded`).
While a session runs, asking for one on another warehouse is an error. JVM options (the jars,
``derby.system.home``) are fixed by the first session of a Python process: after ``stop()`` a
new session may use another warehouse, but ``derby.log`` stays where the first one put it.
A warehouse on object storage (``s3a://...``) needs a shared Hive metastore instead
(``spark.metastore``). Processes that share a local warehouse at once do so through a Derby
network server (``dcp-cdc metastore start``; follow mode and the Thrift server start one):
:mod:`pipelines.catalog.settings` picks the catalog a session uses and checks it answers.

Launchers get the same settings from :func:`launch_conf`: the Airflow DAGs pass them to
``spark-submit`` (whose ``--master`` then wins over ``spark.master``), ``dcp-cdc spark-conf``
writes them as a properties file for ``spark-sql``, ``pyspark`` and the Thrift server.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from dcp_cdc.config import is_uri
from dcp_cdc.config.storage import LOCAL_LOG_STORE_CLASS, LOCAL_LOG_STORE_KEY
from pipelines.catalog.embedded import METASTORE_DIR_NAME, explain_open_failure, open_local_catalog
from pipelines.catalog.settings import catalog_service, hive_client_conf
from pipelines.errors import SparkSetupError
from pipelines.lake import jvm_archive
from pipelines.lake.object_storage import (
    check_submitted_s3_jars,
    on_s3,
    preflight,
    s3_jars,
    s3_session_conf,
)
from pipelines.lake.shipping import py_files_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from dcp_cdc.config import AppConfig, ThriftConfig

JARS_DIR_ENV = "DCP_CDC_JARS_DIR"
"""Environment variable naming a folder of Delta jars to use instead of ``.cache/jars``."""

CHECKOUT_JARS_DIR = Path(__file__).resolve().parents[2] / ".cache" / "jars"
"""Where ``make setup`` puts the jars, when this package runs from a checkout."""
LOCAL_LOG_STORE_JAR = "dcp-cdc-local-logstore.jar"
"""The jar of :data:`~dcp_cdc.config.storage.LOCAL_LOG_STORE_CLASS`, beside the Delta jars."""
LOG4J2_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")
_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
_EXECUTOR_JAVA_OPTIONS = "spark.executor.extraJavaOptions"
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
"""The JVM options that keep its JIT at C1 (``[ingest] jvm_jit = "c1"``). C1 alone reserves
a 48 MiB code cache, which a MERGE fills: the JVM then stops compiling and soon fails on a
method handle it cannot compile (``InternalError``, "Out of space in CodeCache"). 240 MiB is
what tiered compilation reserves."""
_SHIPPED: dict[str, set[str]] = {}  # zips added to each application's context (by name)


def delta_jars_dir(setting: str | None = None) -> Path:
    """The folder the Delta jars are taken from: ``$DCP_CDC_JARS_DIR``, else ``setting``
    (``[spark] jars_dir``), else the checkout's ``.cache/jars`` when running from one."""
    chosen = os.environ.get(JARS_DIR_ENV) or setting
    if chosen:
        return Path(chosen).expanduser().resolve()
    if CHECKOUT_JARS_DIR.is_dir():
        return CHECKOUT_JARS_DIR
    raise SparkSetupError(
        f"Delta Lake jars not found: expected [spark] jars_dir in the configuration or "
        f"{JARS_DIR_ENV} to name a folder with delta-spark_2.13-*.jar (a checkout gets them in "
        f"{CHECKOUT_JARS_DIR} from `make setup`)"
    )


def find_delta_jars(jars_dir: str | Path | None = None) -> list[Path]:
    """Every jar in :func:`delta_jars_dir` of ``jars_dir`` (``[spark] jars_dir``), which must
    hold delta-spark and dcp-cdc's log store of local tables."""
    folder = delta_jars_dir(str(jars_dir) if jars_dir is not None else None)
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not any(jar.name.startswith("delta-spark_") for jar in jars):
        raise SparkSetupError(
            f"Delta Lake jars not found: expected delta-spark_2.13-*.jar in {folder}, got "
            f"{len(jars)} jar(s). Run `make setup` to resolve them from Maven Central, or set "
            f"{JARS_DIR_ENV} to a folder that has them."
        )
    if not any(jar.name == LOCAL_LOG_STORE_JAR for jar in jars):
        raise SparkSetupError(
            f"{folder} has the Delta jars but not {_LOG_STORE_ROLE}. Run `make setup`, which "
            "compiles it (it needs a JDK's javac), or copy it beside the Delta jars."
        )
    return jars


_LOG_STORE_ROLE = (
    f"{LOCAL_LOG_STORE_JAR}, the log store that keeps every commit to local tables when "
    f"several processes write them ({LOCAL_LOG_STORE_CLASS})"
)


def spark_conf(
    app_name: str,
    warehouse: str | Path,
    *,
    master: str | None,
    shuffle_partitions: int,
    jars: Sequence[Path],
    metastore: str | None = None,
) -> dict[str, str]:
    """The configuration :func:`build_spark_session` starts a session with (no JVM needed).

    ``master=None`` leaves the master, and the settings only a local master needs, to whoever
    launches the JVM (``spark-submit --master``). ``warehouse`` is a local folder (with the
    embedded Derby catalog in it) unless ``metastore`` names a shared Hive metastore.
    """
    local_warehouse = isinstance(warehouse, Path)
    java_options = [
        "-Duser.timezone=UTC",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}",
    ]
    conf = {
        "spark.app.name": app_name,
        "spark.jars": ",".join(str(jar) for jar in jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(warehouse),
        LOCAL_LOG_STORE_KEY: LOCAL_LOG_STORE_CLASS,
    }
    if metastore:
        conf |= hive_client_conf(metastore, warehouse, jars)
    elif local_warehouse:
        java_options.insert(0, f"-Dderby.system.home={warehouse}")
        conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
            f"jdbc:derby:;databaseName={Path(warehouse) / METASTORE_DIR_NAME};create=true"
        )
    else:
        raise SparkSetupError(
            f"warehouse {warehouse} is not a local folder: a shared metastore is needed "
            "(spark.metastore in the configuration)"
        )
    conf |= {
        # Spark's launcher splits this string shell-style, so quoted paths may hold spaces.
        _DRIVER_JAVA_OPTIONS: " ".join(shlex.quote(opt) for opt in java_options),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        # Delta replays its log with 50 partitions by default: far too many for small tables.
        "spark.databricks.delta.snapshotPartitions": str(shuffle_partitions),
        # VACUUM lists a table's folders with this many tasks (default 10000): 100 s for a
        # small table on two cores, 9 s with 4.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    if master is not None:
        conf["spark.master"] = master
    if master is not None and master.startswith("local"):
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


def launched_by_spark_submit() -> bool:
    """True in a Python driver started by ``spark-submit`` (or ``pyspark``): its JVM is
    already running, with the master and launch settings the submitter chose."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def delta_jars_given(spark_jars: str | None) -> str | None:
    """``spark_jars`` (a ``spark.jars`` value: paths or URLs, comma-separated) if it names a
    delta-spark jar, else None."""
    names = [Path(urlparse(jar.strip()).path).name for jar in (spark_jars or "").split(",")]
    return spark_jars if any(name.startswith("delta-spark_") for name in names) else None


def submitted_delta_jars() -> str | None:
    """Under ``spark-submit``: the ``spark.jars`` its JVM was launched with, if they hold
    delta-spark (the DAGs' and ``dcp-cdc spark-conf``'s launches do). Such a driver must not
    look for jars itself: it may run the code from a shipped zip, with no checkout (and no
    ``.cache/jars``) around it. None when not launched so, or launched without Delta. Jars
    with Delta but without dcp-cdc's log store raise :class:`SparkSetupError`."""
    if not launched_by_spark_submit():
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # joins the submitter's JVM (PYSPARK_GATEWAY_PORT)
    given = delta_jars_given(SparkConf().get("spark.jars"))
    if given is not None:
        check_submitted_log_store(given)
    return given


def check_submitted_log_store(spark_jars: str) -> None:
    """A driver that ``spark-submit`` started with the Delta jars must have the log store of
    local tables among them too (``launch_conf`` lists it), or its first commit would fail
    deep in Delta with ``ClassNotFoundException``."""
    names = [Path(urlparse(uri.strip()).path).name for uri in spark_jars.split(",")]
    if LOCAL_LOG_STORE_JAR not in names:
        raise SparkSetupError(
            "this driver was launched by spark-submit with the Delta jars but without "
            f"{_LOG_STORE_ROLE}. Launch it with `dcp-cdc spark-conf`'s properties (or the "
            "DAGs), which list it after `make setup`."
        )


def _warehouse_location(warehouse: str | Path) -> str | Path:
    """A local warehouse as an absolute folder; a URI (``s3a://...``) as it is."""
    if isinstance(warehouse, str) and is_uri(warehouse) and not warehouse.startswith("file:"):
        return warehouse
    return _local_path(str(warehouse))


def merge_conf(conf: Mapping[str, str], extra: Mapping[str, str] | None) -> dict[str, str]:
    """``extra`` applied over ``conf``; JVM options are appended, so the session's own
    (Derby home, timezone, logging) survive."""
    merged = dict(conf)
    rest = dict(extra or {})
    for key in (_DRIVER_JAVA_OPTIONS, _EXECUTOR_JAVA_OPTIONS):
        extra_java = rest.pop(key, "").strip()
        if extra_java:
            merged[key] = f"{merged.get(key, '')} {extra_java}".strip()
    merged.update(rest)
    return merged


def ingest_jvm_conf(config: AppConfig) -> dict[str, str]:
    """The JVM options of a JVM started for ingest alone (``[ingest] jvm_jit``; with the
    ``arrow`` writer only, Spark's writer needs C2), for the driver and the executors; given
    at launch (a running JVM keeps its own)."""
    if config.ingest.jvm_jit != "c1" or config.ingest.writer != "arrow":
        return {}
    return {_DRIVER_JAVA_OPTIONS: C1_ONLY, _EXECUTOR_JAVA_OPTIONS: C1_ONLY}


EXECUTORS_ON_DEMAND = {
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.initialExecutors": "0",
    "spark.dynamicAllocation.minExecutors": "0",
}
"""Executors started when a Spark job asks for them, none before (dynamic allocation from
zero, shuffle files tracked so that no external shuffle service is needed)."""


def executors_on_demand(master: str) -> dict[str, str]:
    """The settings of an application that often runs no Spark job (a small bucket's quality
    check reads in the driver) on the cluster ``master``: :data:`EXECUTORS_ON_DEMAND`, so that
    it holds no cores and its driver starts with no executor JVMs beside it; none for a local
    master, whose tasks run in the driver."""
    return {} if master.startswith("local") else dict(EXECUTORS_ON_DEMAND)


def class_archive_conf() -> dict[str, str]:
    """The driver JVM options that map the class-data archive (:mod:`.jvm_archive`), for a
    local JVM this process starts with Spark's own class path (no
    ``spark.driver.extraClassPath``); none when there is no archive."""
    options = jvm_archive.java_options()
    return {_DRIVER_JAVA_OPTIONS: " ".join(shlex.quote(o) for o in options)} if options else {}


def build_spark_session(
    app_name: str,
    warehouse: str | Path,
    *,
    master: str = "local[2]",
    shuffle_partitions: int = 4,
    extra_conf: Mapping[str, str] | None = None,
    metastore: str | None = None,
    jars_dir: str | None = None,
    tables_on_s3: bool = False,
    log_store: str = "s3-conditional-put",
) -> SparkSession:
    """A Delta-enabled session whose catalog and tables live under ``warehouse``.

    ``extra_conf`` is applied last and may override any setting, except that its
    ``spark.driver.extraJavaOptions`` are appended to the session's own. If this process
    already runs a session, it is returned (with ``extra_conf``'s runtime settings applied)
    provided it uses the same warehouse; a different warehouse raises :class:`SparkSetupError`.
    A warehouse on S3 (or ``tables_on_s3``) adds the S3 jars and ``log_store``
    (:func:`object_storage_jars`). Under ``spark-submit`` the submitter's master is kept
    (``master`` is ignored): the same job runs locally or on a cluster by changing only how
    it is submitted.
    """
    # here, not at the top: launch_conf and properties_text serve launchers that need no
    # pyspark (dcp-cdc spark-conf and thrift-server, the Airflow tasks' spark-submit)
    from pyspark.sql import SparkSession

    location = _warehouse_location(warehouse)
    given = submitted_delta_jars()  # the launcher's jars (Delta's, and S3's if on S3)
    if given is None:
        jars = find_delta_jars(jars_dir) + object_storage_jars(location, tables_on_s3)
    else:  # no folder to look in: a submitted driver may run from a shipped zip
        jars = [Path(urlparse(uri).path) for uri in given.split(",") if uri]
        if tables_on_s3 or on_s3(location):
            check_submitted_s3_jars(given)
    metastore = catalog_service(location, metastore)
    active = SparkSession.getActiveSession()
    if active is not None:
        current = _warehouse_location(active.conf.get("spark.sql.warehouse.dir") or "")
        if current != location:
            raise SparkSetupError(
                f"a Spark session on warehouse {current} is already running in this process; "
                f"expected none, or one on {location}. Stop it first (spark.stop())."
            )

    embedded = isinstance(location, Path) and not metastore
    if isinstance(location, Path):
        location.mkdir(parents=True, exist_ok=True)
        if embedded:
            open_local_catalog(location)
    submitted = launched_by_spark_submit()
    conf = spark_conf(
        app_name,
        location,
        master=None if submitted else master,
        shuffle_partitions=shuffle_partitions,
        jars=jars,
        metastore=metastore,
    )
    conf = merge_conf(conf, object_storage_conf(location, tables_on_s3, log_store))
    if given:
        conf["spark.jars"] = given
    conf = merge_conf(conf, extra_conf)
    if not submitted and master.startswith("local") and "spark.driver.extraClassPath" not in conf:
        # the archive holds the classes of Spark's own class path: another would not match
        conf = merge_conf(conf, class_archive_conf())
    if "spark.pyspark.python" in conf:
        # Local Python workers start from PYSPARK_PYTHON (the conf alone reaches only
        # spark-submit): the interpreter of this venv, unless the caller chose another.
        os.environ.setdefault("PYSPARK_PYTHON", conf["spark.pyspark.python"])
    builder = SparkSession.builder.enableHiveSupport()
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _quiet_converted_errors()
    if embedded and active is None:
        assert isinstance(location, Path)
        try:  # open the catalog now, so that a failure is ours to explain
            spark.catalog.listDatabases()
        except Exception as exc:
            raise explain_open_failure(location, exc) from None
    return spark


CONVERTED_ERROR_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
"""PySpark's loggers that log each error it converts from the JVM, with the JVM's stack."""


def _quiet_converted_errors() -> None:
    """PySpark logs an error it converts from the JVM (a missing table, a commit race) with
    the JVM's stack when it converts it, whether or not the caller handles it; the error
    itself still reaches the caller, whose message (or traceback) says what matters."""
    from pyspark.logger import PySparkLogger

    for name in CONVERTED_ERROR_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def session_for(
    config: AppConfig, app_name: str, *, jvm_conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The session a job of ``config`` runs in (built once per process), with the code its
    executors need (:func:`ship_code`): every entry point (``dcp-cdc``, ``python -m``,
    ``spark-submit``, the DAGs) comes through here. ``jvm_conf``: JVM options of the job
    (:func:`ingest_jvm_conf`), appended to ``[spark.conf]``'s; they apply only if this
    builds the JVM."""
    check_object_storage(config)
    spark = build_spark_session(
        app_name,
        config.warehouse,
        master=config.spark.master,
        shuffle_partitions=config.spark.shuffle_partitions,
        extra_conf=merge_conf(config.spark.conf, jvm_conf),
        metastore=config.spark.metastore,
        jars_dir=config.spark.jars_dir,
        log_store=config.storage.log_store,
    )
    ship_code(spark, config.spark.py_files)
    return spark


def ship_code(spark: SparkSession, py_files: str | None) -> str | None:
    """Give the executors of ``spark`` the code ``[spark] py_files`` names (see
    :mod:`pipelines.lake.shipping`), unless a launcher shipped that zip already
    (``spark-submit --py-files``). Returns what the session ships, if anything."""
    context = spark.sparkContext
    location = py_files_for(py_files, context.master or "")
    if location is None:
        return None
    name = Path(urlparse(location).path).name
    submitted = context.getConf().get("spark.submit.pyFiles", "") or ""
    added = _SHIPPED.setdefault(context.applicationId, set())
    if name not in added | {Path(urlparse(p).path).name for p in submitted.split(",") if p}:
        context.addPyFile(location)
        added.add(name)
    return location


def launch_conf(config: AppConfig, app_name: str, *, master: str | None) -> dict[str, str]:
    """What a launcher (``spark-submit``, ``spark-sql``, ``pyspark``, the Thrift server) must
    be given for a session on ``config``'s catalog: the settings :func:`session_for` uses,
    including those that only work at JVM start (the Delta jars on the driver's class path,
    driver JVM options and memory). ``master=None``: the launcher's ``--master`` decides."""
    location = _warehouse_location(config.warehouse)
    jars = find_delta_jars(config.spark.jars_dir) + object_storage_jars(location)
    conf = spark_conf(
        app_name,
        _warehouse_location(config.warehouse),
        master=master,
        shuffle_partitions=config.spark.shuffle_partitions,
        jars=jars,
        metastore=catalog_service(
            _warehouse_location(config.warehouse), config.spark.metastore, check=False
        ),
    )
    # On the driver's own class path too: the Thrift server and spark-sql load the Delta
    # catalog from threads that do not see spark.jars (ClassNotFoundException: DeltaCatalog).
    # A path a cluster-mode driver does not have is ignored there, spark.jars ships the jars.
    conf["spark.driver.extraClassPath"] = os.pathsep.join(str(jar) for jar in jars)
    conf = merge_conf(conf, object_storage_conf(location, False, config.storage.log_store))
    return merge_conf(conf, config.spark.conf)


# Object storage (s3a://): the jars, settings and preflight of pipelines.lake.object_storage.


def object_storage_jars(location: str | Path, tables_on_s3: bool = False) -> list[Path]:
    """The S3 jars (``make setup-s3``) for a warehouse on S3 or ``tables_on_s3``; else none.
    Missing jars raise :class:`~pipelines.errors.S3SetupError` before Spark starts."""
    return s3_jars() if tables_on_s3 or on_s3(location) else []


def object_storage_conf(location: str | Path, tables_on_s3: bool, log_store: str) -> dict[str, str]:
    """The S3A filesystem and the Delta log store ``log_store`` (``[storage] log_store``) for
    a warehouse on S3 or ``tables_on_s3``; else nothing."""
    return s3_session_conf(log_store) if tables_on_s3 or on_s3(location) else {}


def check_object_storage(config: AppConfig) -> None:
    """Before Spark starts: every S3 bucket of the warehouse and the landing locations answers
    at the configured endpoint with the configured credentials (:func:`preflight`)."""
    locations = {"warehouse": config.warehouse, "landing": config.landing}
    for index, bucket in enumerate(config.buckets):
        if bucket.landing:
            locations[f"buckets[{index}].landing"] = bucket.landing
    preflight(locations, config.spark.conf)


THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
_HIVE_AUTHENTICATION = {"none": "NONE", "ldap": "LDAP", "kerberos": "KERBEROS"}


def thrift_hiveconf(thrift: ThriftConfig) -> dict[str, str]:
    """The Thrift server's ``--hiveconf`` settings: where it listens and how it checks users
    (Spark's copy of HiveServer2 reads ``hive.server2.authentication`` and its LDAP or
    Kerberos keys; its LDAP check binds as the connecting user, so no bind password)."""
    conf = {
        "hive.server2.thrift.port": str(thrift.port),
        "hive.server2.thrift.bind.host": thrift.host,
        "hive.server2.authentication": _HIVE_AUTHENTICATION[thrift.authentication],
    }
    optional = {
        "hive.server2.authentication.ldap.url": thrift.ldap_url,
        "hive.server2.authentication.ldap.baseDN": thrift.ldap_base_dn,
        "hive.server2.authentication.ldap.userDNPattern": thrift.ldap_user_dn_pattern,
        "hive.server2.authentication.ldap.Domain": thrift.ldap_domain,
        "hive.server2.authentication.kerberos.principal": thrift.kerberos_principal,
        "hive.server2.authentication.kerberos.keytab": thrift.kerberos_keytab,
    }
    return conf | {key: value for key, value in optional.items() if value is not None}


def thrift_server_launch(
    config: AppConfig, thrift: ThriftConfig, properties_file: str | Path
) -> tuple[dict[str, str], list[str]]:
    """The Spark properties (to write to ``properties_file``) and the ``spark-submit``
    arguments that start the Thrift server on ``config``'s catalog as ``thrift`` says. The
    arguments carry no setting of ``[spark] conf`` (which may hold credentials): the command
    line is visible to every user of the machine, the properties file is not."""
    conf = launch_conf(config, "dcp-cdc-thrift-server", master=config.spark.master)
    if thrift.authentication == "kerberos":
        # the server logs in from its keytab only when Hadoop security is on
        conf["spark.hadoop.hadoop.security.authentication"] = "kerberos"
    arguments = [
        "--properties-file",
        str(properties_file),
        "--class",
        THRIFT_SERVER_CLASS,
        "spark-internal",
    ]
    for key, value in thrift_hiveconf(thrift).items():
        arguments += ["--hiveconf", f"{key}={value}"]
    return conf, arguments


def properties_text(conf: Mapping[str, str]) -> str:
    """``conf`` as a Spark properties file (``--properties-file``)."""
    lines = ["# Written by dcp-cdc spark-conf; settings of the dcp-cdc catalog."]
    for key, value in conf.items():
        lines.append(f"{key}={value.replace(chr(92), chr(92) * 2)}")
    return "\n".join(lines) + "\n"


def _local_path(location: str) -> Path:
    """``/a/b`` from ``file:/a/b``, ``file:///a/b`` or ``/a/b``."""
    parsed = urlparse(location)
    return Path(parsed.path if parsed.scheme == "file" else location).expanduser().resolve()
