"""Follow mode's Prometheus metrics and readiness: what its process serves at ``/metrics`` and
``/readyz`` when ``[follow] metrics_port`` is set (docs/metrics.md).

The loop tells :class:`FollowMetrics` about each micro-batch (:meth:`FollowMetrics.batch_done`,
:meth:`FollowMetrics.batch_failed`) and each quality check; a scrape, in the server's thread,
reads what it holds under a lock. Every metric is declared once, in :data:`METRICS`, and has
the label ``bucket`` (one value per bucket followed); besides, ``step`` (``ingest``, and the
apply's steps as ``apply_<step>``: :data:`STEPS`, a fixed set) and ``table`` (the silver
tables merged into: bounded by the bucket's collections).

The process serves them with the capture agent's HTTP server
(:class:`~dcp_cdc.agent.metrics_server.MetricsServer`) in a thread of its own
(:func:`serving`); its agents, in their child processes, serve their own ports.

No Spark here: a scrape never waits for a Spark call, and the tests run without a JVM.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dcp_cdc.agent.metrics import MetricSpec, Monitoring
from dcp_cdc.agent.metrics_server import MetricsServer
from dcp_cdc.config import FollowConfig
from pipelines.app.demo import LoopThread
from pipelines.bronze.plan import HeldBack
from pipelines.follow.progress import Batch
from pipelines.silver.steps import STEPS as APPLY_STEPS

log = logging.getLogger("dcp_cdc.follow")

STEPS = ("ingest", *(f"apply_{s}" for s in APPLY_STEPS))
"""The values of the ``step`` label: a micro-batch's parts, which add up to it."""

STEP_BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0)
"""Histogram buckets of a step's seconds."""
BATCH_BOUNDS = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0)
"""Histogram buckets of a micro-batch's seconds."""
FRESHNESS_BOUNDS = (
    1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
    1800.0, 3600.0, 21600.0, 86400.0,
)  # fmt: skip
"""Histogram buckets of a change's freshness (seconds): fine around what follow mode reaches
(seconds to minutes), coarse beyond (a backlog, a backfill)."""

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("dcp_cdc_follow_batches_total", "counter", (), "Micro-batches that completed"),
    MetricSpec(
        "dcp_cdc_follow_failed_batches_total",
        "counter",
        (),
        "Micro-batches that failed (tried again at the next interval)",
    ),
    MetricSpec(
        "dcp_cdc_follow_consecutive_failed_batches",
        "gauge",
        (),
        "Micro-batches failed in a row now; 0 after one that completed",
    ),
    MetricSpec(
        "dcp_cdc_follow_ready",
        "gauge",
        (),
        "1 while the bucket's readiness check passes, 0 while its micro-batches fail in a row "
        "or a missing capture file has held later ones back too long",
    ),
    MetricSpec(
        "dcp_cdc_follow_held_back_files",
        "gauge",
        (),
        "Capture files in the landing that wait for a missing earlier file of their session, "
        "as of the last micro-batch",
    ),
    MetricSpec(
        "dcp_cdc_follow_held_back_bytes",
        "gauge",
        (),
        "Bytes of the capture files that wait for a missing earlier file of their session",
    ),
    MetricSpec(
        "dcp_cdc_follow_batch_duration_seconds",
        "histogram",
        (),
        "Seconds of a micro-batch: its ingest and its apply",
    ),
    MetricSpec(
        "dcp_cdc_follow_step_duration_seconds",
        "histogram",
        ("step",),
        "Seconds of each step of a micro-batch: ingest, and the apply's steps",
    ),
    MetricSpec(
        "dcp_cdc_follow_ingested_frames_total", "counter", (), "Frames ingested into bronze"
    ),
    MetricSpec(
        "dcp_cdc_follow_ingested_files_total", "counter", (), "Capture files ingested into bronze"
    ),
    MetricSpec(
        "dcp_cdc_follow_merged_rows_total",
        "counter",
        ("table",),
        "Rows the MERGEs wrote into each silver table (inserted or updated)",
    ),
    MetricSpec(
        "dcp_cdc_follow_freshness_seconds",
        "histogram",
        (),
        "Per change merged: silver's commit time minus the change's CAS time",
    ),
    MetricSpec(
        "dcp_cdc_follow_lag_seqnos",
        "gauge",
        (),
        "Seqnos the capture agent made durable that silver has not reached, summed over "
        "vbuckets, as of the last micro-batch",
    ),
    MetricSpec(
        "dcp_cdc_follow_last_success_timestamp_seconds",
        "gauge",
        (),
        "When the last micro-batch that completed ended (seconds since the epoch)",
    ),
    MetricSpec(
        "dcp_cdc_follow_quality_passed",
        "gauge",
        (),
        "1 when the last quality check passed (no failed expectation of severity error), else 0",
    ),
    MetricSpec(
        "dcp_cdc_follow_quality_last_check_timestamp_seconds",
        "gauge",
        (),
        "When the last quality check ended (seconds since the epoch)",
    ),
)
"""Every metric of follow mode, each with the label ``bucket`` (docs/metrics.md)."""


@dataclass
class _Histogram:
    """Cumulative counts per bound, their count and sum: what a histogram family shows."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.add([1 if value <= b else 0 for b in self.bounds], 1, value)

    def add(self, cumulative: Sequence[int], count: int, total: float) -> None:
        """Observations given as their cumulative counts per bound, count and sum."""
        self.counts = [c + n for c, n in zip(self.counts, cumulative, strict=True)]
        self.count += count
        self.total += total

    def buckets(self) -> list[tuple[str, float]]:
        bounds = [(repr(float(b)), float(c)) for b, c in zip(self.bounds, self.counts, strict=True)]
        return [*bounds, ("+Inf", float(self.count))]


@dataclass
class _Bucket:
    """What follow mode's metrics hold of one bucket."""

    batches: int = 0
    failed: int = 0
    failed_in_a_row: int = 0
    last_error: str = ""
    frames: int = 0
    files: int = 0
    merged: dict[str, int] = field(default_factory=dict)
    batch_seconds: _Histogram = field(default_factory=lambda: _Histogram(BATCH_BOUNDS))
    step_seconds: dict[str, _Histogram] = field(default_factory=dict)
    freshness: _Histogram = field(default_factory=lambda: _Histogram(FRESHNESS_BOUNDS))
    lag_seqnos: int | None = None
    last_success: float | None = None
    quality_passed: bool | None = None
    quality_at: float | None = None
    held_back: tuple[HeldBack, ...] = ()


class FollowMetrics(Collector):
    """The metrics of the buckets follow mode follows, kept between micro-batches and read at
    each scrape; and each bucket's readiness (:meth:`not_ready`)."""

    def __init__(
        self,
        buckets: Sequence[str],
        *,
        unready_after: int = 3,
        held_back_after_s: float = 3600.0,
    ) -> None:
        self.unready_after = unready_after
        self.held_back_after_s = held_back_after_s
        self._buckets = {name: _Bucket() for name in buckets}
        self._lock = threading.Lock()

    def batch_done(self, batch: Batch, *, ended_at: float | None = None) -> None:
        """A micro-batch of ``batch.bucket`` completed."""
        ended = time.time() if ended_at is None else ended_at
        with self._lock:
            b = self._buckets[batch.bucket]
            b.batches += 1
            b.failed_in_a_row = 0
            b.frames += batch.frames
            b.files += batch.files
            b.batch_seconds.observe(batch.ingest_s + batch.apply_s)
            for step, seconds in batch_steps(batch).items():
                b.step_seconds.setdefault(step, _Histogram(STEP_BOUNDS)).observe(seconds)
            for table, rows in batch.merged.items():
                b.merged[table] = b.merged.get(table, 0) + rows
            times = batch.change_times
            if times is not None:
                cumulative = times.cumulative(FRESHNESS_BOUNDS)
                b.freshness.add(cumulative, times.changes, times.seconds_sum)
            b.lag_seqnos = batch.lag[0] if batch.lag is not None else None
            b.held_back = batch.held_back
            b.last_success = ended

    def batch_failed(self, bucket: str, error: BaseException) -> int:
        """A micro-batch of ``bucket`` raised ``error``; returns how many failed in a row."""
        with self._lock:
            b = self._buckets[bucket]
            b.failed += 1
            b.failed_in_a_row += 1
            b.last_error = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            return b.failed_in_a_row

    def quality_checked(self, bucket: str, passed: bool, *, at: float | None = None) -> None:
        with self._lock:
            b = self._buckets[bucket]
            b.quality_passed = passed
            b.quality_at = time.time() if at is None else at

    def not_ready(self, bucket: str, *, now: float | None = None) -> str | None:
        """Why ``bucket`` is not ready, or None: its micro-batches failed ``unready_after``
        times in a row, or files have waited longer than ``held_back_after_s`` (from their
        arrival) for a missing earlier file of their session, as the last micro-batch found."""
        with self._lock:
            return self._why_not_ready(self._buckets[bucket], time.time() if now is None else now)

    def _why_not_ready(self, b: _Bucket, now: float) -> str | None:
        if b.failed_in_a_row >= self.unready_after:
            return f"{b.failed_in_a_row} micro-batches failed in a row, the last: {b.last_error}"
        now_ms = int(now * 1000)
        overdue = [h for h in b.held_back if h.waited_s(now_ms) > self.held_back_after_s]
        if overdue:
            return "capture files held back too long (quality.held_back_after_s): " + "; ".join(
                h.describe() for h in overdue
            )
        return None

    def collect(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily] = {}
        for spec in METRICS:
            labels = ["bucket", *spec.labels]
            kind = {
                "counter": CounterMetricFamily,
                "gauge": GaugeMetricFamily,
                "histogram": HistogramMetricFamily,
            }[spec.kind]
            families[spec.name] = kind(spec.name, spec.help, labels=labels)
        now = time.time()
        with self._lock:
            for name, b in self._buckets.items():
                _add(families, name, b, ready=self._why_not_ready(b, now) is None)
        yield from families.values()


def _add(
    families: dict[str, CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily],
    name: str,
    b: _Bucket,
    *,
    ready: bool,
) -> None:
    """One bucket's samples into ``families``."""

    def value(metric: str, amount: float, *extra: str) -> None:
        family = families[metric]
        assert not isinstance(family, HistogramMetricFamily)
        family.add_metric([name, *extra], amount)

    def histogram(metric: str, h: _Histogram, *extra: str) -> None:
        family = families[metric]
        assert isinstance(family, HistogramMetricFamily)
        family.add_metric([name, *extra], h.buckets(), h.total)

    value("dcp_cdc_follow_batches_total", b.batches)
    value("dcp_cdc_follow_failed_batches_total", b.failed)
    value("dcp_cdc_follow_consecutive_failed_batches", b.failed_in_a_row)
    value("dcp_cdc_follow_ready", 1 if ready else 0)
    value("dcp_cdc_follow_held_back_files", sum(len(h.files) for h in b.held_back))
    value("dcp_cdc_follow_held_back_bytes", sum(h.bytes for h in b.held_back))
    histogram("dcp_cdc_follow_batch_duration_seconds", b.batch_seconds)
    for step, h in sorted(b.step_seconds.items()):
        histogram("dcp_cdc_follow_step_duration_seconds", h, step)
    value("dcp_cdc_follow_ingested_frames_total", b.frames)
    value("dcp_cdc_follow_ingested_files_total", b.files)
    for table, rows in sorted(b.merged.items()):
        value("dcp_cdc_follow_merged_rows_total", rows, table)
    histogram("dcp_cdc_follow_freshness_seconds", b.freshness)
    if b.lag_seqnos is not None:
        value("dcp_cdc_follow_lag_seqnos", b.lag_seqnos)
    if b.last_success is not None:
        value("dcp_cdc_follow_last_success_timestamp_seconds", b.last_success)
    if b.quality_passed is not None and b.quality_at is not None:
        value("dcp_cdc_follow_quality_passed", 1 if b.quality_passed else 0)
        value("dcp_cdc_follow_quality_last_check_timestamp_seconds", b.quality_at)


def batch_steps(batch: Batch) -> dict[str, float]:
    """The seconds of each of ``batch``'s steps, by :data:`STEPS`' names: ``ingest``, then
    the apply's own (none when it did not apply)."""
    steps = {"ingest": batch.ingest_s}
    steps.update({f"apply_{s}": seconds for s, seconds in batch.apply_steps.items()})
    return steps


def monitoring_for(metrics: FollowMetrics, buckets: Sequence[str]) -> Monitoring:
    """What follow mode's process serves: its own CPU, memory and file descriptors, ``metrics``,
    and a readiness check ``follow:<bucket>`` per bucket."""
    monitoring = Monitoring(capture=False)
    monitoring.registry.register(metrics)
    for bucket in buckets:
        monitoring.readiness.add(f"follow:{bucket}", functools.partial(metrics.not_ready, bucket))
    return monitoring


@contextlib.contextmanager
def serving(settings: FollowConfig, monitoring: Monitoring) -> Iterator[MetricsServer | None]:
    """``monitoring`` on ``settings.metrics_host:metrics_port`` while inside (in a thread with
    an event loop of its own); nothing when no port is set. A port that cannot be bound is a
    :class:`~dcp_cdc.errors.ConfigError` naming the setting, raised here."""
    if settings.metrics_port is None:
        yield None
        return
    server = MetricsServer(
        monitoring,
        settings.metrics_host,
        settings.metrics_port,
        role="follow",
        setting="follow.metrics_port",
    )
    started = threading.Event()

    async def serve(stop: asyncio.Event) -> None:
        await server.start()
        started.set()
        try:
            await stop.wait()
        finally:
            await server.close()

    thread = LoopThread("follow mode's metrics server", serve)
    thread.start()
    while not started.wait(0.05):
        thread.check()  # the port could not be bound: its ConfigError, here
    try:
        yield server
    finally:
        thread.stop(timeout=30)
