"""A check that starts from the last one's state computes the same metric frames as a check
over all of bronze, after every run, pass and fail alike; and so do the driver's checks, over
columns and over rows (pipelines/quality/small), and the check over columns from its own
state (pipelines/quality/small/incremental.py).

Each group simulates DCP_CDC_CHECK_SEEDS_PER_GROUP seeds (3) of one scenario side by side in
one bucket (disjoint vbuckets and keys); their capture files arrive shuffled in
DCP_CDC_CHECK_BATCHES batches (2), or in session order in one batch more, and after each
batch's ingest and apply the checks run from their carried state and, beside them, over
everything: every metric row must be equal. Groups take the scenarios in turn
(DCP_CDC_CHECK_GROUPS: 1 in ``make test``; ``make test-long`` runs 10 groups of 20 seeds in
4 batches, 200 seeds), with the live layer on in even groups, off in odd ones. A rollback or
a drop sends a check back over everything; in the other scenarios a later check starts from
its state (in session order, for the check over columns: a file that arrives after later
ones of its session sends that one back over everything).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.config import SilverConfig
from dcp_cdc.simulator import SCENARIOS, simulate
from pipelines.errors import FullCheckNeeded
from pipelines.lake import delta_io
from pipelines.quality import carry
from pipelines.quality.compute import compute
from pipelines.quality.job import pinned_versions
from pipelines.quality.small import carried as columnar_state
from pipelines.quality.small.columnar import compute_columnar
from pipelines.quality.small.compute import compute_small
from pipelines.quality.small.incremental import compute_incremental
from pipelines.silver import live
from pipelines.silver.registry import read_registry
from pipelines.tables import BucketTables, all_rows
from tests.support.silver_runs import drop_all, ingest_and_apply, land, one_bucket

GROUPS = int(os.environ.get("DCP_CDC_CHECK_GROUPS", "1"))
PER_GROUP = int(os.environ.get("DCP_CDC_CHECK_SEEDS_PER_GROUP", "3"))
BATCHES = int(os.environ.get("DCP_CDC_CHECK_BATCHES", "2"))
# Scenarios whose files hold no rollback, drop or resend: their later checks start from
# the state. The others exercise the way back to a full check.
CONTINUING = ("basic", "ttl", "history", "interrupted", "oso-backfill")
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


def _rows(metrics: dict[str, Any]) -> dict[str, list[str]]:
    return {name: sorted(repr(sorted(r.items())) for r in m.rows) for name, m in metrics.items()}


def _columnar_from_state(
    spark: SparkSession, bucket: str, at: dict[str, int]
) -> tuple[dict[str, list[str]], str | None]:
    """The columnar check from its carried state (saving the next), as the job runs it: its
    rows and why it read everything (None: it did not)."""
    state = columnar_state.read(spark, bucket)
    why = "no state of an earlier check"
    if state is not None:
        try:
            found, after = compute_incremental(spark, bucket, at, state)
        except FullCheckNeeded as exc:
            why = str(exc)
        else:
            columnar_state.write(spark, bucket, after, {})
            return _rows(found.metrics), None
    everything = compute_columnar(spark, bucket, at, keep=True)
    if everything.state is not None:
        columnar_state.write(spark, bucket, everything.state, {})
    return _rows(everything.metrics), why


def _check_both_ways(spark: SparkSession, bucket: str) -> str | None:
    """The check from the carried state (saving the next one) and over everything; asserts
    equal rows, returns why the first read everything (None: it did not)."""
    at = pinned_versions(spark, bucket)
    from_state = compute(
        spark,
        bucket,
        at,
        carry.read(spark, bucket),
        save=lambda state: carry.write(spark, bucket, state, {}),
    )
    over_all = compute(spark, bucket, at, None, full=True)
    in_driver = compute_small(spark, bucket, at)
    ours, theirs = _rows(from_state.metrics), _rows(over_all.metrics)
    small = _rows(in_driver.metrics)
    columnar = _rows(compute_columnar(spark, bucket, at).metrics)
    shared = _rows(compute_columnar(spark, bucket, at, share_frames=150).metrics)
    from_columns, why = _columnar_from_state(spark, bucket, at)
    for name in theirs:
        assert from_columns[name] == theirs[name], (name, "over columns from the state", why)
        assert shared[name] == theirs[name], (name, "over columns, a share of vbuckets at a time")
        assert ours[name] == theirs[name], (name, from_state.full_because)
        assert small[name] == theirs[name], (name, "computed in the driver")
        assert columnar[name] == theirs[name], (name, "computed over columns")
        assert in_driver.metrics[name].columns == tuple(over_all.metrics[name].columns)
    return from_state.full_because


def _scenario(group: int) -> str:
    """The scenario of ``group``: the continuing ones first, then the others, in turn."""
    return (CONTINUING + tuple(s for s in SCENARIOS if s not in CONTINUING))[group % len(SCENARIOS)]


def _group_files(
    tmp_path: Path, bucket: str, scenario: str, seed: int, malformed: int
) -> list[Path]:
    """The capture files of PER_GROUP simulations of ``scenario`` side by side in ``bucket``
    (disjoint vbuckets and keys), seeds from ``seed``."""
    files = []
    for i in range(PER_GROUP):
        result = simulate(
            tmp_path / f"sim{i}",
            bucket=bucket,
            scenario=scenario,
            seed=seed + i,
            vbuckets=2,
            docs=40,
            ops=160,
            vbucket_offset=2 * i,
            key_prefix=f"k{i}/",
            max_file_bytes=6_000,
            inject_malformed=malformed,
        )
        files += result.files
    return files


@pytest.mark.parametrize("group", range(GROUPS))
def test_a_check_from_its_state_equals_a_check_over_everything(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, group: int
) -> None:
    scenario = _scenario(group)
    bucket = f"qi{group}_{random.randrange(1 << 30):x}"
    files = _group_files(tmp_path, bucket, scenario, 1000 + group * PER_GROUP, group % 2)
    assert len({f.name for f in files}) == len(files)
    random.Random(group).shuffle(files)
    landing = tmp_path / "landing"
    landing.mkdir()
    config = one_bucket(
        landing, spark_warehouse, bucket, silver=SilverConfig(live_layer=group % 2 == 0)
    )
    reasons = []
    try:
        size = -(-len(files) // BATCHES)
        for start in range(0, len(files), size):
            land(landing, files[start : start + size])
            ingest_and_apply(spark, config)
            reasons.append(_check_both_ways(spark, bucket))
        assert reasons[0] == "no state of an earlier check"
        if scenario in CONTINUING:
            assert None in reasons[1:], reasons
    finally:
        drop_all(spark, bucket, ("bronze", "silver", "quality"))


@pytest.mark.parametrize("group", range(GROUPS))
def test_a_columnar_check_from_its_state_equals_one_over_everything(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, group: int
) -> None:
    """Capture files that arrive in session order, in DCP_CDC_CHECK_BATCHES + 1 batches: after
    each batch's ingest and apply, the columnar check from its state gives the rows of the
    columnar check over everything (which equals Spark's: above), and in the scenarios
    without a rollback, drop or resend a later one starts from its state."""
    scenario = _scenario(group)
    bucket = f"qc{group}_{random.randrange(1 << 30):x}"
    files = _group_files(tmp_path, bucket, scenario, 5000 + group * PER_GROUP, 0)
    files.sort(key=lambda f: f.name)
    landing = tmp_path / "landing"
    landing.mkdir()
    config = one_bucket(
        landing, spark_warehouse, bucket, silver=SilverConfig(live_layer=group % 2 == 0)
    )
    reasons = []
    try:
        batches = BATCHES + 1
        size = -(-len(files) // batches)
        for start in range(0, len(files), size):
            land(landing, files[start : start + size])
            ingest_and_apply(spark, config)
            at = pinned_versions(spark, bucket)
            ours, why = _columnar_from_state(spark, bucket, at)
            theirs = _rows(compute_columnar(spark, bucket, at).metrics)
            for name in theirs:
                assert ours[name] == theirs[name], (name, why)
            reasons.append(why)
        assert reasons[0] == "no state of an earlier check"
        if scenario in CONTINUING:
            assert None in reasons[1:], reasons
    finally:
        drop_all(spark, bucket, ("bronze", "silver", "quality"))


def _data_files(warehouse: Path, table: str) -> set[Path]:
    """The data files in the folder of the silver table ``table`` (``silver.name``)."""
    folder = warehouse / "silver.db" / table.partition(".")[2]
    return {f for f in folder.rglob("*.parquet") if "_delta_log" not in f.parts}


def test_a_check_whose_last_silver_versions_are_vacuumed_reads_everything(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    """The last check read silver at versions whose files a compaction and a VACUUM have
    removed since: the check from the state cannot read them, so it reads everything, says
    why, and its rows are those of a full check."""
    bucket = f"qv_{random.randrange(1 << 30):x}"
    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario="basic", seed=77, vbuckets=2, docs=40, ops=160
    )
    files = sorted(result.files)
    landing = tmp_path / "landing"
    landing.mkdir()
    config = one_bucket(landing, spark_warehouse, bucket)
    try:
        for batch in (files[: len(files) // 2], files[len(files) // 2 :]):
            land(landing, batch)
            ingest_and_apply(spark, config)
            if batch[0] == files[0]:
                assert _check_both_ways(spark, bucket) == "no state of an earlier check"
        names = BucketTables(bucket)
        live.compact(spark, bucket, read_registry(spark, bucket))  # the live layer's rows
        registry = spark.table(names.registry).where("status = 'live'").collect()
        read = [names.pending, *(all_rows(r["table_name"]) for r in registry)]
        on_disk = {t: _data_files(spark_warehouse, t) for t in read}
        for table in read:
            spark.sql(f"OPTIMIZE {table}")
            with delta_io.session_conf(spark, {RETENTION_CHECK: "false"}):
                spark.sql(f"VACUUM {table} RETAIN 0 HOURS")
        gone = {t: on_disk[t] - _data_files(spark_warehouse, t) for t in read}
        assert any(gone.values()), gone  # files the last check's versions name are gone
        reason = _check_both_ways(spark, bucket)
        assert reason is not None and "gone" in reason, reason
    finally:
        drop_all(spark, bucket, ("bronze", "silver", "quality"))
