"""The capture agent's Prometheus metrics and readiness checks: what one process serves at
``/metrics`` and ``/readyz`` (:class:`Monitoring`), the HTTP side being
:mod:`dcp_cdc.agent.metrics_server`.

Every metric is declared once, in :data:`METRICS` (docs/metrics.md lists them, a test keeps
the two together). Nothing is counted here: :class:`CaptureCollector` reads, at scrape time,
the :class:`~dcp_cdc.agent.progress.RunReport` of each capture run attached to it, whose
counters are plain ints the run keeps anyway; so the frames' hot path pays nothing for a
scrape, or for metrics being on. Labels: every metric has ``bucket`` and ``agent`` (one value
each per run); besides, ``node`` (a data node's ``host:port``: bounded by the cluster's
nodes), ``reason`` (the STREAM_END reasons, docs/protocol/dcp.md §6.10, and ``unknown``) and
``vbucket`` (bounded by the bucket's vbuckets, 1024 at most: two series per vbucket).

Readiness is a set of named checks (:class:`Readiness`) that any part of the process may
add: a capture run adds one that fails while one of its vbuckets is stalled.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dcp_cdc.agent.progress import RunReport
from dcp_cdc.errors import AgentUsageError

log = logging.getLogger(__name__)

Check = Callable[[], str | None]
"""A readiness check: None when ready, else why not (one line)."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its exposed name (``_total`` on counters), type, labels besides those every
    metric of its set has (a capture run's: ``bucket`` and ``agent``), and meaning (its HELP
    text). Follow mode's and the batch runs' metrics (``pipelines``) are declared with it too."""

    name: str
    kind: Literal["counter", "gauge", "histogram", "summary"]
    labels: tuple[str, ...]
    help: str


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("dcp_cdc_capture_vbuckets", "gauge", (), "vbuckets this capture run streams"),
    MetricSpec(
        "dcp_cdc_capture_received_frames_total",
        "counter",
        (),
        "Frames read from the data nodes' connections",
    ),
    MetricSpec(
        "dcp_cdc_capture_received_bytes_total",
        "counter",
        (),
        "Bytes read from the data nodes' connections",
    ),
    MetricSpec(
        "dcp_cdc_capture_flow_control_unacked_bytes",
        "gauge",
        ("node",),
        "Flow-controlled bytes a node sent that the agent has not acknowledged yet",
    ),
    MetricSpec(
        "dcp_cdc_capture_flow_control_buffer_bytes",
        "gauge",
        (),
        "The flow-control buffer each node may fill before the agent acknowledges",
    ),
    MetricSpec(
        "dcp_cdc_capture_stream_ends_total", "counter", ("reason",), "STREAM_ENDs by reason"
    ),
    MetricSpec("dcp_cdc_capture_rollbacks_total", "counter", (), "Rollbacks the nodes asked for"),
    MetricSpec(
        "dcp_cdc_capture_reconnects_total",
        "counter",
        (),
        "Connections to data nodes lost and resumed elsewhere",
    ),
    MetricSpec(
        "dcp_cdc_capture_durable_files_total",
        "counter",
        (),
        "Capture files made durable (fsync'd and renamed, or uploaded)",
    ),
    MetricSpec(
        "dcp_cdc_capture_durable_bytes_total",
        "counter",
        (),
        "Bytes of the capture files made durable",
    ),
    MetricSpec(
        "dcp_cdc_capture_checkpoint_age_seconds",
        "gauge",
        (),
        "Seconds since the checkpoint was last committed, or the run started",
    ),
    MetricSpec(
        "dcp_cdc_capture_lag_seqnos",
        "gauge",
        ("vbucket",),
        "Seqnos between the cluster's high seqno and the agent's position",
    ),
    MetricSpec(
        "dcp_cdc_capture_lag_seconds",
        "gauge",
        ("vbucket",),
        "Age of the newest change the agent has (CAS time) while the cluster has newer ones; "
        "0 when it has the high seqno",
    ),
    MetricSpec(
        "dcp_cdc_capture_stalled_vbuckets",
        "gauge",
        (),
        "vbuckets behind the cluster that have not moved for stall_after_s",
    ),
)
"""Every metric of a capture run (docs/metrics.md)."""

BASE_LABELS = ("bucket", "agent")


def _values(report: RunReport) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """Each metric's samples of one run: (labels besides bucket and agent, value)."""
    lag = report.lag
    return {
        "dcp_cdc_capture_vbuckets": [((), report.vbuckets)],
        "dcp_cdc_capture_received_frames_total": [((), report.frames_received)],
        "dcp_cdc_capture_received_bytes_total": [((), report.bytes_received)],
        "dcp_cdc_capture_flow_control_unacked_bytes": [
            ((node,), size) for node, size in sorted(report.flow_control_unacked.items())
        ],
        "dcp_cdc_capture_flow_control_buffer_bytes": [((), report.buffer_bytes)],
        "dcp_cdc_capture_stream_ends_total": [
            ((reason,), n) for reason, n in sorted(report.stream_ends.items())
        ],
        "dcp_cdc_capture_rollbacks_total": [((), report.rollbacks)],
        "dcp_cdc_capture_reconnects_total": [((), report.reconnects)],
        "dcp_cdc_capture_durable_files_total": [((), report.files_durable)],
        "dcp_cdc_capture_durable_bytes_total": [((), report.bytes_durable)],
        "dcp_cdc_capture_checkpoint_age_seconds": [((), report.checkpoint_age_s)],
        "dcp_cdc_capture_lag_seqnos": [
            ((str(lg.vbucket),), lg.seqnos) for lg in lag if lg.seqnos is not None
        ],
        "dcp_cdc_capture_lag_seconds": [
            ((str(lg.vbucket),), lg.seconds) for lg in lag if lg.seconds is not None
        ],
        "dcp_cdc_capture_stalled_vbuckets": [((), len(report.stalled))],
    }


class CaptureCollector(Collector):
    """The metrics of every capture run attached (:meth:`add`), read at each scrape: one
    family per metric of :data:`METRICS`, whatever the number of runs (a shared registry
    never names a metric twice)."""

    def __init__(self) -> None:
        self._runs: dict[str, Callable[[], RunReport | None]] = {}

    def add(self, name: str, report: Callable[[], RunReport | None]) -> None:
        if name in self._runs:
            raise AgentUsageError(f"a capture run named {name!r} is attached already")
        self._runs[name] = report

    def remove(self, name: str) -> None:
        self._runs.pop(name, None)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for spec in METRICS:
            labels = [*BASE_LABELS, *spec.labels]
            if spec.kind == "counter":
                families[spec.name] = CounterMetricFamily(spec.name, spec.help, labels=labels)
            else:
                families[spec.name] = GaugeMetricFamily(spec.name, spec.help, labels=labels)
        for report_of in list(self._runs.values()):
            report = report_of()
            if report is None:
                continue
            base = (report.bucket, report.agent_id)
            for name, samples in _values(report).items():
                for extra, value in samples:
                    families[name].add_metric([*base, *extra], value)
        yield from families.values()


class Readiness:
    """Named checks, all of which must pass for ``/readyz``: any part of the process adds its
    own (:meth:`add`), e.g. each capture run one that fails while a vbucket is stalled."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def add(self, name: str, check: Check) -> None:
        if name in self._checks:
            raise AgentUsageError(f"a readiness check named {name!r} exists already")
        self._checks[name] = check

    def remove(self, name: str) -> None:
        self._checks.pop(name, None)

    def results(self) -> list[tuple[str, str | None]]:
        """(name, None or why not) of every check, by name. A check that raises fails, its
        error as the reason (and logged with its traceback)."""
        out = []
        for name, check in sorted(self._checks.items()):
            try:
                problem = check()
            except Exception as exc:
                log.exception("readiness check %s raised", name)
                problem = f"the check raised {type(exc).__name__}: {exc}"
            out.append((name, problem))
        return out


class Monitoring:
    """What one process serves: a Prometheus registry (the process's own CPU, memory and
    file descriptors, and the capture runs attached) and the readiness checks. One per
    process; a capture run attaches itself (:meth:`attach`), so several runs share it, each
    labelled by its bucket and agent id. A process that runs no capture (follow mode's, whose
    agents serve their own) says ``capture=False`` and registers its own collectors."""

    def __init__(self, *, process_metrics: bool = True, capture: bool = True) -> None:
        self.registry = CollectorRegistry()
        if process_metrics:
            ProcessCollector(registry=self.registry)
        self.capture = CaptureCollector()
        self._serves_capture = capture  # a process that runs no capture lists none of its metrics
        if capture:
            self.registry.register(self.capture)
        self.readiness = Readiness()

    @contextlib.contextmanager
    def attach(self, name: str, report: Callable[[], RunReport | None]) -> Iterator[None]:
        """While inside: the run's metrics are scraped, and its readiness check
        ``capture:<name>`` fails before the run knows its vbuckets, or while one is stalled."""

        def check() -> str | None:
            now = report()
            return "not started: no node answered yet" if now is None else now.not_ready()

        if not self._serves_capture:
            raise AgentUsageError("this Monitoring was made without capture runs (capture=False)")
        self.capture.add(name, report)
        self.readiness.add(f"capture:{name}", check)
        try:
            yield
        finally:
            self.readiness.remove(f"capture:{name}")
            self.capture.remove(name)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The metrics as the ``Accept`` header asks (OpenMetrics, or Prometheus' text format
        0.0.4 by default) and their content type."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def ready(self) -> tuple[bool, str]:
        """Whether every check passes, and one line per check (``[+]name ok`` or
        ``[-]name failed: why``), Kubernetes' verbose ``/readyz`` form."""
        lines, ready = [], True
        for name, problem in self.readiness.results():
            if problem is None:
                lines.append(f"[+]{name} ok")
            else:
                ready = False
                lines.append(f"[-]{name} failed: {problem}")
        lines.append("readyz check passed" if ready else "readyz check failed")
        return ready, "\n".join(lines) + "\n"
