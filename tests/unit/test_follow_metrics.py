"""Follow mode's metrics and readiness without Spark: the collector's exposition after batches
the test writes down, readiness after failures in a row, the status line's freshness, and the
loop itself (its ingest and apply replaced by stand-ins) serving ``/metrics`` and ``/readyz``
over HTTP while micro-batches fail and recover."""

from __future__ import annotations

import io
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, BucketConfig, FollowConfig
from dcp_cdc.errors import ConfigError
from pipelines.bronze.landing import CaptureFile
from pipelines.bronze.plan import HeldBack, IngestSummary
from pipelines.follow import loop
from pipelines.follow.loop import Follower
from pipelines.follow.metrics import APPLY_STEPS, METRICS, STEPS, FollowMetrics, monitoring_for
from pipelines.follow.progress import Batch, BucketProgress, freshness_text
from pipelines.observe.freshness import PROBABILITIES, ChangeTimes
from pipelines.silver.job import ApplySummary
from pipelines.silver.memory import ApplyMemory
from pipelines.silver.steps import STEPS as SILVER_STEPS
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TABLE = "silver.b__inventory__hotel_all"


def even(changes: int, first: float, last: float, committed_at: float) -> ChangeTimes:
    """``changes`` CAS times spread evenly from ``first`` to ``last``."""
    quantiles = tuple(first + (last - first) * p for p in PROBABILITIES)
    return ChangeTimes(changes, quantiles, changes * (first + last) / 2, committed_at)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


def batch(number: int, times: ChangeTimes | None = None, rows: int = 40) -> Batch:
    return Batch(
        "b",
        number,
        frames=500,
        ingest_s=1.5,
        apply_s=3.0,
        files=2,
        apply_steps={"walk": 1.0, "merge": 2.0},
        merged={TABLE: rows},
        change_times=times,
        lag=(12, 3),
    )


def test_the_exposition_after_two_batches_and_a_check() -> None:
    metrics = FollowMetrics(["b"])
    monitoring = monitoring_for(metrics, ["b"])
    text = monitoring.exposition()[0].decode()
    assert value(text, "dcp_cdc_follow_batches_total", bucket="b") == 0
    assert "dcp_cdc_capture_" not in text  # the agents serve theirs, in their processes
    # freshness even over [100, 200] s: 20 changes within 120 s, 80 within 180 s
    metrics.batch_done(batch(1, even(100, 1000.0, 1100.0, committed_at=1200.0)), ended_at=1201.0)
    metrics.batch_done(batch(2, rows=2), ended_at=1205.0)
    metrics.quality_checked("b", False, at=1300.0)
    text = monitoring.exposition()[0].decode()
    expected = {
        ("dcp_cdc_follow_batches_total", ()): 2,
        ("dcp_cdc_follow_failed_batches_total", ()): 0,
        ("dcp_cdc_follow_ready", ()): 1,
        ("dcp_cdc_follow_ingested_frames_total", ()): 1000,
        ("dcp_cdc_follow_ingested_files_total", ()): 4,
        ("dcp_cdc_follow_merged_rows_total", (("table", TABLE),)): 42,
        ("dcp_cdc_follow_batch_duration_seconds_count", ()): 2,
        ("dcp_cdc_follow_batch_duration_seconds_sum", ()): 9.0,
        ("dcp_cdc_follow_batch_duration_seconds_bucket", (("le", "2.5"),)): 0,
        ("dcp_cdc_follow_batch_duration_seconds_bucket", (("le", "5.0"),)): 2,
        ("dcp_cdc_follow_step_duration_seconds_sum", (("step", "ingest"),)): 3.0,
        ("dcp_cdc_follow_step_duration_seconds_sum", (("step", "apply_merge"),)): 4.0,
        ("dcp_cdc_follow_step_duration_seconds_count", (("step", "apply_walk"),)): 2,
        ("dcp_cdc_follow_freshness_seconds_count", ()): 100,
        ("dcp_cdc_follow_freshness_seconds_sum", ()): 15000.0,
        ("dcp_cdc_follow_freshness_seconds_bucket", (("le", "90.0"),)): 0,
        ("dcp_cdc_follow_freshness_seconds_bucket", (("le", "120.0"),)): 20,
        ("dcp_cdc_follow_freshness_seconds_bucket", (("le", "180.0"),)): 80,
        ("dcp_cdc_follow_freshness_seconds_bucket", (("le", "300.0"),)): 100,
        ("dcp_cdc_follow_freshness_seconds_bucket", (("le", "+Inf"),)): 100,
        ("dcp_cdc_follow_lag_seqnos", ()): 12,
        ("dcp_cdc_follow_last_success_timestamp_seconds", ()): 1205.0,
        ("dcp_cdc_follow_quality_passed", ()): 0,
        ("dcp_cdc_follow_quality_last_check_timestamp_seconds", ()): 1300.0,
    }
    got = samples(text)
    for (name, labels), want in expected.items():
        key = (name, frozenset((("bucket", "b"), *labels)))
        assert got.get(key) == pytest.approx(want), (name, labels, got.get(key))
    steps = {dict(labels).get("step") for name, labels in got if "step_duration" in name}
    assert steps == {"ingest", "apply_walk", "apply_merge"}


def test_a_bucket_is_unready_after_failures_in_a_row_until_a_batch_completes() -> None:
    metrics = FollowMetrics(["b", "c"], unready_after=2)
    monitoring = monitoring_for(metrics, ["b", "c"])
    assert metrics.batch_failed("b", RuntimeError("first\nsecond line")) == 1
    assert monitoring.ready()[0]
    assert metrics.batch_failed("b", ValueError("the landing is gone")) == 2
    ready, text = monitoring.ready()
    assert not ready
    assert text.splitlines() == [
        "[-]follow:b failed: 2 micro-batches failed in a row, the last: ValueError: the "
        "landing is gone",
        "[+]follow:c ok",
        "readyz check failed",
    ]
    exposition = monitoring.exposition()[0].decode()
    assert value(exposition, "dcp_cdc_follow_consecutive_failed_batches", bucket="b") == 2
    assert value(exposition, "dcp_cdc_follow_ready", bucket="b") == 0
    assert value(exposition, "dcp_cdc_follow_ready", bucket="c") == 1
    assert value(exposition, "dcp_cdc_follow_failed_batches_total", bucket="b") == 2
    metrics.batch_done(batch(1))
    assert monitoring.ready()[0]
    exposition = monitoring.exposition()[0].decode()
    assert value(exposition, "dcp_cdc_follow_consecutive_failed_batches", bucket="b") == 0
    assert value(exposition, "dcp_cdc_follow_failed_batches_total", bucket="b") == 2


def test_the_status_lines_freshness() -> None:
    last = even(100, 1000.0, 1100.0, committed_at=1200.0)  # median 150 s, p95 195 s
    assert freshness_text(last, [last]) == (
        "silver 150.0 s behind the bucket (p50 150.0 s, p95 195.0 s over the last minute)"
    )
    assert freshness_text(None, [last]) == (
        "no change in this batch (p50 150.0 s, p95 195.0 s over the last minute)"
    )
    assert freshness_text(None, []) == "no change merged in the last minute"
    progress = BucketProgress(BucketConfig(name="b"), None)
    progress.freshness.extend([even(1, 0.0, 0.0, 1000.0), last])
    assert progress.recent_freshness(now=1230.0) == [last], "a minute back, no more"


def test_the_step_label_is_the_apply_steps_and_ingest() -> None:
    assert SILVER_STEPS == APPLY_STEPS
    source = (ROOT / "pipelines" / "silver" / "job.py").read_text(encoding="utf-8")
    recorded = set(re.findall(r'summary\.step\("([a-z_]+)"', source))
    assert recorded == set(SILVER_STEPS), "every step the apply records is declared"
    assert STEPS[0] == "ingest" and len(STEPS) == len(set(STEPS)) == 12


def test_files_held_back_too_long_make_a_bucket_unready_and_are_counted() -> None:
    metrics = FollowMetrics(["b"], held_back_after_s=3600)
    monitoring = monitoring_for(metrics, ["b"])
    files = tuple(
        CaptureFile(f"/l/b-{n}.dcpcap", 1500, 1_000_000, session_id="s1", file_sequence=n)
        for n in (3, 4)
    )
    held = HeldBack("s1", (2,), files)
    metrics.batch_done(replace(batch(1), held_back=(held,)), ended_at=1_100.0)
    # arrived at 1000 s: ready until it has waited an hour
    assert metrics.not_ready("b", now=1_000.0 + 3600) is None
    why = metrics.not_ready("b", now=1_000.0 + 3601)
    assert why == (
        "capture files held back too long (quality.held_back_after_s): session s1: sequence "
        "2 missing; 2 files (3,000 bytes) held back since 1970-01-01T00:16:40Z: /l/b-3.dcpcap, "
        "/l/b-4.dcpcap"
    )
    ready, text = monitoring.ready()  # now: long after 1970
    assert not ready and text.splitlines()[0] == f"[-]follow:b failed: {why}"
    exposition = monitoring.exposition()[0].decode()
    assert value(exposition, "dcp_cdc_follow_held_back_files", bucket="b") == 2
    assert value(exposition, "dcp_cdc_follow_held_back_bytes", bucket="b") == 3000
    assert value(exposition, "dcp_cdc_follow_ready", bucket="b") == 0
    metrics.batch_done(batch(2))  # the file came, or was declared lost
    assert monitoring.ready()[0]
    exposition = monitoring.exposition()[0].decode()
    assert value(exposition, "dcp_cdc_follow_held_back_files", bucket="b") == 0
    assert value(exposition, "dcp_cdc_follow_ready", bucket="b") == 1


def test_every_follow_metric_is_in_the_docs() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    missing = [spec.name for spec in METRICS if f"`{spec.name}`" not in page]
    assert not missing, f"docs/metrics.md does not list {missing}"


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_loop_serves_its_metrics_and_fails_readyz_while_batches_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 completes; the next two attempts fail (``unready_after_failed_batches = 2``):
    the third attempt, which completes, scrapes ``/readyz`` first and finds it failing; after
    it ``/readyz`` passes and the counters moved. The endpoint is gone once the loop ended."""
    port = free_port()
    config = AppConfig(
        landing=str(tmp_path / "landing"),
        warehouse=str(tmp_path / "warehouse"),
        buckets=[BucketConfig(name="b")],
        follow=FollowConfig(
            interval_s=0.01,
            check_every_s=0,
            metrics_port=port,
            unready_after_failed_batches=2,
            stop_after_failed_batches=3,
        ),
    )
    calls: list[str] = []
    seen: dict[str, Any] = {}

    def ingest(spark: object, config: AppConfig, bucket: BucketConfig, **kw: Any) -> Any:
        calls.append("ingest")
        if len(calls) in (2, 3):
            raise RuntimeError(f"attempt {len(calls)} fails")
        if len(calls) == 4:
            seen["readyz"] = get(port, "/readyz")
            seen["metrics"] = get(port, "/metrics")[1]
        return IngestSummary("b", run_version=len(calls), files=1, frames=100)

    def apply(spark: object, config: AppConfig, bucket: BucketConfig, **kw: Any) -> ApplySummary:
        assert isinstance(kw.pop("memory"), ApplyMemory)  # one per bucket, kept
        assert not kw.pop("compaction").in_run and not kw  # in follow mode's own thread
        summary = ApplySummary("b", positions={0: 10 * len(calls)}, tables={TABLE: 7})
        summary.steps = {"walk": 0.2, "merge": 0.3}
        now = time.time()  # within the status line's last minute
        summary.change_times = even(50, now - 20, now - 10, committed_at=now)
        return summary

    monkeypatch.setattr(loop, "ingest_bucket", ingest)
    monkeypatch.setattr(loop, "apply_bucket", apply)
    monkeypatch.setattr(loop, "applied_positions", lambda spark, bucket: {})
    monkeypatch.setattr(loop.live, "compaction_due", lambda spark, bucket, settings: False)
    stop, out = threading.Event(), io.StringIO()
    scraped: list[str] = []

    def after(batch: Batch, progress: BucketProgress) -> None:
        scraped.append(get(port, "/metrics")[1])
        if batch.number == 2:
            stop.set()

    follower = Follower(cast(SparkSession, None), config, config.buckets, out, stop)
    follower.on_batch = after
    assert follower.run() == 0
    status, text = seen["readyz"]
    assert status == 503, text
    assert (
        "[-]follow:b failed: 2 micro-batches failed in a row, the last: RuntimeError: "
        "attempt 3 fails" in text
    )
    assert value(seen["metrics"], "dcp_cdc_follow_failed_batches_total", bucket="b") == 2
    first, second = scraped
    for name, before, after_two in [
        ("dcp_cdc_follow_batches_total", 1, 2),
        ("dcp_cdc_follow_ingested_frames_total", 100, 200),
        ("dcp_cdc_follow_step_duration_seconds_count", 1, 2),
        ("dcp_cdc_follow_merged_rows_total", 7, 14),
        ("dcp_cdc_follow_freshness_seconds_count", 50, 100),
    ]:
        labels = {"step": "apply_merge"} if "step" in name else {}
        labels |= {"table": TABLE} if "merged" in name else {}
        assert value(first, name, bucket="b", **labels) == before, name
        assert value(second, name, bucket="b", **labels) == after_two, name
    assert value(second, "dcp_cdc_follow_freshness_seconds_sum", bucket="b") == pytest.approx(
        100 * 15.0
    )
    lines = out.getvalue()
    assert "batch 2 FAILED (1 in a row; not ready from 2, stopping at 3): RuntimeError" in lines
    assert "silver 15.0 s behind the bucket (p50 " in lines
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


@pytest.mark.parametrize(
    ("error", "attempts"),
    [
        (RuntimeError("the executor was lost"), 2),  # transient: tried again, up to the limit
        (ConfigError("landing /nowhere does not exist"), 1),  # no retry cures it: at once
    ],
)
def test_the_loop_gives_up_after_stop_after_failed_batches_or_at_a_fatal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, attempts: int
) -> None:
    config = AppConfig(
        landing=str(tmp_path / "landing"),
        warehouse=str(tmp_path / "warehouse"),
        buckets=[BucketConfig(name="b")],
        follow=FollowConfig(
            interval_s=0.01, check_every_s=0, unready_after_failed_batches=1,
            stop_after_failed_batches=2,
        ),
    )  # fmt: skip

    def ingest(*args: object, **kw: object) -> IngestSummary:
        raise error

    monkeypatch.setattr(loop, "ingest_bucket", ingest)
    monkeypatch.setattr(loop, "applied_positions", lambda spark, bucket: {})
    out = io.StringIO()
    follower = Follower(cast(SparkSession, None), config, config.buckets, out, threading.Event())
    with pytest.raises(type(error), match=str(error)):
        follower.run()
    assert out.getvalue().count("FAILED") == attempts
    assert follower.metrics is not None and follower.metrics.not_ready("b")


def test_a_taken_port_is_a_config_error_naming_the_setting(tmp_path: Path) -> None:
    port = free_port()
    config = AppConfig(
        landing=str(tmp_path),
        warehouse=str(tmp_path / "w"),
        buckets=[BucketConfig(name="b")],
        follow=FollowConfig(metrics_port=port),
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        follower = Follower(
            cast(SparkSession, None), config, config.buckets, io.StringIO(), threading.Event()
        )
        with pytest.raises(
            ConfigError, match=f"follow.metrics_port: cannot listen on 127.0.0.1:{port}"
        ):
            follower.run()
