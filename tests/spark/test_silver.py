"""Silver over simulator captures: the live tables equal the bucket's ground truth."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import random
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.protocol import cas_time
from dcp_cdc.simulator import SCENARIOS, SimulationResult, simulate
from pipelines.bronze.job import ingest_bucket
from pipelines.silver.job import apply_bucket
from pipelines.silver.transforms import modified_at
from pipelines.tables import BucketTables, all_rows

SEEDS = int(os.environ.get("DCP_CDC_SEEDS", "24"))  # 3 per scenario; make test-long: 200
ARRIVAL_SEEDS = int(os.environ.get("DCP_CDC_ARRIVAL_SEEDS", "3"))
"""Seeds whose files arrive one per run, shuffled (make test-long: 24, 3 per scenario)."""
ARRIVAL_SCENARIOS = ("mixed", "interrupted", "collection-lifecycle", "rollback")
ARRIVAL_SCENARIOS += tuple(s for s in SCENARIOS if s not in ARRIVAL_SCENARIOS)
"""Those with several sessions (and files) first: their order is what one file a run tests."""


def _drop_all(spark: SparkSession, bucket: str) -> None:
    prefix = bucket.replace("-", "_")
    for db in ("bronze", "silver"):
        for t in spark.catalog.listTables(db):
            if t.name.startswith(prefix):
                kind = "VIEW" if t.tableType == "VIEW" else "TABLE"
                spark.sql(f"DROP {kind} IF EXISTS {db}.{t.name}")


@pytest.fixture
def bucket(spark: SparkSession) -> Any:
    name = f"s{uuid.uuid4().hex[:8]}"  # plain: its identifier is itself
    yield name
    _drop_all(spark, name)


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


def silver_live(spark: SparkSession, bucket: str) -> dict[tuple[int, str], dict[str, Any]]:
    """Every non-deleted row of every live collection table (expired ones included)."""
    registry = spark.table(BucketTables(bucket).registry).where("status != 'retired'").collect()
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    for reg in registry:
        for r in spark.table(all_rows(reg["table_name"])).where(~F.col("_deleted")).collect():
            assert (r["_collection_id"], r["key"]) not in rows
            rows[(r["_collection_id"], r["key"])] = r.asDict()
    return rows


def truth_live(result: SimulationResult) -> dict[tuple[int, str], dict[str, Any]]:
    docs = {}
    for line in (result.out / "truth" / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["key"] if "key" in d else base64.b64decode(d["key_b64"]).decode("utf-8", "replace")
        docs[(d["collection_id"], key)] = d
    return docs


def assert_equal_to_truth(
    spark: SparkSession, bucket: str, result: SimulationResult, key_prefix: str = ""
) -> None:
    """Live silver rows (of keys with ``key_prefix``) equal the truth: keys, bodies, user
    xattrs, seqno, rev seqno, expiry, flags, cas, the time of the cas and vbucket."""
    silver = {k: v for k, v in silver_live(spark, bucket).items() if k[1].startswith(key_prefix)}
    truth = truth_live(result)
    assert set(silver) == set(truth), (
        f"missing {sorted(set(truth) - set(silver))[:3]}, extra {sorted(set(silver) - set(truth))[:3]}"
    )
    for ident, d in truth.items():
        row = silver[ident]
        if d["is_json"]:
            assert row["doc"] == d["value"] and row["doc_binary"] is None
        else:
            assert row["doc_binary"] == base64.b64decode(d["value_b64"]) and row["doc"] is None
        user = {k: v for k, v in (d["xattrs"] or {}).items() if not k.startswith("_")}
        assert (row["xattrs"] or {}) == user
        assert (row["_seqno"], row["_rev_seqno"], row["_expiry"], row["_flags"]) == (
            d["seqno"],
            d["rev_seqno"],
            d["expiry"],
            d["flags"],
        )
        assert row["_cas"] == (d["cas"] - (1 << 64) if d["cas"] >= 1 << 63 else d["cas"])
        assert _utc(row["_modified_at"]) == cas_time(d["cas"])
        assert row["_vbucket"] == d["vbucket"]


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    """A timestamp as collected (naive, the machine's local time) as an aware UTC one."""
    return value.astimezone(dt.UTC) if value is not None else None


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
    assert [_utc(r["at"]) for r in rows] == [cas_time(v) for v in values]
    assert rows[0]["at"] is not None and _utc(rows[0]["at"]) == dt.datetime(
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
            _drop_all(spark, bucket)


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
    # each vbucket's state keeps the version of the run its position is in: the next run
    # reads the ingest log from the oldest of them on
    names = BucketTables(bucket)
    run_versions = {
        r["ingest_run_id"]: r["run_version"] for r in spark.table(names.ingest_log).collect()
    }
    states = spark.table(names.stream_state).collect()
    assert states
    for row in states:
        state = json.loads(row["state"])
        assert state["position_version"] == run_versions[row["position_run_id"]], row["vbucket"]
    for result, prefix in zip(results, ("mixed/", "interrupted/"), strict=True):
        assert_equal_to_truth(spark, bucket, result, key_prefix=prefix)
    versions = {
        r["table_name"]: spark.sql(f"DESCRIBE HISTORY {all_rows(r['table_name'])}").count()
        for r in spark.table(BucketTables(bucket).registry).where("status != 'retired'").collect()
    }
    apply_bucket(spark, config, config.buckets[0])
    assert versions == {t: spark.sql(f"DESCRIBE HISTORY {all_rows(t)}").count() for t in versions}
