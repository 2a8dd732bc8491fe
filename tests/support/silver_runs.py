"""Running the pipeline over simulations for silver's tests: simulate, ingest and apply in one
call; scenarios side by side in one bucket; files arriving shuffled in batches; and dropping
a bucket's tables afterwards."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.simulator import SimulationResult, simulate
from pipelines.bronze.job import ingest_bucket
from pipelines.silver.job import apply_bucket


def drop_all(spark: SparkSession, bucket: str) -> None:
    """Drops every bronze and silver table and view of ``bucket``."""
    prefix = bucket.replace("-", "_")
    for db in ("bronze", "silver"):
        if not spark.catalog.databaseExists(db):  # a worker's first test may make only one
            continue
        for t in spark.catalog.listTables(db):
            if t.name.startswith(prefix):
                kind = "VIEW" if t.tableType == "VIEW" else "TABLE"
                spark.sql(f"DROP {kind} IF EXISTS {db}.{t.name}")


def pipeline(
    spark: SparkSession,
    out: Path,
    warehouse: Path,
    bucket: str,
    *,
    settings: Mapping[str, Any] | None = None,
    **sim: Any,
) -> tuple[SimulationResult, AppConfig]:
    """Simulate into ``out``, ingest and apply; ``settings`` are more of the configuration
    (``silver``, ``buckets``: given, the bucket's own settings; its name is ``bucket``)."""
    result = simulate(out, bucket=bucket, **sim)
    config = AppConfig(
        landing=str(out / "landing"),
        warehouse=str(warehouse),
        **({"buckets": [BucketConfig(name=bucket)]} | dict(settings or {})),
    )
    ingest_bucket(spark, config, config.buckets[0])
    apply_bucket(spark, config, config.buckets[0])
    return result, config


def side_by_side(
    tmp_path: Path, bucket: str, scenarios: Iterable[str], *, seed: int, vbuckets: int, **sim: Any
) -> list[SimulationResult]:
    """One simulation per scenario (seeds from ``seed``), all of ``bucket`` on disjoint
    vbuckets, each scenario's keys prefixed ``<scenario>/``, under ``tmp_path/<scenario>``."""
    return [
        simulate(
            tmp_path / scenario,
            bucket=bucket,
            scenario=scenario,
            seed=seed + i,
            vbuckets=vbuckets,
            vbucket_offset=vbuckets * i,
            key_prefix=f"{scenario}/",
            **sim,
        )
        for i, scenario in enumerate(scenarios)
    ]


def arrive_in_batches(
    spark: SparkSession, config: AppConfig, results: list[SimulationResult], *, seed: int
) -> int:
    """The files of ``results`` arrive in ``config.landing`` shuffled, in three batches, with
    an ingest and an apply after each; returns how many files there were."""
    files = [f for result in results for f in result.files]
    random.Random(seed).shuffle(files)
    landing = Path(config.landing)
    landing.mkdir(exist_ok=True)
    third = len(files) // 3
    for batch in (files[:third], files[third : 2 * third], files[2 * third :]):
        for f in batch:
            shutil.copy(f, landing)
        ingest_bucket(spark, config, config.buckets[0])
        apply_bucket(spark, config, config.buckets[0])
    return len(files)
