"""Files that arrive in any order, one per run, converge to what one run over everything
gives: the same tables and views under the same names, the same rows, the same history, the
same registry. The hard case is a collection whose changes arrive before its create event
(the newer session's files first): it is registered by its id, then takes its name in the run
that learns it, exactly once, even when that run is killed half-way through the renames.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.capture import read_capture_header
from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.simulator import SimulationResult, simulate
from pipelines.bronze.job import ingest_bucket
from pipelines.lake import faults
from pipelines.silver.job import apply_bucket
from pipelines.tables import BucketTables
from tests.support.silver_runs import drop_all
from tests.support.truth import assert_equal_to_truth

VOLATILE = {"_applied_at", "_ingest_run_id", "updated_at"}
SUPPORT = ("__collections", "__stream_state", "__purges")
"""Columns that say when or by which run a row was written, not what it holds."""


def _silver(spark: SparkSession, bucket: str) -> dict[str, Any]:
    """Everything silver holds for ``bucket``, named without the bucket: each table's and
    view's type, each collection table's rows (without :data:`VOLATILE` columns), and the
    registry's names and statuses."""
    prefix = bucket.replace("-", "_")
    out: dict[str, Any] = {}
    for t in spark.catalog.listTables("silver"):
        if not t.name.startswith(prefix):
            continue
        name = t.name[len(prefix) :]
        if t.tableType == "VIEW" or name.endswith(SUPPORT):
            out[name] = t.tableType  # the support tables hold run ids and bucket names
            continue
        rows = spark.table(f"silver.{t.name}").collect()
        kept = [
            tuple(sorted((k, repr(v)) for k, v in r.asDict().items() if k not in VOLATILE))
            for r in rows
        ]
        out[name] = sorted(kept)
    registry = spark.table(BucketTables(bucket).registry).collect()
    out["registry:names"] = sorted(
        (r["collection_id"], r["scope"], r["name"], r["status"], r["renamed_from"])
        for r in registry
    )
    return out


def _newest_session_first(result: SimulationResult) -> list[Path]:
    """The capture files, the newest session's first (each session's files in order)."""

    def order(path: Path) -> tuple[str, int]:
        header, _ = read_capture_header(path)
        return header.started_at or "", -header.sequence

    return sorted(result.files, key=order, reverse=True)


def _config(landing: Path, warehouse: Path, bucket: str) -> AppConfig:
    return AppConfig(
        landing=str(landing),
        warehouse=str(warehouse),
        buckets=[BucketConfig(name=bucket, history=True)],
    )


def _one_per_run(spark: SparkSession, config: AppConfig, files: list[Path]) -> None:
    landing = Path(config.landing)
    landing.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, landing)
        ingest_bucket(spark, config, config.buckets[0])
        apply_bucket(spark, config, config.buckets[0])


def _killed_at(point: str) -> Any:
    def kill_now() -> None:
        raise KeyboardInterrupt(f"killed at {point}")

    return kill_now


pytestmark = pytest.mark.skipif(
    os.environ.get("DCP_CDC_ARRIVAL_ALL") != "1",
    reason="make test-long (DCP_CDC_ARRIVAL_ALL=1): two buckets, a run a file, 2-3 minutes each",
)


@pytest.mark.parametrize(
    "kill",
    [
        pytest.param(None, id="whole"),
        pytest.param("cataloged:silver.*_all", id="killed-mid-rename"),
    ],
)
def test_a_collection_named_late_takes_its_name_like_one_run_over_everything(
    spark: SparkSession,
    spark_warehouse: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kill: str | None,
) -> None:
    names = {w: f"late{w}{uuid.uuid4().hex[:6]}" for w in ("once", "late")}
    sim = {"scenario": "mixed", "seed": 3, "vbuckets": 4, "docs": 60, "ops": 240}
    results = {w: simulate(tmp_path / w, bucket=b, **sim) for w, b in names.items()}  # type: ignore[arg-type]
    configs = {w: _config(tmp_path / f"landing-{w}", spark_warehouse, b) for w, b in names.items()}
    try:
        Path(configs["once"].landing).mkdir()
        for f in results["once"].files:
            shutil.copy(f, configs["once"].landing)
        ingest_bucket(spark, configs["once"], configs["once"].buckets[0])
        apply_bucket(spark, configs["once"], configs["once"].buckets[0])

        files = _newest_session_first(results["late"])
        assert len({read_capture_header(f)[0].session_id for f in files}) >= 2
        _one_per_run(spark, configs["late"], files[:1])
        before = _silver(spark, names["late"])
        assert any("___unknown__collection_" in name for name in before), sorted(before)
        if kill is not None:
            shutil.copy(files[1], configs["late"].landing)
            ingest_bucket(spark, configs["late"], configs["late"].buckets[0])
            with monkeypatch.context() as m:
                m.setenv(faults.KILL_AT_ENV, kill)
                m.setattr(faults, "kill_now", _killed_at(kill))
                with pytest.raises(KeyboardInterrupt):
                    apply_bucket(spark, configs["late"], configs["late"].buckets[0])
            half = _silver(spark, names["late"])["registry:names"]
            assert any(renamed for *_, renamed in half), "killed half-way through the renames"
            apply_bucket(spark, configs["late"], configs["late"].buckets[0])
            _one_per_run(spark, configs["late"], files[2:])
        else:
            _one_per_run(spark, configs["late"], files[1:])

        once, late = _silver(spark, names["once"]), _silver(spark, names["late"])
        assert sorted(late) == sorted(once)
        for name in once:
            if late[name] != once[name]:  # the rows one side has and the other lacks
                a, b = set(late[name]), set(once[name])
                raise AssertionError((name, sorted(a - b)[:2], sorted(b - a)[:2]))
        assert_equal_to_truth(spark, names["late"], results["late"])
    finally:
        for bucket in names.values():
            drop_all(spark, bucket)
