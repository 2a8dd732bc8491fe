"""Batch runs' metrics, pushed to a Prometheus Pushgateway when a run ends (``[pushgateway]
url``; docs/metrics.md).

A batch run (``dcp-cdc ingest``, ``apply``, ``check``, ``run``, and so the Airflow tasks that
``spark-submit`` them) lives for minutes, anywhere: on an Airflow worker, or on a cluster node
when its driver runs in cluster mode. Prometheus cannot scrape it, and a node_exporter
textfile would have to be on whatever machine ran it; so each run pushes, once, at its end,
to the Pushgateway, which keeps the last value of each group for Prometheus to scrape.

One group per bucket and verb (grouping key ``job``, ``bucket``, ``verb``), so that a bucket's
ingest, apply and check keep their own. A run that completes replaces its group (PUT) with
its metrics and its ``..._last_success_timestamp_seconds``: nothing of an earlier run stays
(a table it merged into and this one did not). A run that fails adds
``..._last_failure_timestamp_seconds`` to its group (POST, which keeps the other names), so
the last success's figures stay beside the failure's time until the next success. A push
that fails is logged and does not fail the run: the data matter more than their metrics.

No Spark here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import push_to_gateway, pushadd_to_gateway
from prometheus_client.metrics_core import GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from dcp_cdc.agent.metrics import MetricSpec
from dcp_cdc.config import PushgatewayConfig
from pipelines.observe.freshness import ChangeTimes

log = logging.getLogger("dcp_cdc.metrics")

VERBS = ("ingest", "apply", "check")
"""The values of the ``verb`` label (grouping key)."""
FRESHNESS_QUANTILES = (0.5, 0.95, 0.99)

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("dcp_cdc_batch_duration_seconds", "gauge", (), "Seconds the last run took"),
    MetricSpec(
        "dcp_cdc_batch_step_duration_seconds",
        "gauge",
        ("step",),
        "Seconds of each step of the last run",
    ),
    MetricSpec(
        "dcp_cdc_batch_ingested_frames", "gauge", (), "Frames the last ingest wrote into bronze"
    ),
    MetricSpec("dcp_cdc_batch_ingested_files", "gauge", (), "Capture files the last ingest read"),
    MetricSpec(
        "dcp_cdc_batch_merged_rows",
        "gauge",
        ("table",),
        "Rows the last apply's MERGEs wrote into each silver table",
    ),
    MetricSpec(
        "dcp_cdc_batch_freshness_seconds",
        "summary",
        (),
        "Per change the last apply merged: its commit time minus the change's CAS time",
    ),
    MetricSpec(
        "dcp_cdc_batch_quality_passed",
        "gauge",
        (),
        "1 when the last quality check passed (no failed expectation of severity error), else 0",
    ),
    MetricSpec(
        "dcp_cdc_batch_last_success_timestamp_seconds",
        "gauge",
        (),
        "When the last run that completed ended (seconds since the epoch)",
    ),
    MetricSpec(
        "dcp_cdc_batch_last_failure_timestamp_seconds",
        "gauge",
        (),
        "When the last run that failed ended (seconds since the epoch)",
    ),
)
"""Every metric a batch run pushes; the Pushgateway adds the grouping key's labels (``job``,
``bucket``, ``verb``) to each."""
_HELP = {spec.name: spec.help for spec in METRICS}


@dataclass
class RunMetrics:
    """What one run of a verb for one bucket reports; a verb fills what it knows."""

    steps: dict[str, float] = field(default_factory=dict)
    """Step (``ingest``, ``apply_<step>``, ``check``: follow mode's names) -> seconds."""
    frames: int | None = None
    files: int | None = None
    merged: dict[str, int] | None = None
    change_times: ChangeTimes | None = None
    quality_passed: bool | None = None


class Families(Collector):
    """The families one push carries."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _gauge(name: str, value: float | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _HELP[name], value=value)


def success_families(run: RunMetrics, seconds: float, ended_at: float) -> list[Metric]:
    """The families a run that completed pushes: only those its verb knows, so that the
    other verbs' groups are not given empty ones."""
    families: list[Metric] = [
        _gauge("dcp_cdc_batch_duration_seconds", seconds),
        _gauge("dcp_cdc_batch_last_success_timestamp_seconds", ended_at),
    ]
    steps = GaugeMetricFamily(
        "dcp_cdc_batch_step_duration_seconds",
        _HELP["dcp_cdc_batch_step_duration_seconds"],
        labels=["step"],
    )
    for step, step_seconds in run.steps.items():
        steps.add_metric([step], step_seconds)
    families.append(steps)
    if run.frames is not None:
        families.append(_gauge("dcp_cdc_batch_ingested_frames", run.frames))
    if run.files is not None:
        families.append(_gauge("dcp_cdc_batch_ingested_files", run.files))
    if run.merged is not None:  # an apply: its rows, its freshness (0 changes: none merged)
        merged = GaugeMetricFamily(
            "dcp_cdc_batch_merged_rows", _HELP["dcp_cdc_batch_merged_rows"], labels=["table"]
        )
        for table, rows in sorted(run.merged.items()):
            merged.add_metric([table], rows)
        families.append(merged)
        families.append(freshness_summary(run.change_times))
    if run.quality_passed is not None:
        families.append(_gauge("dcp_cdc_batch_quality_passed", 1 if run.quality_passed else 0))
    return families


def freshness_summary(times: ChangeTimes | None) -> SummaryMetricFamily:
    """An apply's freshness as a summary: :data:`FRESHNESS_QUANTILES`, count and sum."""
    name = "dcp_cdc_batch_freshness_seconds"
    summary = SummaryMetricFamily(name, _HELP[name], labels=[])
    if times is not None:
        for q in FRESHNESS_QUANTILES:
            summary.add_sample(name, {"quantile": repr(q)}, times.quantile(q))
    summary.add_metric(
        [],
        count_value=times.changes if times else 0,
        sum_value=times.seconds_sum if times else 0.0,
    )
    return summary


def push(
    settings: PushgatewayConfig,
    verb: str,
    bucket: str,
    families: list[Metric],
    *,
    replace: bool,
) -> bool:
    """``families`` to the group (``settings.job``, ``bucket``, ``verb``): all it holds
    replaced by them (``replace``, PUT), or added, replacing the names pushed (POST); whether
    it went. A failure is logged, never raised."""
    if settings.url is None:
        return False
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(families))
    send = push_to_gateway if replace else pushadd_to_gateway
    try:
        send(
            settings.url,
            job=settings.job,
            registry=registry,
            grouping_key={"bucket": bucket, "verb": verb},
            timeout=settings.timeout_s,
        )
    except OSError as exc:  # urllib's errors, and the client's for an answer other than 2xx
        log.warning(
            "the %s run of bucket %s could not push its metrics to %s: %s",
            verb,
            bucket,
            settings.url,
            exc,
        )
        return False
    return True


@contextlib.contextmanager
def pushed(
    settings: PushgatewayConfig, verb: str, bucket: str
) -> Iterator[Callable[[RunMetrics], None]]:
    """Around one run of ``verb`` for ``bucket``: the run hands its :class:`RunMetrics` to the
    function yielded; at the end they are pushed with the run's seconds, or, if the run
    raised, its failure time (then the error goes on). Nothing when no Pushgateway is set."""
    started = time.perf_counter()
    reported: list[RunMetrics] = []
    try:
        yield reported.append
    except BaseException:
        failed: list[Metric] = [_gauge("dcp_cdc_batch_last_failure_timestamp_seconds", time.time())]
        push(settings, verb, bucket, failed, replace=False)
        raise
    run = reported[-1] if reported else RunMetrics()
    families = success_families(run, time.perf_counter() - started, time.time())
    push(settings, verb, bucket, families, replace=True)
