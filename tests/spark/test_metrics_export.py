"""Metrics from real runs in the test session: follow mode's endpoint scraped over HTTP after
each of two micro-batches (step seconds, rows merged, freshness appear, then grow), and the
ingest and apply jobs pushing to a real Pushgateway what their summaries say.

The captures are the simulator's (``basic``, small): its changes are dated from 2026-01-05
by their CAS, so their freshness is the time since then, which the test knows.
"""

from __future__ import annotations

import io
import shutil
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, BucketConfig, FollowConfig, PushgatewayConfig
from dcp_cdc.simulator import SimulationResult, simulate
from dcp_cdc.simulator.state import START
from pipelines.bronze import job as bronze
from pipelines.follow.loop import Follower
from pipelines.follow.progress import Batch, BucketProgress
from pipelines.silver import job as silver
from tests.support import pushgateway as gateway
from tests.support.ports import free_port
from tests.support.pushgateway import MISSING, PUSHGATEWAY
from tests.support.silver_runs import drop_all

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def small(out: Path, bucket: str, part: int) -> SimulationResult:
    """A small simulation of ``bucket``'s vbuckets ``2 * part`` and ``2 * part + 1``."""
    return simulate(
        out,
        bucket=bucket,
        scenario="basic",
        seed=7 + part,
        vbuckets=2,
        vbucket_offset=2 * part,
        key_prefix=f"p{part}/",
        collections=1,
        docs=30,
        ops=30,
    )


def land(result: SimulationResult, landing: Path) -> None:
    landing.mkdir(parents=True, exist_ok=True)
    for f in result.files:
        shutil.copy(f, landing)


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v
        for (n, got), v in samples.items()
        if n == name and all(pair in got for pair in labels.items())
    )


def test_follow_mode_serves_step_seconds_merged_rows_and_freshness(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    bucket = f"met{uuid.uuid4().hex[:6]}"
    landing = tmp_path / "landing"
    first, second = small(tmp_path / "a", bucket, 0), small(tmp_path / "b", bucket, 1)
    land(first, landing)
    port = free_port()
    config = AppConfig(
        landing=str(landing),
        warehouse=str(spark_warehouse),
        buckets=[BucketConfig(name=bucket)],
        follow=FollowConfig(interval_s=0.5, check_every_s=0, metrics_port=port),
    )
    stop, out = threading.Event(), io.StringIO()
    scraped: list[Samples] = []
    batches: list[Batch] = []

    def after(batch: Batch, progress: BucketProgress) -> None:
        batches.append(batch)
        scraped.append(scrape(port))
        if batch.number == 1:
            land(second, landing)  # the next micro-batch's files
        else:
            stop.set()

    follower = Follower(spark, config, config.buckets, out, stop, on_batch=after)
    try:
        assert follower.run() == 0
        one, two = scraped
        assert batches[0].frames > 0 and batches[1].frames > 0
        for step in ("ingest", "apply_walk", "apply_append"):  # through the live layer
            name = "dcp_cdc_follow_step_duration_seconds_count"
            assert total(one, name, bucket=bucket, step=step) == 1, step
            assert total(two, name, bucket=bucket, step=step) == 2, step
            assert total(two, "dcp_cdc_follow_step_duration_seconds_sum", step=step) > 0
        merged = [total(s, "dcp_cdc_follow_merged_rows_total", bucket=bucket) for s in scraped]
        assert 0 < merged[0] < merged[1], merged
        assert merged[1] == sum(sum(b.merged.values()) for b in batches)
        counts = [
            total(s, "dcp_cdc_follow_freshness_seconds_count", bucket=bucket) for s in scraped
        ]
        assert merged[0] <= counts[0] < counts[1], counts  # a merged row: one change at least
        times = [b.change_times for b in batches]
        assert counts[1] == sum(t.changes for t in times if t is not None)
        mean = total(two, "dcp_cdc_follow_freshness_seconds_sum") / counts[1]
        since_start = time.time() - START.timestamp()  # the simulated changes' dates
        assert since_start - 7 * 86400 < mean <= since_start, (mean, since_start)
        assert total(two, "dcp_cdc_follow_freshness_seconds_bucket", le="+Inf") == counts[1]
        assert total(two, "dcp_cdc_follow_ingested_frames_total") == sum(b.frames for b in batches)
        assert total(two, "dcp_cdc_follow_ready", bucket=bucket) == 1
        text = out.getvalue()
        assert " s behind the bucket (p50 " in text and "over the last minute)" in text, text
    finally:
        drop_all(spark, bucket)


@pytest.mark.skipif(PUSHGATEWAY is None, reason=MISSING)
def test_ingest_and_apply_push_what_their_summaries_say(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path
) -> None:
    bucket = f"psh{uuid.uuid4().hex[:6]}"
    landing = tmp_path / "landing"
    land(small(tmp_path / "a", bucket, 0), landing)
    with gateway.pushgateway(tmp_path) as url:
        config = AppConfig(
            landing=str(landing),
            warehouse=str(spark_warehouse),
            buckets=[BucketConfig(name=bucket)],
            pushgateway=PushgatewayConfig(url=url),
        )
        try:
            (ingested,) = bronze.run(config, spark=spark)
            (applied,) = silver.run(config, spark=spark)
            got = gateway.pushed(url)
        finally:
            drop_all(spark, bucket)
    ingest = {"job": "dcp_cdc", "bucket": bucket, "verb": "ingest"}
    apply = {**ingest, "verb": "apply"}
    assert gateway.value(got, "dcp_cdc_batch_ingested_frames", **ingest) == ingested.frames > 0
    assert gateway.value(got, "dcp_cdc_batch_ingested_files", **ingest) == ingested.files
    step = gateway.value(got, "dcp_cdc_batch_step_duration_seconds", step="ingest", **ingest)
    assert step == pytest.approx(ingested.seconds)
    assert applied.tables and applied.change_times is not None
    for table, rows in applied.tables.items():
        assert gateway.value(got, "dcp_cdc_batch_merged_rows", table=table, **apply) == rows
    for name, seconds in applied.steps.items():
        pushed = gateway.value(
            got, "dcp_cdc_batch_step_duration_seconds", step=f"apply_{name}", **apply
        )
        assert pushed == pytest.approx(seconds), name
    count = gateway.value(got, "dcp_cdc_batch_freshness_seconds_count", **apply)
    assert count == applied.change_times.changes
    p50 = gateway.value(got, "dcp_cdc_batch_freshness_seconds", quantile="0.5", **apply)
    assert p50 == pytest.approx(applied.change_times.quantile(0.5))
    for group in (ingest, apply):
        ended = gateway.value(got, "dcp_cdc_batch_last_success_timestamp_seconds", **group)
        assert ended is not None and time.time() - 600 < ended <= time.time()
