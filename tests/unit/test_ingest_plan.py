"""The bronze ingest's plan and resume decisions, without Spark: which run is open, which
planned files are written, and a landing location that is not there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.errors import ConfigError
from pipelines.bronze.landing import CaptureFile, Problem, check_landing
from pipelines.bronze.plan import (
    LOST,
    IngestSummary,
    LogState,
    held_back,
    lost_row,
    plan_files,
    settle,
    stream_states,
    task_groups,
)


def _row(
    status: str, file: str, version: int, run_id: str | None = "r1", **more: Any
) -> dict[str, Any]:
    return {
        "status": status,
        "file": file,
        "run_version": version,
        "ingest_run_id": run_id,
        "size": 10,
        "modified_ms": 1,
        "session_id": "s",
        "file_sequence": 0,
        **more,
    }


def test_a_run_is_open_until_it_has_closing_rows_of_its_own() -> None:
    rows = [_row("planned", "a", 1), _row("ingested", "a", 1), _row("planned", "b", 2, "r2")]
    state = LogState.of(rows)
    assert [r["file"] for r in state.open_plan] == ["b"] and state.last_version == 2
    assert set(state.ingested) == {"a"}
    # a run whose files were all left out is closed by its changed / missing rows
    for status in ("changed", "missing"):
        assert LogState.of([*rows, _row(status, "b", 2, "r2")]).open_plan == []
    # a file found changed after ingest (logged under the last version, without a run id)
    # closes nothing
    assert LogState.of([*rows, _row("changed", "a", 2, None)]).open_plan == state.open_plan


def _file(path: str, session: str, sequence: int) -> CaptureFile:
    return CaptureFile(path, 10, 1, session_id=session, file_sequence=sequence)


def test_a_planned_file_left_out_holds_back_the_rest_of_its_session_only() -> None:
    plan = [_file("a0", "a", 0), _file("a1", "a", 1), _file("a2", "a", 2), _file("b5", "b", 5)]
    gone = Problem("missing", "vanished")
    settled = settle(plan, {"a1": gone})
    assert [f.path for f in settled.kept] == ["a0", "b5"]
    assert settled.left_out == [(plan[1], gone)]
    assert settled.waiting == ["a2 (session a sequence 2, needs sequence 1, left out, first)"]
    assert settle(plan, {}).kept == plan


def test_the_summary_reports_what_was_skipped_and_left_out() -> None:
    summary = IngestSummary(
        "b", skipped=["x.dcpcap: a folder, not a file"], left_out=["y.dcpcap: vanished"]
    )
    assert summary.render().splitlines() == [
        "bronze ingest of bucket 'b': nothing new to ingest",
        "  LEFT OUT (changed or gone since planned, not ingested): y.dcpcap: vanished",
        "  skipped (not a file to read): x.dcpcap: a folder, not a file",
    ]


def test_a_landing_location_that_is_not_there_fails_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "here").mkdir()
    config = AppConfig(
        landing=str(tmp_path / "nowhere"),
        warehouse=str(tmp_path / "wh"),
        buckets=[
            BucketConfig(name="own", landing=str(tmp_path / "here")),
            BucketConfig(name="shared"),
            BucketConfig(name="typo", landing=str(tmp_path / "her")),
        ],
    )
    check_landing(config, config.bucket("own"))
    with pytest.raises(ConfigError) as shared:
        check_landing(config, config.bucket("shared"), "conf/x.toml")
    assert str(shared.value) == (
        f"conf/x.toml: landing: the landing location {str(tmp_path / 'nowhere')!r} of bucket "
        "'shared' does not exist"
    )
    with pytest.raises(ConfigError, match=r"^buckets\[2\]\.landing: .* 'typo' does not exist$"):
        check_landing(config, config.bucket("typo"))


# --- decode tasks --------------------------------------------------------------------------


def test_many_small_files_make_one_task_per_core_not_one_each() -> None:
    groups = task_groups([1_000] * 600, target_bytes=64 << 20, parallelism=2)
    assert len(groups) == 2
    assert sorted(i for g in groups for i in g) == list(range(600))
    assert {len(g) for g in groups} == {300}


def test_big_files_get_tasks_by_bytes_and_the_biggest_spread_first() -> None:
    mib = 1 << 20
    sizes = [64 * mib, 10 * mib, 60 * mib, 5 * mib, 50 * mib, 3 * mib]
    groups = task_groups(sizes, target_bytes=64 * mib, parallelism=2)
    # 192 MiB in 64 MiB tasks: 3; the three big files apart, the small ones on the lightest
    assert groups == [[0], [2, 3], [1, 4, 5]]


def test_fewer_files_than_cores_make_a_task_each() -> None:
    assert task_groups([5, 7], target_bytes=100, parallelism=4) == [[1], [0]]
    assert task_groups([], target_bytes=100, parallelism=4) == []


# --- files a missing one holds back ---------------------------------------------------------


def _landed(path: str, session: str, sequence: int, size: int = 100, at_ms: int = 0) -> CaptureFile:
    return CaptureFile(path, size, at_ms, bucket="bk", session_id=session, file_sequence=sequence)


def _ingested(session: str, sequence: int) -> dict[str, Any]:
    return _row("ingested", f"{session}{sequence}", 1, file_sequence=sequence, session_id=session)


def test_held_back_names_the_missing_sequences_and_the_files_in_order() -> None:
    state = LogState.of([_ingested("a", 0), _ingested("a", 1), _ingested("c", 0)])
    landed = [
        _landed("a6", "a", 6, at_ms=5_000),
        _landed("a3", "a", 3, at_ms=2_000),
        _landed("a4", "a", 4, at_ms=3_000),
        _landed("b0", "b", 0),
        _landed("b1", "b", 1),  # a whole session: nothing held back
        _landed("c1", "c", 1),  # the next of c: nothing held back
        _landed("d2", "d", 2, size=7),  # d's first two never landed
    ]
    [a, d] = held_back(landed, state)
    assert (a.session_id, a.missing, a.sequence) == ("a", (2, 5), 2)
    assert [f.path for f in a.files] == ["a3", "a4", "a6"]
    assert (a.bytes, a.since_ms, a.waited_s(12_000)) == (300, 2_000, 10.0)
    assert a.waited_s(0) == 0  # a clock behind the file's time waits nothing, not less
    assert a.describe() == (
        "session a: sequences 2, 5 missing; 3 files (300 bytes) held back since "
        "1970-01-01T00:00:02Z: a3, a4, a6"
    )
    assert (d.missing, [f.path for f in d.files], d.bytes) == ((0, 1), ["d2"], 7)


def test_a_sequence_declared_lost_lets_its_session_go_on() -> None:
    lost = lost_row("a", 2, "gone")
    assert lost["status"] == LOST and (lost["session_id"], lost["file_sequence"]) == ("a", 2)
    rows = [_ingested("a", 0), _ingested("a", 1), {**_row("x", "", 1), **lost}]
    state = LogState.of(rows)
    assert state.lost == {("a", 2)} and state.next_sequences() == {"a": 3}
    assert set(state.ingested) == {"a0", "a1"} and state.open_plan == []
    landed = [_landed("a3", "a", 3), _landed("a4", "a", 4), _landed("a6", "a", 6)]
    [left] = held_back(landed, state)
    assert (left.missing, [f.path for f in left.files]) == ((5,), ["a6"])
    # a session whose very first file is lost, and two lost in a row
    two = LogState.of([{**_row("x", "", 1), **lost_row("e", n, "gone")} for n in (0, 1)])
    assert two.next_sequences() == {"e": 2} and held_back([_landed("e2", "e", 2)], two) == []


def test_the_plan_reports_held_back_files_and_goes_on_past_lost_ones() -> None:
    rows = [_ingested("a", 0), _ingested("a", 1)]
    landed = [_landed("a3", "a", 3), _landed("a4", "a", 4)]

    def plan(state: LogState) -> tuple[list[str], IngestSummary]:
        summary = IngestSummary("bk")
        chosen, _ = plan_files(landed, state, "bk", 0, 1 << 30, summary, lambda f: f)
        return [f.path for f in chosen], summary

    chosen, summary = plan(LogState.of(rows))
    assert chosen == [] and [h.missing for h in summary.held_back] == [(2,)]
    assert len(summary.waiting) == 2
    held = [line for line in summary.render().splitlines() if "HELD BACK" in line]
    assert held == [
        "  HELD BACK: session a: sequence 2 missing; 2 files (200 bytes) held back since "
        "1970-01-01T00:00:00Z: a3, a4 (find the file, or declare it lost: dcp-cdc landing "
        "skip --bucket bk --session a --sequence 2)"
    ]
    chosen, summary = plan(LogState.of([*rows, {**_row("x", "", 1), **lost_row("a", 2, "")}]))
    assert chosen == ["a3", "a4"] and not summary.held_back and not summary.waiting
    # the lost file found again after the skip: not ingested, and said so
    landed.append(_landed("a2-found", "a", 2))
    chosen, summary = plan(LogState.of([*rows, {**_row("x", "", 1), **lost_row("a", 2, "")}]))
    assert chosen == ["a3", "a4"] and not summary.waiting
    assert summary.skipped == [
        "a2-found: session a sequence 2 is declared lost (dcp-cdc landing skip); its session "
        "went on without it"
    ]


def test_the_file_after_a_lost_one_keeps_its_streams_but_no_snapshot() -> None:
    end = '{"0":[10,20,1,false,777],"1":[5,9,1,false,888]}'
    rows = [{**_ingested("a", 0), "end_state": end}, {**_row("x", "", 1), **lost_row("a", 1, "")}]
    a2 = _landed("a2", "a", 2)
    carries, ends = stream_states(LogState.of(rows), [a2], {})
    assert json.loads(carries["a2"]) == {
        "0": [None, None, None, False, 777],
        "1": [None, None, None, False, 888],
    }
    assert ends["a2"] == carries["a2"]  # no scan: the file changes nothing
    # a session's first file, and the file after an ingested one, as before
    carries, _ = stream_states(
        LogState.of(rows[:1]), [_landed("a1", "a", 1), _landed("b0", "b", 0)], {}
    )
    assert json.loads(carries["a1"]) == json.loads(end) and carries["b0"] == "{}"
