"""How the jobs are run: follow mode (``[follow]``), the Airflow DAGs (``[airflow]``), and the
Pushgateway batch runs push their metrics to (``[pushgateway]``)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from dcp_cdc.config.base import ConfigModel
from dcp_cdc.config.capture import listen_host


class FollowConfig(ConfigModel):
    """Follow mode (``dcp-cdc run --follow``): one long-running Spark session that ingests
    what lands and applies it to silver in micro-batches."""

    interval_s: Annotated[float, Field(gt=0, le=3600)] = 2.0
    """Seconds from the start of one micro-batch to the start of the next (a batch that takes
    longer is followed at once)."""
    rotate_seconds: Annotated[float, Field(ge=0.01, le=3600)] = 1.0
    """The capture agent run by follow mode closes its files at least this often (the lower of
    this and ``buckets.capture.rotate_seconds``): a change waits in staging no longer."""
    check_every_s: Annotated[float, Field(ge=0)] = 3600.0
    """Seconds between quality checks while following (0: only on demand, ``SIGUSR1``). A
    check runs beside the micro-batches (in a thread, Spark's fair scheduler sharing the
    cores), reading every table as of one moment between two of them."""
    metrics_port: Annotated[int | None, Field(ge=1, le=65535)] = None
    """Serve follow mode's Prometheus metrics (``/metrics``: micro-batch and step seconds,
    rows merged, freshness, quality) and its health (``/healthz``, ``/readyz``) over HTTP on
    this port (docs/metrics.md). Default: off. The capture agents it runs serve their own
    (``buckets.capture.metrics_port``), in their own processes."""
    metrics_host: Annotated[str, Field(min_length=1, max_length=253)] = "127.0.0.1"
    """The address ``metrics_port`` listens on: the loopback interface by default; ``0.0.0.0``
    (or ``::``) for every interface. The endpoint has no authentication."""
    unready_after_failed_batches: Annotated[int, Field(ge=1, le=1000)] = 3
    """A bucket whose micro-batches failed this many times in a row fails ``/readyz`` until
    one succeeds (a failed micro-batch is tried again at the next interval)."""
    stop_after_failed_batches: Annotated[int, Field(ge=1, le=100_000)] = 10
    """Follow mode gives up, stopping its agents and exiting with the last error, when a
    bucket's micro-batches failed this many times in a row (1: at the first failure), so that
    a supervisor restarts it. An error no retry cures (the configuration, credentials, a table
    or bucket that is not there) ends follow mode at the first failure."""

    @field_validator("metrics_host")
    @classmethod
    def _metrics_host(cls, value: str) -> str:
        return listen_host(value)

    @model_validator(mode="after")
    def _unready_before_stopping(self) -> FollowConfig:
        if self.unready_after_failed_batches > self.stop_after_failed_batches:
            raise ValueError(
                f"unready_after_failed_batches ({self.unready_after_failed_batches}) is above "
                f"stop_after_failed_batches ({self.stop_after_failed_batches}): follow mode "
                "would stop before it is unready"
            )
        return self


class PushgatewayConfig(ConfigModel):
    """Batch runs (``dcp-cdc ingest``, ``apply``, ``check``, ``run``, and so the Airflow
    tasks) push their metrics to a Prometheus Pushgateway when they end (docs/metrics.md)."""

    url: str | None = None
    """The Pushgateway, ``http://host:9091`` (or ``https://``). Default: none, nothing is
    pushed. A push that fails is logged and does not fail the run."""
    job: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "dcp_cdc"
    """The ``job`` label of the pushed groups (each run's group is this, its bucket and its
    verb)."""
    timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    """Seconds a push may take."""

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.match(r"^https?://[^/\s@]+(/\S*)?$", value):
            # not echoed: credentials written into the URL must not reach the message
            raise ValueError(
                "expected http://host:port or https://host:port, without a user or password"
            )
        return value


class AirflowConfig(ConfigModel):
    """How the DAGs in ``dags/`` schedule the jobs (read when Airflow parses the DAG file)."""

    schedule: str | None = "@hourly"
    """Schedule of each bucket's pipeline DAG: a cron expression or preset; empty: manual runs
    only."""
    maintenance_schedule: str | None = "@daily"
    """Schedule of the maintenance DAG (``dcp_cdc_maintenance``)."""
    start_date: dt.date = dt.date(2026, 1, 1)
    """The first logical date of the DAGs."""
    catchup: bool = False
    """Run the intervals missed since ``start_date`` (each run takes whatever landed anyway)."""
    retries: Annotated[int, Field(ge=0)] = 2
    """Retries of a failed task (a failed quality check is not retried)."""
    retry_delay_seconds: Annotated[int, Field(ge=0)] = 300
    """Delay before the first retry."""
    retry_exponential_backoff: Annotated[float, Field(ge=0)] = 2.0
    """Multiplier of the delay at each further retry; 0: a constant delay."""
    max_retry_delay_seconds: Annotated[int, Field(ge=0)] = 3600
    """Upper bound of the retry delay."""
    execution_timeout_minutes: Annotated[int, Field(ge=1)] = 120
    """A task running longer is stopped and fails (then retried)."""
    spark_conn_id: str = "dcp_cdc_spark"
    """The Airflow connection ``spark-submit`` takes the master (and deploy mode) from:
    ``local[2]`` here, ``yarn`` or ``spark://`` or ``k8s://`` on a cluster."""
    spark_submit: str | None = None
    """The ``spark-submit`` a worker runs: a path, or a name on its PATH. Default: the one of
    the pyspark installed beside Airflow, else ``spark-submit`` from the PATH."""
    application_dir: str | None = None
    """Where ``spark-submit`` finds the entry scripts (``bronze/job.py``, ...): a path or URI
    of the ``pipelines`` folder. Default: the installed ``pipelines`` package."""
    driver_memory: str | None = None
    """``spark.driver.memory`` (default: 6g with a local master, Spark's own otherwise)."""
    pool: str | None = None
    """The Airflow pool of every task. With the embedded Derby catalog only one Spark job may
    use the warehouse at a time: give such a deployment a pool with one slot."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: object) -> object:
        if isinstance(data, dict) and "py_files" in data:
            raise ValueError(
                "py_files moved to [spark] py_files (every entry point ships the code from it, "
                "not only the DAGs)"
            )
        return data
