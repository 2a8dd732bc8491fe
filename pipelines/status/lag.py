"""The stages of a bucket's pipeline and how far each is behind the one before it: the pure
part of ``dcp-cdc status`` (no Spark, no I/O, no clock: the caller passes what it read).

A stage's position is a seqno per vbucket:

- ``cluster``: the vbucket's high seqno on its active node (GET_ALL_VB_SEQNOS);
- ``capture``: the capture agent's checkpoint, the end of the last complete snapshot in a
  capture file made durable (docs/protocol/dcp.md §7.2);
- ``bronze``: the end seqno of the last snapshot marker in the capture files ingested (the
  ingest log's ``end_state``, so no scan of the events);
- ``silver``: the consistent seqno of its stream state, the end of the last snapshot it
  applied whole.

A stage is behind the one before it by, per vbucket, the seqnos between the two positions
(none when it is level or ahead); the sum over vbuckets is the lag in seqnos (seqnos count
changes: mutations, deletions, expirations, system events). A stage that is not known (no
capture section, no table yet, a cluster that cannot be reached) is skipped: the next known
stage is measured against the last known one before it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines.bronze.plan import HeldBack

STAGES = ("cluster", "capture", "bronze", "silver")
"""The stages, in pipeline order."""

WORST = 5
"""How many of the vbuckets furthest behind a lag names."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a bucket: per vbucket the seqno it reached (None: not known, and
    ``note`` says why), and when it last moved (the cluster: when it was asked; the
    capture: its checkpoint's last commit; bronze: its last ingest; silver: its last
    apply). ``note`` may also qualify a known stage (a node that did not answer, open
    snapshots)."""

    name: str
    positions: Mapping[int, int] | None
    moved_at: dt.datetime | None = None
    note: str | None = None

    @property
    def known(self) -> bool:
        return self.positions is not None

    @property
    def seqnos(self) -> int:
        """The positions summed over vbuckets (0 when not known)."""
        return sum((self.positions or {}).values())


@dataclass(frozen=True, slots=True)
class Lag:
    """How far ``stage`` is behind ``against``: seqnos summed over ``against``'s vbuckets,
    how many vbuckets are behind, and the worst of them as (vbucket, seqnos behind),
    furthest first."""

    stage: str
    against: str
    seqnos: int
    vbuckets: int
    worst: tuple[tuple[int, int], ...]


def lag(against: Stage, stage: Stage, *, worst: int = WORST) -> Lag:
    """How far ``stage`` is behind ``against`` (both known). Only ``against``'s vbuckets
    count; one that ``stage`` lacks is behind by its whole position there."""
    if against.positions is None or stage.positions is None:
        raise ValueError(f"lag of {stage.name} against {against.name}: both must be known")
    reached = stage.positions
    gaps = {vb: max(0, seqno - reached.get(vb, 0)) for vb, seqno in against.positions.items()}
    behind = sorted((vb for vb, gap in gaps.items() if gap), key=lambda vb: (-gaps[vb], vb))
    return Lag(
        stage=stage.name,
        against=against.name,
        seqnos=sum(gaps.values()),
        vbuckets=len(behind),
        worst=tuple((vb, gaps[vb]) for vb in behind[:worst]),
    )


@dataclass(frozen=True, slots=True)
class QualityResult:
    """The last quality check of a bucket (``dcp-cdc check``): its run, when, how many
    expectations it evaluated and how many failed by severity, and where its summary page
    is."""

    run_id: str
    checked_at: dt.datetime
    expectations: int
    failed_errors: int
    failed_warnings: int
    report: str

    @property
    def passed(self) -> bool:
        """No expectation of severity ``error`` failed (what ``dcp-cdc check`` exits 0 on)."""
        return self.failed_errors == 0


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """Where one bucket's pipeline stands: its stages in pipeline order, the newest change
    silver holds (by its CAS, the ``_modified_at`` of its row), and the last quality check
    (None: no check yet, or no results table)."""

    bucket: str
    stages: tuple[Stage, ...]
    newest_change: dt.datetime | None = None
    quality: QualityResult | None = None
    held_back: tuple[HeldBack, ...] = ()
    """The landing's files a missing earlier file of their session holds back, per session."""

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def lags(self) -> dict[str, Lag]:
        """Each known stage but the first, by name: its lag behind the last known stage
        before it."""
        found: dict[str, Lag] = {}
        before: Stage | None = None
        for s in self.stages:
            if not s.known:
                continue
            if before is not None:
                found[s.name] = lag(before, s)
            before = s
        return found

    def end_to_end(self) -> Lag | None:
        """The last known stage against the first (silver against the cluster when both are
        known); None with fewer than two known stages."""
        known = [s for s in self.stages if s.known]
        return lag(known[0], known[-1]) if len(known) > 1 else None


def snapshot_ends(end_states: list[str | None]) -> dict[int, int]:
    """Per vbucket, the highest snapshot end in capture sessions' end states (the ingest
    log's ``end_state``: JSON ``{vb_key: [start, end, flags, oso, vb_uuid]}``)."""
    ends: dict[int, int] = {}
    for text in end_states:
        for key, state in json.loads(text or "{}").items():
            end = state[1]
            if end is not None:
                vb = int(key)
                ends[vb] = max(ends.get(vb, 0), end)
    return ends
