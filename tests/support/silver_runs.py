"""Running the pipeline over simulations for silver's tests: simulate, ingest and apply in one
call; a simulation and an empty landing for its files to arrive in (in session order, or
with one file missing); the configuration of one plain bucket; files landed, then ingested
and applied; scenarios side by side in one bucket; files arriving shuffled in batches; and
dropping a bucket's tables afterwards."""

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
from pipelines.bronze.memory import IngestMemory
from pipelines.silver import state
from pipelines.silver.job import ApplySummary, apply_bucket
from pipelines.tables import BucketTables
from tests.support.reference_consumer import capture_files


def drop_all(
    spark: SparkSession, bucket: str, databases: Iterable[str] = ("bronze", "silver")
) -> None:
    """Drops every table and view of ``bucket`` in ``databases`` (bronze and silver)."""
    prefix = bucket.replace("-", "_")
    for db in databases:
        if not spark.catalog.databaseExists(db):  # a worker's first test may make only one
            continue
        for t in spark.catalog.listTables(db):
            if t.name.startswith(prefix):
                kind = "VIEW" if t.tableType == "VIEW" else "TABLE"
                spark.sql(f"DROP {kind} IF EXISTS {db}.{t.name}")


def one_bucket(landing: Path, warehouse: Path, bucket: str, **settings: Any) -> AppConfig:
    """The configuration of the plain bucket ``bucket`` over ``landing`` and ``warehouse``;
    ``settings`` are more of it."""
    return AppConfig(
        landing=str(landing),
        warehouse=str(warehouse),
        buckets=[BucketConfig(name=bucket)],
        **settings,
    )


def land(landing: Path, files: Iterable[Path]) -> None:
    """Copies ``files`` into ``landing``, each under its own name."""
    for f in files:
        (landing / f.name).write_bytes(f.read_bytes())


def ingest_and_apply(spark: SparkSession, config: AppConfig) -> ApplySummary:
    """An ingest and an apply of the first bucket of ``config``; the apply's summary."""
    ingest_bucket(spark, config, config.buckets[0])
    return apply_bucket(spark, config, config.buckets[0])


def empty_landing(tmp_path: Path, bucket: str, **sim: Any) -> tuple[SimulationResult, Path]:
    """A simulation of ``bucket`` under ``tmp_path/sim`` and an empty landing for its files,
    ``tmp_path/landing``."""
    result = simulate(tmp_path / "sim", bucket=bucket, **sim)
    landing = tmp_path / "landing"
    landing.mkdir()
    return result, landing


def landed(
    tmp_path: Path, bucket: str, warehouse: Path, **sim: Any
) -> tuple[SimulationResult, list[Path], Path, AppConfig]:
    """A small simulation of ``bucket`` (2 vbuckets, 30 documents, files of at most 4 kB,
    unless ``sim`` says otherwise), its capture files in session order (at least four), an
    empty landing and the configuration of ``bucket`` over it."""
    small = {"vbuckets": 2, "docs": 30, "max_file_bytes": 4_000}
    result, landing = empty_landing(tmp_path, bucket, **(small | sim))
    files = capture_files(result.out / "landing")
    assert len(files) >= 4
    return result, files, landing, one_bucket(landing, warehouse, bucket)


def landing_with_gap(
    tmp_path: Path, bucket: str, *, seed: int, at_least: int
) -> tuple[Path, list[Path]]:
    """A landing, ``tmp_path/landing``, of the files of a simulated session of ``bucket`` (a
    ``basic`` scenario of 4 vbuckets in files of 4 kB), at least ``at_least`` of them, but
    its third (sequence 2); the landing, and the files after the missing one in sequence
    order."""
    sim, landing = empty_landing(
        tmp_path,
        bucket,
        scenario="basic",
        seed=seed,
        vbuckets=4,
        docs=40,
        ops=160,
        max_file_bytes=4096,
    )
    land(landing, sorted(f for f in sim.files if "-s01-" in f.name))  # the first session
    files = sorted(landing.iterdir())
    assert len(files) >= at_least
    files[2].unlink()
    return landing, files[3:]


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


def unconsumed_from_memory(
    spark: SparkSession,
    names: BucketTables,
    states: dict[int, dict[str, Any]],
    memory: IngestMemory,
) -> state.Unconsumed:
    """The frames an apply of ``states`` walks, found as ``dcp-cdc run`` finds them: from the
    ingest log's rows and the data files the same process's ingest (``memory``) wrote."""
    memory.state(spark, names.ingest_log)  # the log's rows, as the run left them
    return state.unconsumed_frames(
        spark,
        names,
        states,
        log_rows=memory.rows,
        run_files=lambda runs: memory.run_files(spark, names.events, sorted(runs)),
    )
