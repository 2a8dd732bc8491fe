"""``dcp-cdc status``'s pure part: the lags of the stages (explicit positions in, written-down
numbers out), the screen and the JSON object, bronze's snapshot ends from end states, and
the verb's parser (no Spark)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from pipelines.bronze.landing import CaptureFile
from pipelines.bronze.plan import HeldBack
from pipelines.status.lag import BucketStatus, QualityResult, Stage, lag, snapshot_ends
from pipelines.status.render import age, as_json, screen

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def _ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


CLUSTER = Stage("cluster", {0: 100, 1: 50, 2: 70, 3: 10}, _ago(0.5))
CAPTURE = Stage("capture", {0: 100, 1: 40, 2: 55, 3: 10}, _ago(12))
BRONZE = Stage("bronze", {0: 90, 1: 40, 2: 55}, _ago(150))  # vbucket 3 not ingested yet
SILVER = Stage("silver", {0: 90, 1: 40, 2: 55, 3: 0}, _ago(160), "1 vbucket inside a snapshot")
QUALITY = QualityResult(
    run_id="20260102T030000Z-ab12cd34",
    checked_at=_ago(245),
    expectations=34,
    failed_errors=0,
    failed_warnings=1,
    report="/w/quality/travel_sample/summary.html",
)


def _status(*stages: Stage) -> BucketStatus:
    return BucketStatus(
        "travel-sample", stages or (CLUSTER, CAPTURE, BRONZE, SILVER), _ago(170), QUALITY
    )


def test_lag_sums_the_gaps_of_the_stage_before_its_vbuckets() -> None:
    found = lag(CLUSTER, CAPTURE)
    assert (found.stage, found.against) == ("capture", "cluster")
    assert (found.seqnos, found.vbuckets) == (25, 2)  # vb 1: 10, vb 2: 15
    assert found.worst == ((2, 15), (1, 10))


def test_a_vbucket_the_stage_lacks_is_behind_by_its_whole_position() -> None:
    found = lag(CAPTURE, BRONZE)
    assert (found.seqnos, found.vbuckets, found.worst) == (20, 2, ((0, 10), (3, 10)))


def test_a_stage_ahead_is_level_not_negative_and_only_the_vbuckets_before_count() -> None:
    ahead = Stage("bronze", {0: 120, 1: 40, 9: 500})
    found = lag(Stage("capture", {0: 100, 1: 45}), ahead)
    assert (found.seqnos, found.vbuckets, found.worst) == (5, 1, ((1, 5),))


def test_worst_is_the_furthest_first_then_by_vbucket_and_bounded() -> None:
    before = Stage("capture", {vb: 100 for vb in range(10)})
    after = Stage("bronze", {vb: 100 - (vb % 3) for vb in range(10)})  # 0, 1, 2 behind
    found = lag(before, after, worst=3)
    assert found.worst == ((2, 2), (5, 2), (8, 2))
    assert (found.seqnos, found.vbuckets) == (9, 6)


def test_lag_needs_both_stages_known() -> None:
    with pytest.raises(ValueError, match="both must be known"):
        lag(CLUSTER, Stage("capture", None, note="no checkpoint"))


def test_an_unknown_stage_is_skipped_the_next_is_measured_against_the_last_known() -> None:
    unknown = Stage("capture", None, note="no [buckets.capture] section")
    status = _status(CLUSTER, unknown, BRONZE, SILVER)
    lags = status.lags()
    assert set(lags) == {"bronze", "silver"}
    assert (lags["bronze"].against, lags["bronze"].seqnos, lags["bronze"].vbuckets) == (
        "cluster",
        45,  # vb 0: 10, vb 1: 10, vb 2: 15, vb 3: 10
        4,
    )
    assert (lags["silver"].against, lags["silver"].seqnos) == ("bronze", 0)
    end = status.end_to_end()
    assert end is not None and (end.stage, end.against, end.seqnos) == ("silver", "cluster", 45)


def test_full_pipeline_lags_and_end_to_end() -> None:
    status = _status()
    lags = status.lags()
    assert {k: (v.against, v.seqnos, v.vbuckets) for k, v in lags.items()} == {
        "capture": ("cluster", 25, 2),
        "bronze": ("capture", 20, 2),
        "silver": ("bronze", 0, 0),
    }
    end = status.end_to_end()
    assert end is not None and (end.seqnos, end.vbuckets) == (45, 4)
    assert BucketStatus("b", (Stage("silver", {0: 1}),)).end_to_end() is None


def test_quality_passes_when_no_error_expectation_failed() -> None:
    assert QUALITY.passed
    failed = QualityResult("r", NOW, 3, 1, 0, "/r")
    assert not failed.passed


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "0 s"),
        (89, "89 s"),
        (150, "2 min"),
        (5399, "90 min"),
        (7200, "2.0 h"),
        (3 * 86400, "3.0 d"),
    ],
)
def test_age(seconds: float, text: str) -> None:
    assert age(seconds) == text


def test_the_screen() -> None:
    assert screen([_status()], NOW) == (
        "dcp-cdc status at 2026-01-02 03:04:05 UTC\n"
        "\n"
        "bucket travel-sample\n"
        "  stage    vbuckets  seqnos  behind  vbuckets behind  worst vbuckets (seqnos behind)"
        "  last moved\n"
        "  cluster         4     230                                                    "
        "       asked 0 s ago\n"
        "  capture         4     205      25                2  2 (15), 1 (10)           "
        "       checkpoint 12 s ago\n"
        "  bronze          3     185      20                2  0 (10), 3 (10)           "
        "       ingest 2 min ago\n"
        "  silver          4     185       0                0                           "
        "       apply 3 min ago\n"
        "  end to end: silver is 45 seqnos behind the cluster in 4 vbuckets; silver's newest "
        "change is 3 min old\n"
        "  quality: passed 4 min ago (34 expectations, 0 failed, 1 warning), report "
        "/w/quality/travel_sample/summary.html\n"
        "  silver: 1 vbucket inside a snapshot\n"
    )


def test_more_vbuckets_behind_than_named_end_in_dots() -> None:
    before = Stage("capture", {vb: 10 for vb in range(8)})
    text = screen([BucketStatus("b", (before, Stage("bronze", {})))], NOW)
    assert (
        "  bronze          0       0      80                8  0 (10), 1 (10), 2 (10), ...\n"
        in text
    )


def test_the_screen_of_unknown_stages_says_why() -> None:
    status = BucketStatus(
        "demo",
        (
            Stage("cluster", None, note="not asked: no [buckets.capture] section names it"),
            Stage("capture", None, note="no [buckets.capture] section: no agent to read"),
            Stage("bronze", None, note="no bronze tables yet (dcp-cdc ingest)"),
            Stage("silver", None, note="no silver stream state yet (dcp-cdc apply)"),
        ),
    )
    text = screen([status], NOW)
    assert "  cluster         -       -  " in text and "  not known (below)\n" in text
    assert "  end to end: not known (fewer than two stages known)\n" in text
    assert "  quality: no check yet (dcp-cdc check)\n" in text
    assert "  bronze: no bronze tables yet (dcp-cdc ingest)\n" in text
    assert "Traceback" not in text


def test_the_json_object() -> None:
    found = as_json([_status()], NOW)
    assert json.loads(json.dumps(found)) == found  # JSON as it is
    assert found["format"] == 1 and found["generated_at"] == "2026-01-02T03:04:05.000Z"
    (bucket,) = found["buckets"]
    assert bucket["bucket"] == "travel-sample"
    cluster, capture, bronze, silver = bucket["stages"]
    assert cluster == {
        "stage": "cluster",
        "known": True,
        "vbuckets": 4,
        "seqnos": 230,
        "moved_at": "2026-01-02T03:04:04.500Z",
        "age_s": 0.5,
        "behind": None,
        "note": None,
    }
    assert capture["behind"] == {
        "against": "cluster",
        "seqnos": 25,
        "vbuckets": 2,
        "worst": [{"vbucket": 2, "seqnos": 15}, {"vbucket": 1, "seqnos": 10}],
    }
    assert bronze["behind"]["seqnos"] == 20 and bronze["age_s"] == 150.0
    assert silver["behind"] == {"against": "bronze", "seqnos": 0, "vbuckets": 0, "worst": []}
    assert silver["note"] == "1 vbucket inside a snapshot"
    assert bucket["end_to_end"] == {
        "stage": "silver",
        "against": "cluster",
        "seqnos": 45,
        "vbuckets": 4,
        "worst": [
            {"vbucket": 2, "seqnos": 15},
            {"vbucket": 0, "seqnos": 10},
            {"vbucket": 1, "seqnos": 10},
            {"vbucket": 3, "seqnos": 10},
        ],
    }
    assert (bucket["newest_change_at"], bucket["freshness_s"]) == (
        "2026-01-02T03:01:15.000Z",
        170.0,
    )
    assert bucket["quality"] == {
        "run_id": "20260102T030000Z-ab12cd34",
        "checked_at": "2026-01-02T03:00:00.000Z",
        "passed": True,
        "expectations": 34,
        "failed_errors": 0,
        "failed_warnings": 1,
        "report": "/w/quality/travel_sample/summary.html",
    }
    assert bucket["held_back"] == []


HELD = HeldBack(
    "s-42",
    (2,),
    tuple(
        CaptureFile(f"/landing/b-s42-0000{n}.dcpcap", 4000, int(_ago(age).timestamp() * 1000))
        for n, age in ((3, 7200), (4, 7000))
    ),
)


def test_files_held_back_by_a_missing_one_show_with_since_when() -> None:
    status = BucketStatus("b", (SILVER,), held_back=(HELD,))
    held = [line for line in screen([status], NOW).splitlines() if "HELD BACK" in line]
    assert held == [
        "  HELD BACK for 2.0 h: session s-42: sequence 2 missing; 2 files (8,000 bytes) held "
        "back since 2026-01-02T01:04:05Z: /landing/b-s42-00003.dcpcap, "
        "/landing/b-s42-00004.dcpcap; find the file, or declare it lost: dcp-cdc landing skip "
        "--bucket b --session s-42 --sequence 2"
    ]
    (bucket,) = as_json([status], NOW)["buckets"]
    assert bucket["held_back"] == [
        {
            "session_id": "s-42",
            "missing_sequences": [2],
            "files": ["/landing/b-s42-00003.dcpcap", "/landing/b-s42-00004.dcpcap"],
            "bytes": 8000,
            "since": "2026-01-02T01:04:05.000Z",
            "age_s": 7200.0,
        }
    ]


def test_the_json_of_an_unknown_stage() -> None:
    status = BucketStatus("b", (Stage("cluster", None, note="unreachable: x"),))
    (stage,) = as_json([status], NOW)["buckets"][0]["stages"]
    assert stage == {
        "stage": "cluster",
        "known": False,
        "vbuckets": None,
        "seqnos": None,
        "moved_at": None,
        "age_s": None,
        "behind": None,
        "note": "unreachable: x",
    }


def test_snapshot_ends_are_the_highest_over_sessions_and_skip_unknown_ends() -> None:
    first = json.dumps({"0": [1, 40, 1, False, 7], "1": [5, 9, 2, False, 8]})
    second = json.dumps({"0": [41, 60, 2, False, 7], "1": [None, None, None, False, 8]})
    third = json.dumps({"2": [None, None, None, True, 9]})  # an OSO backfill: no end
    assert snapshot_ends([first, second, third, None]) == {0: 60, 1: 9}
