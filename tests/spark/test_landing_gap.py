"""A capture file missing in the middle of a session: ingest holds the session's later files
back, and that no longer stays silent. The ``landing_continuity`` suite fails once they have
waited longer than ``[quality] held_back_after_s`` (naming the session, the missing sequence
and the files), ``dcp-cdc status`` lists them; ``dcp-cdc landing skip`` declares the file lost,
ingest goes on with the later files, silver advances, and the quality suites report the gap
the lost file left in the streams instead of passing."""

from __future__ import annotations

import io
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig, BucketConfig
from pipelines.app import cli
from pipelines.bronze import store
from pipelines.bronze.job import ingest_bucket
from pipelines.errors import LandingSkipError
from pipelines.quality.job import check_bucket, landing_frame
from pipelines.silver.job import apply_bucket
from pipelines.status.read import bucket_status
from pipelines.tables import BucketTables
from tests.support.silver_runs import drop_all, landing_with_gap, one_bucket

HELD_BACK = "landing_continuity.no_file_held_back"


@dataclass
class Gap:
    config: AppConfig
    config_file: Path
    later: list[Path]  # the files after the missing one, in sequence order

    @property
    def bucket(self) -> BucketConfig:
        return self.config.buckets[0]


@pytest.fixture
def gap(spark: SparkSession, spark_warehouse: Path, tmp_path: Path) -> Iterator[Gap]:
    """A simulated session's files in a landing, but its third (sequence 2)."""
    name = f"g{uuid.uuid4().hex[:8]}"
    landing, later = landing_with_gap(tmp_path, name, seed=7, at_least=8)
    config_file = tmp_path / "gap.toml"
    config_file.write_text(
        f'landing = "{landing}"\nwarehouse = "{spark_warehouse}"\n'
        "[spark]\nshuffle_partitions = 2\n"
        f'[[buckets]]\nname = "{name}"\n'
    )
    config = one_bucket(landing, spark_warehouse, name, spark={"shuffle_partitions": 2})
    yield Gap(config, config_file, later)
    drop_all(spark, name, ("bronze", "silver", "quality"))


def _age(files: list[Path], seconds: float) -> None:
    then = time.time() - seconds
    for f in files:
        os.utime(f, (then, then))


def _skip(gap: Gap, session_id: str, sequence: int) -> str:
    out = io.StringIO()
    argv = ["landing", "skip", "--config", str(gap.config_file), "--bucket", gap.bucket.name]
    argv += ["--session", session_id, "--sequence", str(sequence)]
    assert cli.main(argv, out) == 0, out.getvalue()
    return out.getvalue()


def test_a_missing_file_holds_its_session_back_overdue_after_the_threshold_until_skipped(
    spark: SparkSession, gap: Gap
) -> None:
    config, b = gap.config, gap.bucket
    first = ingest_bucket(spark, config, b)
    assert first.files == 2
    [group] = first.held_back
    assert group.missing == (2,) and [Path(f.path) for f in group.files] == gap.later
    assert "HELD BACK: session " in first.render() and "sequence 2 missing" in first.render()

    # fresh files: under the threshold the suite's row holds; status lists them all the same
    [fresh] = landing_frame(spark, config, b).rows
    assert (fresh["held_back_overdue"], fresh["missing_sequence"]) == (0, 2)
    assert fresh["held_back_files"] == len(gap.later)
    status = bucket_status(config, b, cluster=False)
    assert [(h.session_id, h.missing) for h in status.held_back] == [(group.session_id, (2,))]

    # two hours later: overdue, naming the session, the sequence and the files
    _age(gap.later, 2 * 3600)
    [late] = landing_frame(spark, config, b).rows
    assert late["held_back_overdue"] == 1 and late["held_back_s"] > 7000
    detail = late["held_back_detail"]
    assert f"session {group.session_id}: sequence 2 missing" in detail
    assert all(str(f) in detail for f in gap.later)

    # a sequence that holds nothing back cannot be skipped; the missing one can, once
    with pytest.raises(LandingSkipError, match="sequence 4 holds no file back"):
        store.declare_lost(spark, config, b, group.session_id, 4)
    with pytest.raises(LandingSkipError, match="sequence 1 is ingested"):
        store.declare_lost(spark, config, b, group.session_id, 1)
    assert "declared lost: the next ingest goes on" in _skip(gap, group.session_id, 2)
    assert store.declare_lost(spark, config, b, group.session_id, 2) is None  # a repeat
    log = spark.table(BucketTables(b.name).ingest_log).where("status = 'lost'").collect()
    assert [(r["session_id"], r["file_sequence"]) for r in log] == [(group.session_id, 2)]

    # ingest goes on from sequence 3, and nothing is held back any more
    second = ingest_bucket(spark, config, b)
    assert second.files == len(gap.later) and not second.held_back and not second.waiting
    [done] = landing_frame(spark, config, b).rows
    assert (done["held_back_overdue"], done["held_back_files"]) == (0, 0)


@pytest.mark.long  # three applies and two quality checks: minutes
def test_the_check_fails_on_an_overdue_gap_and_after_a_skip_reports_the_cut_snapshots(
    spark: SparkSession, gap: Gap
) -> None:
    config, b = gap.config, gap.bucket
    session_id = ingest_bucket(spark, config, b).held_back[0].session_id
    apply_bucket(spark, config, b)
    states = BucketTables(b.name).stream_state
    before = {r["vbucket"]: r["consistent_seqno"] for r in spark.table(states).collect()}
    _age(gap.later, 2 * 3600)
    report = check_bucket(spark, config, b)
    assert not report.passed and report.failed_errors == [HELD_BACK], report.render()
    [example] = report.outcome(HELD_BACK).examples
    assert f"session {session_id}: sequence 2 missing" in example["held_back_detail"]

    _skip(gap, session_id, 2)
    ingest_bucket(spark, config, b)
    apply_bucket(spark, config, b)
    after = {r["vbucket"]: r["consistent_seqno"] for r in spark.table(states).collect()}
    assert all(after[vb] > seqno for vb, seqno in before.items()), (before, after)
    report = check_bucket(spark, config, b)
    assert report.outcome(HELD_BACK).success
    # the gap: a snapshot the lost file cut stays incomplete, and items after it lie in none
    assert set(report.failed_errors) == {
        "snapshot_completeness.snapshot_complete",
        "snapshot_completeness.seqno_in_snapshot_range",
    }, report.render()
    out_of_range = report.outcome("snapshot_completeness.seqno_in_snapshot_range").examples
    assert any("outside any snapshot" in e["out_of_range_detail"] for e in out_of_range)
