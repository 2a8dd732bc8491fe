"""How far behind the cluster a capture run is, and whether it moves: per vbucket, the
cluster's high seqno against the agent's position (:class:`LagTracker`), and what a run
reports when it is asked (:class:`RunReport`, built by :func:`run_report`).

The cluster's side comes from GET_ALL_VB_SEQNOS, which the placement asks every node for on a
schedule (``lag_poll_s``); the agent's side is each vbucket's position (the last complete
snapshot it received, docs/protocol/dcp.md §7.2) and the CAS of the change that completed it,
read as a time (docs/protocol/dcp.md §1.5). No clocks and no I/O here: the caller passes the
times, so that tests decide them. Nothing here runs per frame: the counters a report carries
are plain ints the agent keeps anyway (:class:`~dcp_cdc.agent.settings.CaptureSummary`), read
when a report is made.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from dcp_cdc.agent.node import Node
from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.settings import CaptureSettings, CaptureSummary
from dcp_cdc.config.capture import HostPort

log = logging.getLogger(__name__)

HLC_COUNTER_BITS = 0xFFFF
"""The low bits of a CAS that count, not time (docs/protocol/dcp.md §1.5)."""


def cas_seconds(cas: int) -> float:
    """A CAS read as seconds since the Unix epoch (docs/protocol/dcp.md §1.5)."""
    return (cas & ~HLC_COUNTER_BITS) / 1e9


@dataclass(frozen=True, slots=True)
class VbLag:
    """One vbucket's distance to the cluster. ``seqnos`` is None until a node reported the
    vbucket's high seqno; ``seconds`` is None while it is behind but no change of it has
    arrived in this run (nothing to date it by)."""

    vbucket: int
    seqnos: int | None
    seconds: float | None


class LagTracker:
    """Per vbucket of a run: the cluster's high seqno (the last GET_ALL_VB_SEQNOS reply that
    named it), the agent's position, the CAS of the newest change it has, and since when it
    has been behind without moving.

    A vbucket is *stalled* once it has been behind the cluster (a high seqno above its
    position) for ``stall_after_s`` without its position moving. Each :meth:`observe` that
    finds it moved, or not behind, starts that time again, so a vbucket that was quiet for a
    day and then fell behind is judged from the last observation that found it in step, not
    from its last change.
    ``now`` is a monotonic clock's seconds; ``wall`` (for the lag in seconds) is Unix time,
    the CAS's clock."""

    def __init__(self, stall_after_s: float) -> None:
        self.stall_after_s = stall_after_s
        self.high: dict[int, int] = {}
        self.seqno: dict[int, int] = {}
        self.cas: dict[int, int] = {}
        self.since: dict[int, float] = {}
        self.stalled: set[int] = set()
        """The stalled vbuckets as of the last :meth:`stall_changes`."""

    def start(self, seqnos: Mapping[int, int], now: float) -> None:
        """The run's vbuckets and their positions at the start (the checkpoint's, or 0)."""
        for vb, seqno in seqnos.items():
            self.seqno[vb] = seqno
            self.since[vb] = now

    @property
    def vbuckets(self) -> Collection[int]:
        return self.seqno.keys()

    def cluster(self, high_seqnos: Mapping[int, int]) -> None:
        """A node's high seqnos of its active vbuckets (those of this run are kept)."""
        for vb, high in high_seqnos.items():
            if vb in self.seqno:
                self.high[vb] = high

    def observe(self, seqnos: Mapping[int, int], cas: Mapping[int, int], now: float) -> None:
        """The agent's positions now (a vbucket left out keeps its last one) and the CAS of
        the newest change of each vbucket it has (0: none)."""
        for vb, before in list(self.seqno.items()):
            seqno = seqnos.get(vb, before)
            newest = cas.get(vb, 0)
            if newest > self.cas.get(vb, 0):
                self.cas[vb] = newest
            high = self.high.get(vb)
            if seqno != before or high is None or high <= seqno:
                self.since[vb] = now
            self.seqno[vb] = seqno

    def lag(self, vb: int, wall: float) -> VbLag:
        """``vb``'s distance to the cluster: 0 seqnos and 0 s when it holds the high seqno;
        else the seqnos between, and the age of the newest change it has (an upper bound of
        how late it is: the cluster's next change may have come long after that one)."""
        high = self.high.get(vb)
        if high is None:
            return VbLag(vb, None, None)
        behind = max(0, high - self.seqno.get(vb, 0))
        if not behind:
            return VbLag(vb, 0, 0.0)
        cas = self.cas.get(vb, 0)
        return VbLag(vb, behind, max(0.0, wall - cas_seconds(cas)) if cas else None)

    def is_stalled(self, vb: int, now: float) -> bool:
        high = self.high.get(vb)
        return (
            high is not None
            and high > self.seqno.get(vb, 0)
            and now - self.since.get(vb, now) >= self.stall_after_s
        )

    def stalled_now(self, now: float, among: Iterable[int]) -> list[int]:
        """The vbuckets of ``among`` stalled at ``now``, in order."""
        return sorted(vb for vb in among if vb in self.seqno and self.is_stalled(vb, now))

    def stall_changes(self, now: float, among: Iterable[int]) -> tuple[list[int], list[int]]:
        """(newly stalled, moving again) since the last call: what the agent logs once."""
        now_stalled = set(self.stalled_now(now, among))
        began, ended = now_stalled - self.stalled, self.stalled - now_stalled
        self.stalled = now_stalled
        return sorted(began), sorted(ended)

    def stuck_for(self, vb: int, now: float) -> float:
        """Seconds ``vb`` has been behind without moving (0 when it is not)."""
        return now - self.since.get(vb, now)


@dataclass(frozen=True, slots=True)
class RunReport:
    """What one capture run reports when asked (a scrape, a readiness probe): its counters
    (plain ints the run keeps), the flow-control bytes each node has out, and per vbucket
    its lag; ``stalled`` are the vbuckets still to stream that are stalled now."""

    bucket: str
    agent_id: str
    vbuckets: int
    frames_received: int
    bytes_received: int
    stream_ends: Mapping[str, int]
    rollbacks: int
    reconnects: int
    files_durable: int
    bytes_durable: int
    checkpoint_age_s: float
    """Seconds since the run last committed its checkpoint, or since it started."""
    buffer_bytes: int
    flow_control_unacked: Mapping[str, int]
    """node (``host:port``) → flow-controlled bytes received and not acknowledged yet."""
    lag: tuple[VbLag, ...]
    stalled: tuple[int, ...]
    stall_after_s: float

    def not_ready(self) -> str | None:
        """Why this run is not ready (a stalled vbucket), or None."""
        if not self.stalled:
            return None
        shown = ", ".join(str(vb) for vb in self.stalled[:16])
        more = f" and {len(self.stalled) - 16} more" if len(self.stalled) > 16 else ""
        return (
            f"bucket {self.bucket}: vbucket{'s' if len(self.stalled) > 1 else ''} {shown}{more} "
            f"behind the cluster without moving for {self.stall_after_s:g} s or more"
        )


class ObservedRun(Protocol):
    """What :func:`observe` and :func:`run_report` read of a run (the placement)."""

    settings: CaptureSettings
    summary: CaptureSummary
    nodes: dict[HostPort, Node]
    durable: dict[int, VbPosition]
    lag: LagTracker
    last_commit: float
    """When the run last committed its checkpoint, or started (the monotonic clock)."""

    @property
    def pending(self) -> Collection[int]:
        """The vbuckets still to stream."""


def observe(run: ObservedRun, now: float) -> None:
    """Give the run's tracker its positions now: the durable ones, and for each vbucket a
    live connection holds, that connection's (what it received, durable or not)."""
    seqnos = {vb: p.seqno for vb, p in run.durable.items()}
    cas: dict[int, int] = {}
    for node in run.nodes.values():
        conn = node.conn
        if conn is None or node.dead or not node.owned:
            continue
        positions = conn.positions()
        for vb in node.owned:
            if vb in positions:
                seqnos[vb] = positions[vb].seqno
            cas[vb] = conn.newest_cas(vb)
    run.lag.observe(seqnos, cas, now)


def watch_lag(run: ObservedRun, now: float) -> None:
    """Observe the run, and log each vbucket that starts or stops being stalled (behind the
    cluster without moving for ``stall_after_s``): once each way."""
    observe(run, now)
    tracker = run.lag
    began, ended = tracker.stall_changes(now, run.pending)
    for vb in began:
        log.warning(
            "capture: vbucket %d has not moved for %.0f s at seqno %d while the cluster has "
            "seqno %d",
            vb,
            tracker.stuck_for(vb, now),
            tracker.seqno[vb],
            tracker.high[vb],
            extra={"vbucket": vb},
        )
    for vb in ended:
        log.info(
            "capture: vbucket %d moves again (seqno %d)",
            vb,
            tracker.seqno[vb],
            extra={"vbucket": vb},
        )


def run_report(run: ObservedRun, now: float, wall: float) -> RunReport | None:
    """The run's report at ``now`` (monotonic) and ``wall`` (Unix time); None until it knows
    its vbuckets (before its first node answered)."""
    tracker = run.lag
    if not tracker.vbuckets:
        return None
    observe(run, now)
    summary, settings = run.summary, run.settings
    unacked = {
        node.label: node.conn.flow_control_unacked
        for node in run.nodes.values()
        if node.conn is not None and not node.dead
    }
    return RunReport(
        bucket=settings.bucket,
        agent_id=settings.agent_id,
        vbuckets=len(tracker.vbuckets),
        frames_received=summary.frames_received,
        bytes_received=summary.bytes_received,
        stream_ends=dict(summary.stream_ends),
        rollbacks=summary.rollbacks,
        reconnects=summary.reconnects,
        files_durable=len(summary.files),
        bytes_durable=summary.bytes_durable,
        checkpoint_age_s=max(0.0, now - run.last_commit),
        buffer_bytes=settings.buffer_bytes,
        flow_control_unacked=unacked,
        lag=tuple(tracker.lag(vb, wall) for vb in sorted(tracker.vbuckets)),
        stalled=tuple(tracker.stalled_now(now, run.pending)),
        stall_after_s=tracker.stall_after_s,
    )
