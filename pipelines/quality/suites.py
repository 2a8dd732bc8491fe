"""The five suites and their expectations, as plain data (no Spark, no Great Expectations).

Each expectation checks one column of its suite's metric frame
(:mod:`pipelines.quality.streams`, :mod:`pipelines.quality.measures`,
:func:`held_back_rows`): a problem count that
must be 0, a flag that must be true, or two columns that must agree. ``detail`` names the
column that says, per failing row, what is wrong. Severities are ``error`` (fails the run)
or ``warn`` (reported only); the configuration may override them per expectation or per
suite (``[quality] severity``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from dcp_cdc.config import QualityConfig
from dcp_cdc.errors import ConfigError

if TYPE_CHECKING:
    from pipelines.bronze.plan import HeldBack

Severity = Literal["error", "warn"]


@dataclass(frozen=True, slots=True)
class Suite:
    name: str
    entity: str  # what one row of the metric frame is
    description: str


@dataclass(frozen=True, slots=True)
class Check:
    """One expectation: a Great Expectations expectation class and its arguments."""

    suite: str
    name: str
    severity: Severity
    description: str
    expectation: str  # a class of great_expectations.expectations
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    detail: str | None = None  # the metric column that explains a failing row

    @property
    def key(self) -> str:
        return f"{self.suite}.{self.name}"

    @property
    def columns(self) -> tuple[str, ...]:
        """The metric columns the expectation reads."""
        return tuple(
            str(self.kwargs[k]) for k in ("column", "column_A", "column_B") if k in self.kwargs
        )


SUITES = (
    Suite(
        "snapshot_completeness",
        "stream",
        "Per session, vbucket and snapshot, from bronze: every stream delivered whole, "
        "ordered snapshots (docs/protocol/dcp.md §6.3, §7.1).",
    ),
    Suite(
        "stream_coverage",
        "vbucket",
        "Per vbucket: silver reached what its latest stream asked for or was told exists, "
        "nothing of a rolled-back branch remains (docs/protocol/dcp.md §7.4, §7.5), and silver stands on the "
        "cluster's current branch as the captures last recorded it.",
    ),
    Suite(
        "silver_reconciliation",
        "collection",
        "Per collection: the live documents bronze implies, computed without silver, equal "
        "the silver table; no rows of dropped collections, none past expiry.",
    ),
    Suite(
        "bronze_integrity",
        "capture file",
        "Per capture file: required columns filled, opcodes known, quarantine bounded.",
    ),
    Suite(
        "landing_continuity",
        "capture session",
        "Per capture session in the landing: no file waits long for a missing earlier file "
        "of its session (ingest takes a session's files in sequence order).",
    ),
)


def _zero(column: str) -> dict[str, Any]:
    return {"column": column, "value_set": [0]}


def _true(column: str) -> dict[str, Any]:
    return {"column": column, "value_set": [True]}


def _at_least(a: str, b: str) -> dict[str, Any]:
    return {
        "column_A": a,
        "column_B": b,
        "or_equal": True,
        "ignore_row_if": "either_value_is_missing",
    }


IN_SET = "ExpectColumnValuesToBeInSet"
A_AT_LEAST_B = "ExpectColumnPairValuesAToBeGreaterThanB"
PAIR_EQUAL = "ExpectColumnPairValuesToBeEqual"
SUM_BETWEEN = "ExpectColumnSumToBeBetween"


def default_checks(
    quarantine_threshold: int = 0, held_back_after_s: float = 3600.0
) -> tuple[Check, ...]:
    """Every expectation with its default severity."""
    sc, cov, rec, bi, land = (s.name for s in SUITES)
    return (
        *_completeness_checks(sc),
        *_coverage_checks(cov),
        *_reconciliation_checks(rec),
        *_integrity_checks(bi, quarantine_threshold),
        *_continuity_checks(land, held_back_after_s),
    )


def _completeness_checks(suite: str) -> tuple[Check, ...]:
    """The expectations of the ``snapshot_completeness`` suite (``suite``)."""
    return (
        Check(
            suite,
            "seqno_in_snapshot_range",
            "error",
            "Every item's seqno lies inside its snapshot's [start, end] (the start may be "
            "below the first item, docs/protocol/dcp.md §6.3); no item outside a snapshot.",
            IN_SET,
            _zero("out_of_range"),
            "out_of_range_detail",
        ),
        Check(
            suite,
            "snapshot_complete",
            "error",
            "Every snapshot but the last of its stream is complete: an item or a "
            "seqno-advanced reached its end, or a later marker covers its end; an OSO "
            "backfill got its end marker.",
            IN_SET,
            _zero("incomplete"),
            "incomplete_detail",
        ),
        Check(
            suite,
            "last_snapshot_complete",
            "warn",
            "The last snapshot of each vbucket's latest stream is complete; otherwise it is "
            "reported open, with its range and missing span (silver waits for the rest).",
            IN_SET,
            _true("last_snapshot_complete"),
            "open_detail",
        ),
        Check(
            suite,
            "seqnos_increase_within_stream",
            "error",
            "Seqnos strictly increase on a stream (outside OSO backfills), except after a "
            "rollback response (docs/protocol/dcp.md §7.1).",
            IN_SET,
            _zero("regressions"),
            "regression_detail",
        ),
        Check(
            suite,
            "no_duplicate_seqno",
            "error",
            "No (vbucket, seqno) data event twice in a stream, and a re-sent seqno is the "
            "same change (key, rev seqno, CAS) on the same branch.",
            IN_SET,
            _zero("duplicate_seqnos"),
            "duplicate_seqno_detail",
        ),
        Check(
            suite,
            "no_duplicate_key_in_snapshot",
            "error",
            "No key twice inside a snapshot unless its marker has the history / "
            "may-contain-duplicates flags (0x10, 0x20).",
            IN_SET,
            _zero("duplicate_keys"),
            "duplicate_key_detail",
        ),
        Check(
            suite,
            "bounded_streams_end_ok",
            "error",
            "Every stream requested with an end seqno ended with reason Ok (docs/protocol/dcp.md §6.10), or "
            "a later stream of its vbucket resumed it (a recovered fault: a cut connection, a "
            "move, a rollback).",
            IN_SET,
            _true("bounded_end_ok"),
            "end_detail",
        ),
    )


def _coverage_checks(suite: str) -> tuple[Check, ...]:
    """The expectations of the ``stream_coverage`` suite (``suite``)."""
    return (
        Check(
            suite,
            "applied_complete_snapshots",
            "error",
            "Silver's consistent seqno reached the end of the last complete snapshot of the "
            "vbucket's latest stream: nothing complete in bronze is left unapplied.",
            A_AT_LEAST_B,
            _at_least("applied_consistent", "complete_end"),
        ),
        Check(
            suite,
            "reached_requested_end",
            "error",
            "Where the latest stream was bounded, silver reached the end seqno it asked for.",
            A_AT_LEAST_B,
            _at_least("applied_consistent", "requested_end"),
        ),
        Check(
            suite,
            "reached_producer_high",
            "warn",
            "Silver reached the highest seqno the producer announced on the latest stream "
            "(markers, items, seqno-advanced); an open snapshot or a cut stream leaves it "
            "behind.",
            A_AT_LEAST_B,
            _at_least("applied_consistent", "producer_high"),
        ),
        Check(
            suite,
            "no_rolled_back_rows",
            "error",
            "No silver row (tombstones included) comes from a branch the newest failover log "
            "a stream was opened with no longer holds, or from a change a rollback removed "
            "(docs/protocol/dcp.md §7.4, §7.5).",
            IN_SET,
            _zero("rolled_back_rows"),
            "rolled_back_detail",
        ),
        Check(
            suite,
            "on_cluster_branch",
            "error",
            "Silver's position in each vbucket lies on the cluster's current branch, as the "
            "captures last recorded it (the failover logs and high seqnos each capture session "
            "ends with, and the stream requests' failover logs): the branch of silver's "
            "consistent seqno is in the newest failover log, and the seqno is not past that "
            "branch's end (where the next newer branch starts; for the newest branch, the high "
            "seqno recorded in the log's session or later). A lake that missed a rollback "
            "fails here even when every stream it got was whole. A vbucket whose captures "
            "recorded no failover log is not judged.",
            IN_SET,
            _true("on_cluster_branch"),
            "cluster_branch_detail",
        ),
    )


def _reconciliation_checks(suite: str) -> tuple[Check, ...]:
    """The expectations of the ``silver_reconciliation`` suite (``suite``)."""
    return (
        Check(
            suite,
            "live_count_matches",
            "error",
            "The number of live documents bronze implies equals the silver table's.",
            PAIR_EQUAL,
            {"column_A": "bronze_live", "column_B": "silver_live"},
        ),
        Check(
            suite,
            "checksum_matches",
            "error",
            "A checksum over (key, seqno) of the live documents bronze implies equals the "
            "silver table's.",
            PAIR_EQUAL,
            {"column_A": "bronze_checksum", "column_B": "silver_checksum"},
        ),
        Check(
            suite,
            "no_dropped_collection_rows",
            "error",
            "No silver row belongs to a collection dropped in its vbucket.",
            IN_SET,
            _zero("dropped_rows"),
            "dropped_detail",
        ),
        Check(
            suite,
            "no_expired_live_rows",
            "error",
            "No row of a user table (the live view) is past its expiry.",
            IN_SET,
            _zero("expired_live_rows"),
            "expired_detail",
        ),
    )


def _integrity_checks(suite: str, quarantine_threshold: int) -> tuple[Check, ...]:
    """The expectations of the ``bronze_integrity`` suite (``suite``)."""
    return (
        Check(
            suite,
            "required_columns_not_null",
            "error",
            "Lineage, header and the columns each op needs (seqnos, key, vb uuid, snapshot "
            "range, ...) are never null.",
            IN_SET,
            _zero("null_required"),
            "null_detail",
        ),
        Check(
            suite,
            "opcodes_known",
            "error",
            "Every frame has an opcode of the known set (docs/protocol/dcp.md §5).",
            IN_SET,
            _zero("unknown_opcodes"),
            "unknown_detail",
        ),
        Check(
            suite,
            "quarantine_within_threshold",
            "error",
            f"Malformed frames in quarantine stay within the configured threshold "
            f"({quarantine_threshold}); a session's cut tail is not counted.",
            SUM_BETWEEN,
            {"column": "malformed", "min_value": 0, "max_value": quarantine_threshold},
            "malformed_detail",
        ),
        Check(
            suite,
            "truncated_only_at_session_end",
            "error",
            "A cut tail (truncated frame) appears only at the end of its session's last "
            "file, where a dropped connection leaves it.",
            IN_SET,
            _zero("truncated_mid_session"),
            "truncated_detail",
        ),
    )


def _continuity_checks(suite: str, held_back_after_s: float) -> tuple[Check, ...]:
    """The expectations of the ``landing_continuity`` suite (``suite``)."""
    return (
        Check(
            suite,
            "no_file_held_back",
            "error",
            f"No capture file has waited longer than {held_back_after_s:g} s (quality."
            "held_back_after_s, from its arrival: its modification time) for a missing "
            "earlier file of its session; a failing session names the missing sequence and "
            "the files held back (find the file, or declare it lost: dcp-cdc landing skip).",
            IN_SET,
            _zero("held_back_overdue"),
            "held_back_detail",
        ),
    )


def checks(config: QualityConfig) -> tuple[Check, ...]:
    """The expectations with the configuration's threshold and severity overrides applied.

    An override key names an expectation (``suite.expectation``) or a whole suite; the more
    specific one wins. An unknown key is a :class:`ConfigError` listing the known names.
    """
    base = default_checks(config.quarantine_threshold, config.held_back_after_s)
    known = {c.key for c in base} | {s.name for s in SUITES}
    unknown = sorted(set(config.severity) - known)
    if unknown:
        raise ConfigError(
            f"quality.severity: unknown expectation or suite {unknown}; "
            f"expected one of {sorted(known)}"
        )
    out = []
    for check in base:
        severity = config.severity.get(check.key) or config.severity.get(check.suite)
        out.append(replace(check, severity=severity) if severity else check)
    return tuple(out)


def held_back_rows(
    sessions: Iterable[str], held: Iterable[HeldBack], *, now: dt.datetime, after_s: float
) -> list[dict[str, Any]]:
    """The ``landing_continuity`` metric frame: one row per session of ``sessions`` (those
    the ingest log knows) and of ``held`` (:func:`pipelines.bronze.plan.held_back`), with
    its held-back files, bytes and wait; ``held_back_overdue`` is 1 when they have waited
    longer than ``after_s``."""
    groups = {h.session_id: h for h in held}
    now_ms = int(now.timestamp() * 1000)
    rows = []
    for sid in sorted(set(sessions) | set(groups)):
        h = groups.get(sid)
        waited = h.waited_s(now_ms) if h else 0.0
        overdue = h is not None and waited > after_s
        rows.append(
            {
                "where": f"session {sid}",
                "session_id": sid,
                "missing_sequence": h.sequence if h else None,
                "held_back_files": len(h.files) if h else 0,
                "held_back_bytes": h.bytes if h else 0,
                "held_back_s": waited,
                "held_back_overdue": int(overdue),
                "held_back_detail": f"{h.describe()}; waited {waited:,.0f} s" if h else None,
            }
        )
    return rows
