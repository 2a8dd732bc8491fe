"""Quality suites without Spark: severities from the configuration, GE results read into
outcomes, the report's text and its one-page HTML summary."""

from __future__ import annotations

import datetime as dt
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.config import QualityConfig, load_config
from dcp_cdc.errors import ConfigError, DcpError
from pipelines.bronze.landing import CaptureFile
from pipelines.bronze.plan import HeldBack
from pipelines.quality.report import (
    ExpectationOutcome,
    OpenSnapshot,
    QualityReport,
    outcome_from_result,
    render_summary,
    result_rows,
)
from pipelines.quality.suites import SUITES, checks, default_checks, held_back_rows


def _check(key: str, config: QualityConfig | None = None) -> Any:
    return {c.key: c for c in checks(config or QualityConfig())}[key]


def test_every_suite_has_expectations_with_unique_names_and_known_columns() -> None:
    all_checks = default_checks()
    assert [s.name for s in SUITES] == [
        "snapshot_completeness",
        "stream_coverage",
        "silver_reconciliation",
        "bronze_integrity",
        "landing_continuity",
    ]
    assert len({c.key for c in all_checks}) == len(all_checks) == 21
    assert {c.suite for c in all_checks} == {s.name for s in SUITES}
    warn = {c.key for c in all_checks if c.severity == "warn"}
    assert warn == {
        "snapshot_completeness.last_snapshot_complete",
        "stream_coverage.reached_producer_high",
    }


def test_severity_overrides_by_expectation_win_over_suite() -> None:
    config = QualityConfig(
        severity={
            "stream_coverage": "warn",
            "stream_coverage.no_rolled_back_rows": "error",
            "snapshot_completeness.last_snapshot_complete": "error",
        },
        quarantine_threshold=3,
    )
    by_key = {c.key: c for c in checks(config)}
    assert by_key["stream_coverage.applied_complete_snapshots"].severity == "warn"
    assert by_key["stream_coverage.reached_requested_end"].severity == "warn"
    assert by_key["stream_coverage.no_rolled_back_rows"].severity == "error"
    assert by_key["snapshot_completeness.last_snapshot_complete"].severity == "error"
    assert by_key["silver_reconciliation.live_count_matches"].severity == "error"
    quarantine = by_key["bronze_integrity.quarantine_within_threshold"]
    assert quarantine.kwargs["max_value"] == 3 and "(3)" in quarantine.description


def test_unknown_severity_override_names_the_known_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown expectation or suite \['stream_coverage.nope'\]"
    ):
        checks(QualityConfig(severity={"stream_coverage.nope": "warn"}))


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("[quality]\nquarantine_threshold = -1\n", "quality.quarantine_threshold"),
        ("[quality]\nheld_back_after_s = 0\n", "quality.held_back_after_s"),
        ('[quality.severity]\n"stream_coverage" = "fatal"\n', "quality.severity.stream_coverage"),
        ('[quality.severity]\n"Bad Key" = "warn"\n', "suite.expectation"),
        ("[quality]\ncolour = 1\n", "quality.colour: Extra inputs"),
    ],
)
def test_invalid_quality_section_names_file_and_field(
    tmp_path: Path, section: str, message: str
) -> None:
    path = tmp_path / "q.toml"
    path.write_text(f'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n{section}')
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_quality_section_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "q.toml"
    path.write_text(
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'
        "[quality]\nquarantine_threshold = 2\n"
        '[quality.severity]\n"bronze_integrity.opcodes_known" = "warn"\n'
    )
    q = load_config(path).quality
    assert (q.quarantine_threshold, q.max_examples, q.results_retention_days) == (2, 20, 90)
    assert q.held_back_after_s == 3600.0
    assert q.severity == {"bronze_integrity.opcodes_known": "warn"}


# What GE 1.24 serializes for a column-map expectation run with result_format SUMMARY and
# unexpected_index_column_names=["where", <details>] (trimmed to the keys it has).
IN_SET_FAILED = {
    "success": False,
    "expectation_config": {
        "type": "expect_column_values_to_be_in_set",
        "kwargs": {"column": "incomplete", "value_set": [0]},
        "meta": {"check": "snapshot_completeness.snapshot_complete"},
    },
    "result": {
        "element_count": 12,
        "unexpected_count": 2,
        "missing_count": 0,
        "partial_unexpected_list": [1, 3],
        "partial_unexpected_index_list": [
            {
                "where": "vb 3 · session s1 · stream 1",
                "incomplete_detail": "[16, 20] missing 19..20",
                "open_detail": None,
                "incomplete": 1,
            },
            {
                "where": "vb 7 · session s1 · stream 1",
                "incomplete_detail": "[4, 9] missing 8..9",
                "open_detail": None,
                "incomplete": 3,
            },
        ],
    },
    "exception_info": {
        "raised_exception": False,
        "exception_traceback": None,
        "exception_message": None,
    },
}


def test_outcome_of_a_failed_map_expectation_keeps_where_detail_and_value() -> None:
    check = _check("snapshot_completeness.snapshot_complete")
    outcome = outcome_from_result(check, IN_SET_FAILED, entity="stream", max_examples=1)
    assert outcome.key == "snapshot_completeness.snapshot_complete"
    assert (outcome.success, outcome.severity) == (False, "error")
    assert outcome.observed == "2 of 12 streams"
    assert (outcome.unexpected_count, outcome.element_count) == (2, 12)
    assert outcome.expectation_type == "expect_column_values_to_be_in_set"
    assert outcome.examples == (
        {
            "where": "vb 3 · session s1 · stream 1",
            "incomplete_detail": "[16, 20] missing 19..20",
            "incomplete": 1,
        },
    )


def test_outcome_of_a_pair_expectation_counts_rows_with_both_values() -> None:
    result = {
        "success": True,
        "result": {
            "element_count": 32,
            "unexpected_count": 0,
            "missing_count": 30,
            "partial_unexpected_index_list": [],
        },
    }
    check = _check("stream_coverage.reached_requested_end")
    outcome = outcome_from_result(check, result, entity="vbucket", max_examples=5)
    assert (outcome.success, outcome.observed, outcome.examples) == (True, "0 of 2 vbuckets", ())
    result["result"]["missing_count"] = 32  # no bounded stream at all
    outcome = outcome_from_result(check, result, entity="vbucket", max_examples=5)
    assert outcome.observed == "no vbucket to check"


def test_outcome_of_an_aggregate_expectation_takes_examples_from_the_metric_rows() -> None:
    result = {"success": False, "result": {"observed_value": 3.0}}
    rows = [
        {"where": "a.dcpcap (session s #0)", "malformed": 0, "malformed_detail": None},
        {
            "where": "b.dcpcap (session s #1)",
            "malformed": 3,
            "malformed_detail": "offset 120: extras length does not fit the opcode",
        },
    ]
    check = _check("bronze_integrity.quarantine_within_threshold")
    outcome = outcome_from_result(check, result, entity="capture file", max_examples=5, rows=rows)
    assert (outcome.success, outcome.observed, outcome.unexpected_count) == (
        False,
        "3 (at most 0)",
        None,
    )
    assert outcome.examples == (
        {
            "where": "b.dcpcap (session s #1)",
            "malformed_detail": "offset 120: extras length does not fit the opcode",
            "malformed": 3,
        },
    )


def test_an_expectation_that_raised_inside_ge_is_an_error() -> None:
    result = {
        "success": False,
        "result": {},
        "exception_info": {"raised_exception": True, "exception_message": "no column x"},
    }
    with pytest.raises(DcpError, match=r"stream_coverage\.no_rolled_back_rows: .*no column x"):
        outcome_from_result(
            _check("stream_coverage.no_rolled_back_rows"), result, entity="vbucket", max_examples=5
        )


def _report() -> QualityReport:
    failed = ExpectationOutcome(
        "silver_reconciliation",
        "live_count_matches",
        "error",
        "counts agree",
        "expect_column_pair_values_to_be_equal",
        False,
        "1 of 4 collections",
        1,
        4,
        ({"where": "collection 0x8 inventory.airline", "bronze_live": 40, "silver_live": 39},),
    )
    warned = ExpectationOutcome(
        "snapshot_completeness",
        "last_snapshot_complete",
        "warn",
        "last one complete",
        "expect_column_values_to_be_in_set",
        False,
        "1 of 32 streams",
        1,
        32,
        (
            {
                "where": "vb 25 · session s01 · stream 1",
                "open_detail": "[80, 82] received up to 80, missing 81..82",
            },
        ),
    )
    ok = ExpectationOutcome(
        "bronze_integrity",
        "opcodes_known",
        "error",
        "known opcodes",
        "expect_column_values_to_be_in_set",
        True,
        "0 of 10 capture files",
        0,
        10,
    )
    return QualityReport(
        "travel-sample",
        "20261121T000000Z-abcd1234",
        "2026-11-21T00:00:00+00:00",
        outcomes=[failed, warned, ok],
        open_snapshots=[OpenSnapshot(25, "s01", 1, 80, 82, 80, 81, resumed=False)],
        resumed_snapshots=[OpenSnapshot(28, "s00", 1, 46, 52, 46, 47, resumed=True)],
        counts={"streams": 32, "live_documents_bronze": 1234},
        report_path="/w/quality/travel_sample_a8560dff/summary.html",
        data_docs_path="/w/quality/travel_sample_a8560dff/data_docs/index.html",
        results_table="quality.travel_sample_a8560dff_results",
    )


def test_report_names_failed_errors_warnings_and_open_snapshots() -> None:
    report = _report()
    assert report.failed_errors == ["silver_reconciliation.live_count_matches"]
    assert report.failed_warnings == ["snapshot_completeness.last_snapshot_complete"]
    assert not report.passed
    text = report.render().splitlines()
    assert text[0].startswith("quality check of bucket 'travel-sample': FAILED (1 errors), 1/3")
    assert text[1] == (
        "  ERROR silver_reconciliation.live_count_matches: 1 of 4 collections; "
        "e.g. collection 0x8 inventory.airline: bronze_live=40, silver_live=39"
    )
    assert text[2] == (
        "  WARN  snapshot_completeness.last_snapshot_complete: 1 of 32 streams; e.g. vb 25 · "
        "session s01 · stream 1: [80, 82] received up to 80, missing 81..82"
    )
    assert text[3] == (
        "  open snapshot: vb 25 [80, 82] received up to 80, missing 81..82 (session s01)"
    )
    assert text[4] == "  bronze read: since the last check"
    report.full_because = "no state of an earlier check"
    assert report.render().splitlines()[4] == (
        "  bronze read: all of bronze (no state of an earlier check)"
    )


def test_result_rows_one_per_expectation_with_examples_as_json() -> None:
    rows = result_rows(_report())
    assert [(r["suite"], r["expectation"], r["success"], r["severity"]) for r in rows] == [
        ("silver_reconciliation", "live_count_matches", False, "error"),
        ("snapshot_completeness", "last_snapshot_complete", False, "warn"),
        ("bronze_integrity", "opcodes_known", True, "error"),
    ]
    assert json.loads(rows[0]["examples"])[0]["silver_live"] == 39
    assert rows[2]["examples"] == "[]" and rows[2]["observed_value"] == "0 of 10 capture files"


class _Page(HTMLParser):
    """Text under each element id and the data-expectation attributes, by enclosing id."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str | None] = []
        self.text: dict[str, str] = {}
        self.expectations: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag not in ("meta", "br", "link"):
            self.stack.append(a.get("id"))
        if "data-expectation" in a:
            for ident in filter(None, self.stack):
                self.expectations.setdefault(ident, []).append(str(a["data-expectation"]))

    def handle_endtag(self, tag: str) -> None:
        if tag not in ("meta", "br", "link") and self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        for ident in filter(None, self.stack):
            self.text[ident] = self.text.get(ident, "") + data


def test_summary_page_shows_failing_expectations_first_suites_and_open_snapshots() -> None:
    page = _Page()
    page.feed(render_summary(_report()))
    assert page.text["status"] == "FAILED: 1 error(s)"
    assert page.expectations["failing"] == [
        "silver_reconciliation.live_count_matches",
        "snapshot_completeness.last_snapshot_complete",
    ]
    assert "bronze_live=40, silver_live=39" in page.text["failing"]
    assert page.expectations["suite-bronze_integrity"] == ["bronze_integrity.opcodes_known"]
    assert "pass" in page.text["suite-bronze_integrity"]
    assert "FAIL" in page.text["suite-silver_reconciliation"]
    open_text = page.text["open-snapshots"]
    assert "[80, 82]" in open_text and "81..82" in open_text
    assert "open: silver waits for it" in open_text and "resumed by a later stream" in open_text
    assert "1,234" in page.text["counts"]


def test_summary_page_of_a_clean_run_says_so() -> None:
    report = _report()
    report.outcomes = [o for o in report.outcomes if o.success]
    report.open_snapshots = report.resumed_snapshots = []
    page = _Page()
    page.feed(render_summary(report))
    assert page.text["status"] == "PASSED"
    assert page.text["failing"] == "None: every expectation is met."
    assert page.text["open-snapshots"].startswith("None")


def test_check_command_fails_on_bad_configuration_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.app import cli

    path = tmp_path / "q.toml"
    path.write_text(
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n'
        '[quality.severity]\n"snapshot_completeness.typo" = "warn"\n'
    )
    assert cli.main(["check", "--config", str(path)]) == 2
    assert "snapshot_completeness.typo" in capsys.readouterr().err
    assert cli.main(["check", "--config", str(path), "--bucket", "other"]) == 2
    assert not (tmp_path / "w").exists()  # no Spark session was started on the warehouse


def test_summary_page_shows_where_silver_left_the_clusters_branch() -> None:
    """A failing ``on_cluster_branch`` row (as GE returns it) reaches the page with its
    vbucket and the detail naming silver's position and the cluster's branch."""
    detail = (
        "silver at seqno 6 of vb uuid 11; the cluster's branch 11 ended at seqno 1 "
        "(newest failover log, session s2: [12@1, 11@0])"
    )
    result = {
        "success": False,
        "result": {
            "element_count": 4,
            "unexpected_count": 1,
            "missing_count": 1,  # a vbucket without a recorded failover log: not judged
            "partial_unexpected_index_list": [
                {
                    "where": "vb 3",
                    "cluster_branch_detail": detail,
                    "rolled_back_detail": None,
                    "on_cluster_branch": False,
                }
            ],
        },
    }
    check = _check("stream_coverage.on_cluster_branch")
    outcome = outcome_from_result(check, result, entity="vbucket", max_examples=5)
    assert (outcome.success, outcome.observed) == (False, "1 of 3 vbuckets")
    assert outcome.examples == (
        {"where": "vb 3", "cluster_branch_detail": detail, "on_cluster_branch": False},
    )
    report = _report()
    report.outcomes = [outcome]
    page = _Page()
    page.feed(render_summary(report))
    assert page.expectations["failing"] == ["stream_coverage.on_cluster_branch"]
    assert f"vb 3: {detail}" in page.text["failing"]
    assert f"vb 3: {detail}" in page.text["suite-stream_coverage"]
    assert report.render().splitlines()[1] == (
        f"  ERROR stream_coverage.on_cluster_branch: 1 of 3 vbuckets; e.g. vb 3: {detail}"
    )


def _group(session: str, missing: tuple[int, ...], *arrived_s: float) -> HeldBack:
    files = tuple(
        CaptureFile(f"/l/{session}-{i}.dcpcap", 1000, int(at * 1000), session_id=session)
        for i, at in enumerate(arrived_s)
    )
    return HeldBack(session, missing, files)


def test_a_session_held_back_longer_than_the_threshold_is_overdue() -> None:
    now = dt.datetime.fromtimestamp(10_000, dt.UTC)
    rows = held_back_rows(
        ["a", "b", "c"],
        [_group("b", (2,), 5_000, 9_000), _group("c", (7,), 9_500), _group("d", (0,), 9_990)],
        now=now,
        after_s=3600,
    )
    by = {r["session_id"]: r for r in rows}
    assert list(by) == ["a", "b", "c", "d"]  # the log's sessions, and those only held back
    assert by["a"] == {
        "where": "session a",
        "session_id": "a",
        "missing_sequence": None,
        "held_back_files": 0,
        "held_back_bytes": 0,
        "held_back_s": 0.0,
        "held_back_overdue": 0,
        "held_back_detail": None,
    }
    b = by["b"]
    assert (b["missing_sequence"], b["held_back_files"], b["held_back_bytes"]) == (2, 2, 2000)
    assert (b["held_back_s"], b["held_back_overdue"]) == (5000.0, 1)
    assert b["held_back_detail"] == (
        "session b: sequence 2 missing; 2 files (2,000 bytes) held back since "
        "1970-01-01T01:23:20Z: /l/b-0.dcpcap, /l/b-1.dcpcap; waited 5,000 s"
    )
    assert [by[s]["held_back_overdue"] for s in "cd"] == [0, 0]  # fresh: under the threshold
    assert [r["held_back_overdue"] for r in held_back_rows([], [], now=now, after_s=1)] == []


def test_the_held_back_expectation_reads_the_threshold_and_takes_overrides() -> None:
    check = _check("landing_continuity.no_file_held_back")
    assert (check.severity, check.columns, check.detail) == (
        "error",
        ("held_back_overdue",),
        "held_back_detail",
    )
    assert "3600 s" in check.description
    config = QualityConfig(held_back_after_s=600, severity={"landing_continuity": "warn"})
    check = _check("landing_continuity.no_file_held_back", config)
    assert check.severity == "warn" and "600 s" in check.description
