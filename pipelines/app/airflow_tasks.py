"""What the DAG file (``dags/dcp_cdc_dags.py``) builds its tasks with.

Each task is ``spark-submit`` of the entry point the command line runs
(``pipelines/bronze/job.py``, ...), through the Spark provider's public API only: operator
arguments, and the Airflow connection ``[airflow] spark_conn_id`` read with
``Connection.get``. The connection's master decides where the job runs; the Delta jars,
catalog settings and the code shipped to executors (``[spark] py_files``) are those of
:mod:`pipelines.lake.spark_session`, computed when the task runs.

Parsing stays light: this module imports Airflow, the standard library and
``dcp_cdc.config`` (pydantic) at top level. Spark is imported only by the jobs, in the process
``spark-submit`` starts; the launch settings (:func:`pipelines.lake.spark_session.launch_conf`)
are computed without it.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator, Connection

from dcp_cdc.config import CONFIG_ENV, LOCAL_CONFIG, AppConfig, find_config, load_config
from dcp_cdc.errors import ConfigError

if TYPE_CHECKING:
    from airflow.sdk import Context

CHECKOUT_CONFIG = Path(__file__).resolve().parents[2] / "conf" / "local.toml"
"""``conf/local.toml`` of the checkout this package runs from (``make setup``), if any."""
MAINTENANCE_DAG_ID = "dcp_cdc_maintenance"
BACKFILL_PARAM = "backfill"
INGEST_ENTRY = "bronze/job.py"
"""The ingest entry point: its JVM runs ingest alone (``[ingest] jvm_jit``)."""
APPLY_ENTRY = "silver/job.py"
CHECK_ENTRY = "quality/job.py"
ON_DEMAND_ENTRIES = (INGEST_ENTRY, APPLY_ENTRY, CHECK_ENTRY)
"""The entry points of a scheduled run's Spark tasks: a small run's ingest, apply and check run
no Spark job (the driver does their work), so their executors start on demand
(:func:`pipelines.lake.spark_session.executors_on_demand`)."""
BACKFILL_PATTERN = r"^$|^bucket$|^[A-Za-z0-9_%-]+\.[A-Za-z0-9_%-]+$"


def config_path() -> Path:
    """The configuration the DAGs are made from (:func:`dcp_cdc.config.find_config`):
    ``$DCP_CDC_CONFIG``, else the checkout's ``conf/local.toml`` when running from one, else
    ``conf/local.toml`` of the working directory."""
    found = find_config(CHECKOUT_CONFIG)
    if found is None:
        raise ConfigError(
            f"no configuration: set {CONFIG_ENV} to a TOML file (looked for {CHECKOUT_CONFIG} "
            f"and {Path.cwd() / LOCAL_CONFIG})"
        )
    return found


def connection_master(conn_id: str) -> str:
    """The master the Spark connection ``conn_id`` names, read as the Spark provider reads it:
    the host holds the master (``local[2]``, ``yarn``, ``spark://h:7077``), else the
    connection type is its scheme; a port is appended. No connection: ``yarn``, as there."""
    try:
        conn = Connection.get(conn_id)
    except Exception:  # the provider falls back to yarn on a missing connection too
        return "yarn"
    host = conn.host or ""
    master = host if conn.conn_type == "spark" and ("://" in host or not conn.port) else None
    master = master or f"{conn.conn_type}://{host}"
    return f"{master}:{conn.port}" if conn.port else master


class DcpSparkSubmitOperator(SparkSubmitOperator):
    """``spark-submit`` of a dcp-cdc entry point with the settings of the session module.

    What only a launcher can set (Delta jars on the driver class path, driver JVM options and
    memory) and the code to ship (``[spark] py_files``) are computed at run time from the
    configuration and the master the Spark connection names. With ``backfill``, the run's
    ``backfill`` param becomes the silver job's flags: ``"bucket"`` → ``--rebuild``,
    ``"SCOPE.NAME"`` → ``--rebuild --collection SCOPE.NAME``.
    """

    def __init__(
        self,
        *,
        config_path: str,
        spark_conn_id: str,
        backfill: bool = False,
        driver_memory_override: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(conn_id=spark_conn_id, **kwargs)
        self.config_path = config_path
        self.spark_conn_id = spark_conn_id
        self.backfill = backfill
        self.driver_memory_override = driver_memory_override

    def execute(self, context: Context) -> None:
        self.prepare(context)
        super().execute(context)

    def prepare(self, context: Context) -> None:
        """Settle the command before the provider builds it: launch settings and code for the
        connection's master, flags from the params."""
        # here, in the task, not at the top: the DAG file parses with Airflow, the standard
        # library and dcp_cdc.config alone (Airflow's rule for what a DAG file imports)
        from pipelines.lake.shipping import py_files_for
        from pipelines.lake.spark_session import (
            executors_on_demand,
            ingest_jvm_conf,
            launch_conf,
            merge_conf,
        )

        config = load_config(self.config_path)
        master = connection_master(self.spark_conn_id)
        conf = launch_conf(config, self.name, master=master)
        if str(self.application).endswith(INGEST_ENTRY):  # a JVM for ingest alone
            conf = merge_conf(conf, ingest_jvm_conf(config))
        if str(self.application).endswith(ON_DEMAND_ENTRIES):  # the configuration's win
            conf = merge_conf(executors_on_demand(master), conf)
        conf.pop("spark.master", None)  # the connection's --master decides
        if self.driver_memory_override:
            conf["spark.driver.memory"] = self.driver_memory_override
        self.conf = {**conf, **(self.conf or {})}
        # The same zip session_for would add: spark-submit ships it before the driver starts
        # (a cluster-mode driver needs it to import the entry point), the session sees it.
        self.py_files = self.py_files or py_files_for(config.spark.py_files, master)
        self.application_args = [*(self.application_args or []), *self.flags(context)]

    def flags(self, context: Context) -> list[str]:
        """The silver job's flags for the run's ``backfill`` param."""
        target = context["params"].get(BACKFILL_PARAM) if self.backfill else None
        if not target:
            return []
        return ["--rebuild"] if target == "bucket" else ["--rebuild", "--collection", target]


def entry_points(config: AppConfig) -> Path | str:
    """Where spark-submit finds ``bronze/job.py`` and the others."""
    if config.airflow.application_dir:
        return config.airflow.application_dir
    spec = importlib.util.find_spec("pipelines")  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise ImportError("the pipelines package of dcp-cdc is not installed for this Python")
    return Path(spec.origin).parent


def spark_submit() -> str:
    """The ``spark-submit`` of the pyspark installed for this Python, else the PATH's.

    pyspark's own script (in the package, not the venv's ``bin/`` wrapper) knows its Spark
    home from where it lies; the wrapper would look for a ``python3`` on the PATH that has
    pyspark, which an Airflow worker need not have.
    """
    spec = importlib.util.find_spec("pyspark")  # found, not imported
    if spec is not None and spec.origin is not None:
        script = Path(spec.origin).parent / "bin" / "spark-submit"
        if script.exists():
            return str(script)
    return "spark-submit"


def default_args(config: AppConfig) -> dict[str, Any]:
    """Retries, timeouts and pool of every task."""
    settings = config.airflow
    return {
        "owner": "dcp-cdc",
        "depends_on_past": False,
        "retries": settings.retries,
        "retry_delay": dt.timedelta(seconds=settings.retry_delay_seconds),
        "retry_exponential_backoff": settings.retry_exponential_backoff,
        "max_retry_delay": dt.timedelta(seconds=settings.max_retry_delay_seconds),
        "execution_timeout": dt.timedelta(minutes=settings.execution_timeout_minutes),
        **({"pool": settings.pool} if settings.pool else {}),
    }


def start_date(config: AppConfig) -> dt.datetime:
    start = config.airflow.start_date
    return dt.datetime(start.year, start.month, start.day, tzinfo=dt.UTC)


def submit(
    task_id: str,
    script: str,
    args: Sequence[str],
    *,
    config: AppConfig,
    config_path: Path,
    **kwargs: Any,
) -> DcpSparkSubmitOperator:
    """The task that runs ``script`` (relative to the ``pipelines`` folder) with
    ``--config config_path`` and ``args``."""
    entry = entry_points(config)
    application = f"{entry}/{script}" if isinstance(entry, str) else str(entry / script)
    return DcpSparkSubmitOperator(
        task_id=task_id,
        config_path=str(config_path),
        application=application,
        application_args=["--config", str(config_path), *args],
        spark_conn_id=config.airflow.spark_conn_id,
        spark_binary=config.airflow.spark_submit or spark_submit(),
        driver_memory_override=config.airflow.driver_memory,
        name=f"dcp-cdc-{task_id}",
        **kwargs,
    )


class DcpCaptureOperator(BaseOperator):
    """``dcp-cdc capture --until now`` of one bucket: every vbucket streamed to the high seqno
    it had when the task started, then closed cleanly (the capture files renamed into the
    landing folder, the checkpoint committed), so the ingest task after it reads them.

    It runs the command line in a child process of this worker's Python: the agent needs no
    Spark and no JVM, and a kill of the task leaves what the agent made durable (a retry
    resumes from its checkpoint). The password is read by the agent from the environment
    variable or file the configuration names; it never passes through Airflow.
    """

    template_fields = ()

    def __init__(self, *, config_path: str, bucket: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.bucket = bucket

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pipelines.app.cli",
            "capture",
            "--config",
            self.config_path,
            "--bucket",
            self.bucket,
            "--until",
            "now",
        ]

    def execute(self, context: Context) -> None:
        with subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as child:
            assert child.stdout is not None
            try:
                for line in child.stdout:
                    self.log.info("%s", line.rstrip("\n"))
            except BaseException:
                # the execution timeout (or a kill of the task): stop the agent as SIGTERM
                # does, so that what it captured is made durable, before Popen waits for it
                _stop(child, grace_s=STOP_GRACE_S)
                raise
        if child.returncode:
            raise RuntimeError(
                f"dcp-cdc capture of bucket {self.bucket!r} failed (exit {child.returncode}); "
                "its output is above"
            )


STOP_GRACE_S = 60.0
"""How long a stopped capture task gives its agent to close its files before killing it."""


def _stop(child: subprocess.Popen[str], *, grace_s: float) -> None:
    """SIGTERM ``child``, then SIGKILL it if it is still running after ``grace_s``."""
    child.terminate()
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def capture(bucket: str, *, config: AppConfig, config_path: Path) -> DcpCaptureOperator:
    """The task that captures ``bucket`` up to now (its ``[buckets.capture]`` section)."""
    return DcpCaptureOperator(task_id="capture", config_path=str(config_path), bucket=bucket)
