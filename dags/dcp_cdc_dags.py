"""Airflow DAGs of dcp-cdc, made from one configuration file.

The file is ``$DCP_CDC_CONFIG`` (default: ``conf/local.toml`` of the checkout, else of the
working directory). For every configured bucket a pipeline DAG ``dcp_cdc__<bucket>``::

    [capture >>] ingest_bronze >> apply_silver >> check_quality

(``capture``, ``dcp-cdc capture --until now``, when the bucket has a ``[buckets.capture]``
section: the agent streams the cluster up to now, then the jobs run on what it wrote)

and one maintenance DAG ``dcp_cdc_maintenance`` with a ``maintain__<bucket>`` task per bucket
(OPTIMIZE, VACUUM, tombstone purge, quality-results retention) and a ``check_full__<bucket>``
after it (``dcp-cdc check --full``: the pipeline's checks read only what arrived since the
last one), one bucket after the other.

Each task is ``spark-submit`` of the same entry point the command line uses
(``pipelines/bronze/job.py``, ``pipelines/silver/job.py``, ``pipelines/quality/job.py``,
``pipelines/maintenance/job.py``), built by :mod:`pipelines.app.airflow_tasks`. The master comes from the
Airflow connection ``[airflow] spark_conn_id``: the same DAG runs on a local Spark or a
cluster by changing the connection.

Parsing stays light: this file imports Airflow, the standard library, ``dcp_cdc.config``
(pydantic, which Airflow has loaded already) to validate the file, so a wrong setting shows as
an import error naming the field, and ``pipelines.app.airflow_tasks``, which imports nothing heavier.
Spark and Great Expectations are imported only by the jobs, in the process ``spark-submit``
starts.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG, Param

from dcp_cdc.config import AppConfig, load_config
from dcp_cdc.naming import identifier
from pipelines.app.airflow_tasks import (
    BACKFILL_PARAM,
    BACKFILL_PATTERN,
    MAINTENANCE_DAG_ID,
    capture,
    config_path,
    default_args,
    start_date,
    submit,
)


def pipeline_dag(config: AppConfig, path: Path, bucket: str) -> DAG:
    """``ingest_bronze >> apply_silver >> check_quality`` for one bucket."""
    with DAG(
        dag_id=f"dcp_cdc__{identifier(bucket)}",
        description=f"DCP captures of bucket {bucket!r} into bronze, silver, quality",
        schedule=config.airflow.schedule or None,
        start_date=start_date(config),
        catchup=config.airflow.catchup,
        max_active_runs=1,  # runs of one bucket must not overlap: order matters
        default_args=default_args(config),
        tags=["dcp-cdc", bucket],
        params={
            BACKFILL_PARAM: Param(
                "",
                type="string",
                pattern=BACKFILL_PATTERN,
                description="A manual backfill: 'bucket' rebuilds every silver table of the "
                "bucket from all of bronze, 'SCOPE.NAME' only that collection's; empty: a "
                "normal run",
            ),
        },
        doc_md=__doc__,
    ) as dag:
        common = {"config": config, "config_path": path}
        args = ["--bucket", bucket]
        ingest = submit("ingest_bronze", "bronze/job.py", args, **common)
        apply = submit("apply_silver", "silver/job.py", args, backfill=True, **common)
        # A failed check fails the run and leaves the data in place; the next run goes on.
        # It is not retried: the same data would fail the same way.
        check = submit("check_quality", "quality/job.py", args, retries=0, **common)
        ingest >> apply >> check
        if config.bucket(bucket)[0].capture is not None:
            capture(bucket, config=config, config_path=path) >> ingest
    return dag


def maintenance_dag(config: AppConfig, path: Path) -> DAG:
    """Per bucket a maintenance task, then a full quality check; one bucket after the other."""
    with DAG(
        dag_id=MAINTENANCE_DAG_ID,
        description="OPTIMIZE, VACUUM, tombstone purge, quality-results retention, full check",
        schedule=config.airflow.maintenance_schedule or None,
        start_date=start_date(config),
        catchup=False,
        max_active_runs=1,
        default_args=default_args(config),
        tags=["dcp-cdc", "maintenance"],
        doc_md=__doc__,
    ) as dag:
        previous = None
        for bucket in config.buckets:
            task = submit(
                f"maintain__{identifier(bucket.name)}",
                "maintenance/job.py",
                ["--bucket", bucket.name],
                config=config,
                config_path=path,
            )
            full = submit(
                f"check_full__{identifier(bucket.name)}",
                "quality/job.py",
                ["--bucket", bucket.name, "--full"],
                config=config,
                config_path=path,
                retries=0,
            )
            if previous is not None:
                previous >> task
            task >> full
            previous = full
    return dag


def build(path: Path) -> dict[str, DAG]:
    """Every DAG of the configuration at ``path``, by id."""
    config = load_config(path)
    dags = [pipeline_dag(config, path, b.name) for b in config.buckets]
    dags.append(maintenance_dag(config, path))
    return {dag.dag_id: dag for dag in dags}


CONFIG_PATH = config_path()
# Airflow collects the DAG objects it finds in this module's namespace.
globals().update(build(CONFIG_PATH))
