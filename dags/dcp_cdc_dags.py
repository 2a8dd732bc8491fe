"""Airflow DAGs of dcp-cdc, made from one configuration file.

The file is ``$DCP_CDC_CONFIG`` (default: ``conf/local.toml`` of this repository). For every
configured bucket a pipeline DAG ``dcp_cdc__<bucket>``::

    ingest_bronze >> apply_silver >> check_quality

and one maintenance DAG ``dcp_cdc_maintenance`` with a ``maintain__<bucket>`` task per bucket
(OPTIMIZE, VACUUM, tombstone purge, quality-results retention), one after the other.

Each task is ``spark-submit`` of the same entry point the command line uses
(``pipelines/bronze/job.py``, ``pipelines/silver/job.py``, ``pipelines/quality/job.py``,
``pipelines/maintenance.py``). The master comes from the Airflow connection
``[airflow] spark_conn_id``: the same DAG runs on a local Spark or a cluster by changing the
connection. The Delta jars and catalog settings are those of ``pipelines.spark_session``,
computed when the task runs.

Parsing stays light: this file imports Airflow and the standard library at top level, and
the configuration module (``dcp_cdc.config``: pydantic, which Airflow has loaded already) to
validate the file, so a wrong setting shows as an import error naming the field. Spark and
Great Expectations are imported only by the jobs, in the process ``spark-submit`` starts.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import Context

    from dcp_cdc.config import AppConfig

CONFIG_ENV = "DCP_CDC_CONFIG"
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "conf" / "local.toml"
MAINTENANCE_DAG_ID = "dcp_cdc_maintenance"
BACKFILL_PARAM = "backfill"


class DcpSparkSubmitOperator(SparkSubmitOperator):
    """``spark-submit`` of a dcp-cdc entry point with the catalog settings of the session module.

    What only a launcher can set (Delta jars on the driver class path, driver JVM options and
    memory) is computed at run time from the configuration and the master the Spark connection
    names. With ``backfill``, the run's ``backfill`` param becomes the silver job's flags:
    ``"bucket"`` → ``--rebuild``, ``"SCOPE.NAME"`` → ``--rebuild --collection SCOPE.NAME``.
    """

    def __init__(
        self,
        *,
        config_path: str,
        backfill: bool = False,
        driver_memory_override: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.backfill = backfill
        self.driver_memory_override = driver_memory_override
        self.spark_submit = kwargs.get("spark_binary")

    def execute(self, context: Context) -> None:
        self.prepare(context)
        super().execute(context)

    def prepare(self, context: Context) -> SparkSubmitHook:
        """Settle the command: launch settings for the connection's master, flags from the
        params. Returns the hook that will run it (tests read its command)."""
        from dcp_cdc.config import load_config
        from pipelines.spark_session import launch_conf

        config = load_config(self.config_path)
        self._spark_binary = self.spark_submit or _spark_submit()
        master = self._get_hook()._connection["master"]
        conf = launch_conf(config, self.name, master=master)
        conf.pop("spark.master", None)  # the connection's --master decides
        if self.driver_memory_override:
            conf["spark.driver.memory"] = self.driver_memory_override
        self.conf = {**conf, **(self.conf or {})}
        self.application_args = [*(self.application_args or []), *self._flags(context)]
        self._hook = self._get_hook()  # again, with the settings above
        return self._hook

    def _flags(self, context: Context) -> list[str]:
        target = context["params"].get(BACKFILL_PARAM) if self.backfill else None
        if not target:
            return []
        return ["--rebuild"] if target == "bucket" else ["--rebuild", "--collection", target]


def _load(path: Path) -> AppConfig:
    from dcp_cdc.config import load_config

    return load_config(path)


def _entry_points(config: AppConfig) -> Path | str:
    """Where spark-submit finds ``bronze/job.py`` and the others."""
    if config.airflow.application_dir:
        return config.airflow.application_dir
    spec = importlib.util.find_spec("pipelines")  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise ImportError("the pipelines package of dcp-cdc is not installed for this Python")
    return Path(spec.origin).parent


def _spark_submit() -> str:
    """The ``spark-submit`` of the pyspark installed for this Python, else the PATH's.

    pyspark's own script (in the package, not the venv's ``bin/`` wrapper) knows its Spark
    home from where it lies; the wrapper would look for a ``python3`` on the PATH that has
    pyspark, which an Airflow worker need not have.
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin is not None:
        script = Path(spec.origin).parent / "bin" / "spark-submit"
        if script.exists():
            return str(script)
    return "spark-submit"


def _default_args(config: AppConfig) -> dict[str, Any]:
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


def _start_date(config: AppConfig) -> dt.datetime:
    start = config.airflow.start_date
    return dt.datetime(start.year, start.month, start.day, tzinfo=dt.UTC)


def _submit(
    task_id: str,
    script: str,
    args: Sequence[str],
    *,
    config: AppConfig,
    config_path: Path,
    **kwargs: Any,
) -> DcpSparkSubmitOperator:
    entry = _entry_points(config)
    application = f"{entry}/{script}" if isinstance(entry, str) else str(entry / script)
    return DcpSparkSubmitOperator(
        task_id=task_id,
        config_path=str(config_path),
        application=application,
        application_args=["--config", str(config_path), *args],
        conn_id=config.airflow.spark_conn_id,
        spark_binary=config.airflow.spark_submit,
        driver_memory_override=config.airflow.driver_memory,
        name=f"dcp-cdc-{task_id}",
        **kwargs,
    )


def pipeline_dag(config: AppConfig, config_path: Path, bucket: str) -> DAG:
    """``ingest_bronze >> apply_silver >> check_quality`` for one bucket."""
    from dcp_cdc.naming import identifier

    with DAG(
        dag_id=f"dcp_cdc__{identifier(bucket)}",
        description=f"DCP captures of bucket {bucket!r} into bronze, silver, quality",
        schedule=config.airflow.schedule or None,
        start_date=_start_date(config),
        catchup=config.airflow.catchup,
        max_active_runs=1,  # runs of one bucket must not overlap: order matters
        default_args=_default_args(config),
        tags=["dcp-cdc", bucket],
        params={
            BACKFILL_PARAM: Param(
                "",
                type="string",
                pattern=r"^$|^bucket$|^[A-Za-z0-9_%-]+\.[A-Za-z0-9_%-]+$",
                description="A manual backfill: 'bucket' rebuilds every silver table of the "
                "bucket from all of bronze, 'SCOPE.NAME' only that collection's; empty: a "
                "normal run",
            ),
        },
        doc_md=__doc__,
    ) as dag:
        common = {"config": config, "config_path": config_path}
        ingest = _submit("ingest_bronze", "bronze/job.py", ["--bucket", bucket], **common)
        apply = _submit(
            "apply_silver",
            "silver/job.py",
            ["--bucket", bucket],
            backfill=True,
            **common,
        )
        # A failed check fails the run and leaves the data in place; the next run goes on.
        # It is not retried: the same data would fail the same way.
        check = _submit(
            "check_quality", "quality/job.py", ["--bucket", bucket], retries=0, **common
        )
        ingest >> apply >> check
    return dag


def maintenance_dag(config: AppConfig, config_path: Path) -> DAG:
    """One maintenance task per bucket, one after the other."""
    from dcp_cdc.naming import identifier

    with DAG(
        dag_id=MAINTENANCE_DAG_ID,
        description="OPTIMIZE, VACUUM, tombstone purge, quality-results retention",
        schedule=config.airflow.maintenance_schedule or None,
        start_date=_start_date(config),
        catchup=False,
        max_active_runs=1,
        default_args=_default_args(config),
        tags=["dcp-cdc", "maintenance"],
        doc_md=__doc__,
    ) as dag:
        previous = None
        for bucket in config.buckets:
            task = _submit(
                f"maintain__{identifier(bucket.name)}",
                "maintenance.py",
                ["--bucket", bucket.name],
                config=config,
                config_path=config_path,
            )
            if previous is not None:
                previous >> task
            previous = task
    return dag


def build(config_path: Path) -> dict[str, DAG]:
    """Every DAG of the configuration at ``config_path``, by id."""
    config = _load(config_path)
    dags = [pipeline_dag(config, config_path, b.name) for b in config.buckets]
    dags.append(maintenance_dag(config, config_path))
    return {dag.dag_id: dag for dag in dags}


CONFIG_PATH = Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG).resolve()
# Airflow collects the DAG objects it finds in this module's namespace.
globals().update(build(CONFIG_PATH))
