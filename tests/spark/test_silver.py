"""Silver over simulator captures: the live tables equal the bucket's ground truth."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.protocol import cas_time
from dcp_cdc.simulator import SCENARIOS, simulate
from pipelines.app.cli import main
from pipelines.bronze.job import ingest_bucket
from pipelines.silver.job import apply_bucket
from pipelines.silver.transforms import modified_at
from pipelines.tables import BucketTables, all_rows
from tests.support.silver_runs import (
    arrive_in_batches,
    drop_all,
    ingest_and_apply,
    one_bucket,
    side_by_side,
)
from tests.support.truth import assert_equal_to_truth, silver_live, truth_live, utc

SEEDS = int(os.environ.get("DCP_CDC_SEEDS", "24"))  # 3 per scenario; make test-long: 200
ARRIVAL_SEEDS = int(os.environ.get("DCP_CDC_ARRIVAL_SEEDS", "3"))
"""Seeds whose files arrive one per run, shuffled (make test-long: 24, 3 per scenario)."""
ARRIVAL_SCENARIOS = ("mixed", "interrupted", "collection-lifecycle", "rollback")
ARRIVAL_SCENARIOS += tuple(s for s in SCENARIOS if s not in ARRIVAL_SCENARIOS)
"""Those with several sessions (and files) first: their order is what one file a run tests."""


def test_modified_at_is_the_time_of_the_cas_clock(spark: SparkSession) -> None:
    """Spec §1.5: silver's ``_modified_at`` expression agrees with ``cas_time`` to the
    microsecond, on the spec's CAS, counter bits set, the ends of the range and CAS 0."""
    values = [
        0x17A8B0D8E6F40000,
        0x17A8B0D8E6F4FFFF,
        0x17A8B0D8E6F50000,
        12345,
        1 << 16,
        (1 << 63) - 1,
        0,
        1 << 63,
        (1 << 64) - 1,
    ]
    signed = [(i, v - (1 << 64) if v >= 1 << 63 else v) for i, v in enumerate(values)]
    rows = (
        spark.createDataFrame(signed, "i INT, cas LONG")
        .select("i", modified_at("cas").alias("at"))
        .orderBy("i")
        .collect()
    )
    assert [utc(r["at"]) for r in rows] == [cas_time(v) for v in values]
    assert rows[0]["at"] is not None and utc(rows[0]["at"]) == dt.datetime(
        2024, 1, 9, 13, 28, 24, 593907, tzinfo=dt.UTC
    )


def test_many_seeds_in_one_bucket_equal_their_truths(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """DCP_CDC_SEEDS simulations (every scenario in turn) share one bucket on disjoint
    vbuckets and key prefixes, so one pipeline run checks them all against their truths."""
    landing = tmp_path / "landing"
    landing.mkdir()
    results = []
    for i in range(SEEDS):
        scenario = SCENARIOS[i % len(SCENARIOS)]
        result = simulate(
            tmp_path / f"sim{i}",
            bucket=bucket,
            scenario=scenario,
            seed=100 + i,
            vbuckets=4,
            docs=60,
            ops=240,
            vbucket_offset=4 * i,
            key_prefix=f"k{i}/",
        )
        for f in result.files:
            (landing / f.name).write_bytes(f.read_bytes())
        results.append(result)
    config = AppConfig(
        landing=str(landing), warehouse=str(spark_warehouse), buckets=[BucketConfig(name=bucket)]
    )
    ingest_bucket(spark, config, config.buckets[0])
    apply_bucket(spark, config, config.buckets[0])
    silver = silver_live(spark, bucket)
    for i, result in enumerate(results):
        mine = {k: v for k, v in silver.items() if k[1].startswith(f"k{i}/")}
        truth = truth_live(result)
        assert set(mine) == set(truth), f"seed {100 + i} ({SCENARIOS[i % len(SCENARIOS)]})"
        for ident, d in truth.items():
            assert (mine[ident]["_seqno"], mine[ident]["_rev_seqno"]) == (
                d["seqno"],
                d["rev_seqno"],
            )


@pytest.mark.long
def test_many_seeds_one_file_per_run_in_a_shuffled_order_equal_their_truths(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    """DCP_CDC_ARRIVAL_SEEDS simulations (every scenario in turn), each in a bucket of its
    own, whose files arrive in a shuffled order, one file per ingest and apply: each ends
    equal to its truth, and with every collection under its name (none left ``_unknown``).
    (Buckets of their own: simulations side by side in one bucket share collection ids, and
    a drop one of them makes in all the vbuckets seen so far would retire the others'.)"""
    for i in range(ARRIVAL_SEEDS):
        scenario = ARRIVAL_SCENARIOS[i % len(ARRIVAL_SCENARIOS)]
        bucket = f"arr{i}{uuid.uuid4().hex[:6]}"
        result = simulate(
            tmp_path / f"sim{i}",
            bucket=bucket,
            scenario=scenario,
            seed=500 + i,
            vbuckets=4,
            docs=50,
            ops=200,
        )
        files = list(result.files)
        random.Random(i).shuffle(files)
        landing = tmp_path / f"landing{i}"
        landing.mkdir()
        config = AppConfig(
            landing=str(landing),
            warehouse=str(spark_warehouse),
            buckets=[BucketConfig(name=bucket)],
        )
        try:
            for f in files:
                shutil.copy(f, landing)
                ingest_bucket(spark, config, config.buckets[0])
                apply_bucket(spark, config, config.buckets[0])
            where = f"seed {500 + i} ({scenario}, {len(files)} files)"
            try:
                assert_equal_to_truth(spark, bucket, result)
            except AssertionError as exc:
                raise AssertionError(f"{where}: {exc}") from None
            names = [r["table_name"] for r in spark.table(BucketTables(bucket).registry).collect()]
            assert not [n for n in names if "_unknown" in n], where
        finally:
            drop_all(spark, bucket)


@pytest.mark.long
def test_incremental_runs_in_any_arrival_order_equal_one_run(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Files arrive in shuffled batches with an ingest and an apply after each (and one apply
    twice): the result equals the truth, and a further apply changes nothing. Two scenarios
    share the bucket on disjoint vbuckets and keys: ``mixed`` and ``interrupted`` (its open
    snapshots wait across runs)."""
    results = side_by_side(
        tmp_path,
        bucket,
        ("mixed", "interrupted"),
        seed=9,
        vbuckets=8,
        docs=120,
        ops=600,
        max_file_bytes=25_000,
        inject_malformed=1,
    )
    config = AppConfig(
        landing=str(tmp_path / "landing"),
        warehouse=str(spark_warehouse),
        buckets=[BucketConfig(name=bucket)],
    )
    assert arrive_in_batches(spark, config, results, seed=9) >= 10
    again = apply_bucket(spark, config, config.buckets[0])  # no new bronze data
    assert again.changes == 0 and not again.rollbacks
    # each vbucket's state keeps the version of the first run the next apply reads for it:
    # the run of a frame it has not consumed (an open snapshot's), else the one after the
    # newest run read; the next apply reads the ingest log from the oldest of them on
    names = BucketTables(bucket)
    run_versions = {
        r["ingest_run_id"]: r["run_version"] for r in spark.table(names.ingest_log).collect()
    }
    newest = max(run_versions.values())
    states = spark.table(names.stream_state).collect()
    assert states
    for row in states:
        state = json.loads(row["state"])
        if row["open_snapshot_start"] is None:
            assert state["position_version"] == newest + 1, row["vbucket"]
        else:
            assert state["position_version"] == run_versions[row["position_run_id"]], row["vbucket"]
    for result, prefix in zip(results, ("mixed/", "interrupted/"), strict=True):
        assert_equal_to_truth(spark, bucket, result, key_prefix=prefix)
    versions = {
        r["table_name"]: spark.sql(f"DESCRIBE HISTORY {all_rows(r['table_name'])}").count()
        for r in spark.table(BucketTables(bucket).registry).where("status != 'retired'").collect()
    }
    apply_bucket(spark, config, config.buckets[0])
    assert versions == {t: spark.sql(f"DESCRIBE HISTORY {all_rows(t)}").count() for t in versions}


def test_the_views_of_a_bucket_simulated_now_show_its_documents_with_a_ttl(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    """``dcp-cdc simulate`` makes its bucket now: a document with a TTL is in its collection's
    view until its expiry by the wall clock, as the truth holds it (the route collection's
    max TTL gives each of its documents one)."""
    bucket = f"now{uuid.uuid4().hex[:6]}"
    args = ["simulate", "--out", str(tmp_path), "--bucket", bucket, "--seed", "5"]
    assert (
        main([*args, "--scenario", "mixed", "--vbuckets", "8", "--docs", "200", "--ops", "800"])
        == 0
    )
    try:
        ingest_and_apply(spark, one_bucket(tmp_path / "landing", spark_warehouse, bucket))
        registry = spark.table(BucketTables(bucket).registry).where("status != 'retired'")
        before = time.time()
        shown = {
            (r["_collection_id"], r["key"])
            for reg in registry.collect()
            for r in spark.table(reg["table_name"]).select("_collection_id", "key").collect()
        }
        after = time.time()
        truth = truth_live(SimpleNamespace(out=tmp_path))  # type: ignore[arg-type]
        expiring = {k for k, d in truth.items() if before <= d["expiry"] <= after}
        live = {k for k, d in truth.items() if d["expiry"] == 0 or d["expiry"] > after}
        assert shown - expiring == live - expiring
        assert sum(1 for k in shown if truth[k]["expiry"]) > 20
    finally:
        drop_all(spark, bucket)
