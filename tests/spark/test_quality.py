"""The quality suites over simulated captures.

Every scenario is simulated into one bucket on its own vbuckets and key prefix (as the many-
seeds silver test does), so one pipeline run and one check cover them all: each scenario
passes, except that ``interrupted`` reports its open snapshot. Then faults are injected into
that bucket (a duplicated frame, a gap inside a snapshot, a silver row deleted by hand, a row
of a dropped collection, a malformed frame) and ``dcp-cdc check`` must exit 1 naming the
expectations they break, with the failing rows in the results table and in the summary page,
which a real headless Chromium opens.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import random
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from dcp_cdc.config import AppConfig, BucketConfig, SparkConfig
from dcp_cdc.simulator import SCENARIOS, simulate
from pipelines import schemas
from pipelines.app import cli
from pipelines.bronze import transforms as bronze_transforms
from pipelines.bronze.decode import SessionOrder
from pipelines.bronze.job import ingest_bucket
from pipelines.catalog.contents import bucket_overview, bucket_overview_read
from pipelines.lake import delta_io, table_entries
from pipelines.quality.branches import (
    cluster_branches,
    history_items,
    latest_branches,
    on_branch,
    rollbacks,
    split_history,
)
from pipelines.quality.frames import base_frames, stream_frames
from pipelines.quality.job import check_bucket, pinned_versions, prune_results
from pipelines.quality.report import QualityReport, dump_dom, find_chromium
from pipelines.quality.small.sql import xxhash64
from pipelines.quality.streams import duplicate_seqnos, snapshots, stream_metrics
from pipelines.silver.job import apply_bucket
from pipelines.tables import WITH_TABLES, BucketTables, all_rows
from tests.support.spark_jobs import counted

VBUCKETS = 4  # per scenario
OFFSET = {scenario: VBUCKETS * i for i, scenario in enumerate(SCENARIOS)}
INTERRUPTED_WARNINGS = {
    "snapshot_completeness.last_snapshot_complete",
    "stream_coverage.reached_producer_high",
}


@dataclass
class Bucket:
    name: str
    config: AppConfig
    config_file: Path
    truths: dict[str, dict[str, Any]]  # scenario -> truth/summary.json
    live_now: int  # live documents of every truth, leaving out those past expiry now
    clean: QualityReport


def _vbucket(example: dict[str, Any]) -> int:
    match = re.match(r"vb (\d+)\b", example["where"])
    assert match, example
    return int(match.group(1))


def _drop_tables(spark: SparkSession, bucket: str) -> None:
    for db in ("bronze", "silver", "quality"):
        if not spark.catalog.databaseExists(db):
            continue
        for t in spark.catalog.listTables(db):
            if t.name.startswith(bucket):
                kind = "VIEW" if t.tableType == "VIEW" else "TABLE"
                spark.sql(f"DROP {kind} IF EXISTS {db}.{t.name}")


@pytest.fixture(scope="module")
def bucket(
    spark: SparkSession, spark_warehouse: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bucket]:
    name = f"q{uuid.uuid4().hex[:8]}"  # plain: its identifier is itself
    root = tmp_path_factory.mktemp("quality")
    landing = root / "landing"
    landing.mkdir()
    truths, live_now = {}, 0
    for i, scenario in enumerate(SCENARIOS):
        result = simulate(
            root / f"sim{i}",
            bucket=name,
            scenario=scenario,
            seed=40 + i,
            vbuckets=VBUCKETS,
            docs=60,
            ops=240,
            vbucket_offset=OFFSET[scenario],
            key_prefix=f"k{i}/",
        )
        for f in result.files:
            (landing / f.name).write_bytes(f.read_bytes())
        truths[scenario] = json.loads(result.truth.read_text())
        for line in (result.out / "truth" / "documents.jsonl").read_text().splitlines():
            expiry = json.loads(line)["expiry"]
            live_now += expiry == 0 or expiry > time.time()
    config_file = root / "quality.toml"
    config_file.write_text(
        f'landing = "{landing}"\nwarehouse = "{spark_warehouse}"\n'
        # the shared session's own (tests/spark/conftest.py): `check` runs in this process
        "[spark]\nshuffle_partitions = 2\n"
        f'[[buckets]]\nname = "{name}"\n'
    )
    config = AppConfig(
        landing=str(landing), warehouse=str(spark_warehouse), buckets=[BucketConfig(name=name)]
    )
    ingest_bucket(spark, config, config.buckets[0])
    apply_bucket(spark, config, config.buckets[0])
    clean = check_bucket(spark, config, config.buckets[0])
    yield Bucket(name, config, config_file, truths, live_now, clean)
    _drop_tables(spark, name)


def test_the_clean_bucket_passes_with_the_interrupted_warnings_only(bucket: Bucket) -> None:
    report = bucket.clean
    assert report.passed and report.failed_errors == []
    assert set(report.failed_warnings) == INTERRUPTED_WARNINGS
    assert len(report.outcomes) == 21
    counts = report.counts
    assert counts["held_back_files"] == 0  # every session's files landed whole
    assert counts["vbuckets"] == VBUCKETS * len(SCENARIOS)
    assert counts["live_documents_bronze"] == counts["live_documents_silver"] == bucket.live_now
    assert counts["quarantined_malformed"] == 0
    assert counts["quarantined_cut_tails"] == 2  # interrupted and mixed end a session cut
    assert Path(report.report_path).is_file() and Path(report.data_docs_path).is_file()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_meets_its_expectations(bucket: Bucket, scenario: str) -> None:
    """The failing rows in this scenario's vbuckets: none, but for ``interrupted`` its open
    snapshot, with the vbucket, range and missing span of the simulator's truth."""
    mine = range(OFFSET[scenario], OFFSET[scenario] + VBUCKETS)
    report = bucket.clean
    failing = {
        o.key: [x for x in o.examples if _vbucket(x) in mine]
        for o in report.outcomes
        if not o.success and o.suite in ("snapshot_completeness", "stream_coverage")
    }
    failing = {k: v for k, v in failing.items() if v}
    truth = bucket.truths[scenario]["open_snapshots"]
    opened = [s for s in report.open_snapshots if s.vbucket in mine]
    resumed = [s for s in report.resumed_snapshots if s.vbucket in mine]
    if scenario == "interrupted":
        (cut,) = truth
        vb = cut["vbucket"] + OFFSET[scenario]
        assert set(failing) == INTERRUPTED_WARNINGS
        assert [_vbucket(x) for xs in failing.values() for x in xs] == [vb, vb]
        (snap,) = opened
        assert (snap.vbucket, snap.start, snap.end, snap.last_seqno) == (
            vb,
            cut["start"],
            cut["end"],
            cut["last_seqno"],
        )
        assert snap.missing == f"{cut['last_seqno'] + 1}..{cut['end']}"
        assert resumed == []
    else:
        assert failing == {} and opened == []
        # mixed's first session is cut too, and its second session resumed that vbucket
        assert [(s.vbucket - OFFSET[scenario], s.start, s.end) for s in resumed] == [
            (c["vbucket"], c["start"], c["end"]) for c in truth
        ]


def test_results_are_appended_and_queryable_with_sql(spark: SparkSession, bucket: Bucket) -> None:
    report = bucket.clean
    rows = spark.sql(
        f"SELECT suite, expectation, success, severity, observed_value, examples "
        f"FROM {BucketTables(bucket.name).results} WHERE run_id = '{report.run_id}'"
    ).collect()
    assert len(rows) == 21
    # a commit every check: Delta's checkpoint every 100 of them, not every 10th check
    properties = delta_io.location_and_properties(spark, BucketTables(bucket.name).results)[1]
    assert properties["delta.checkpointInterval"] == "100"
    failed = {f"{r['suite']}.{r['expectation']}": r for r in rows if not r["success"]}
    assert set(failed) == INTERRUPTED_WARNINGS
    assert {r["severity"] for r in failed.values()} == {"warn"}
    examples = json.loads(failed["snapshot_completeness.last_snapshot_complete"]["examples"])
    assert "missing" in examples[0]["open_detail"]

    # the maintenance DAG prunes rows older than the retention
    table = BucketTables(bucket.name).results
    old = spark.table(table).where(F.col("run_id") == report.run_id).limit(1).collect()[0].asDict()
    old |= {"run_id": "old", "checked_at": old["checked_at"] - dt.timedelta(days=91)}
    spark.createDataFrame([old], schema=schemas.QUALITY_RESULTS).write.format("delta").mode(
        "append"
    ).saveAsTable(table)
    assert prune_results(spark, bucket.config, bucket.config.buckets[0]) == 1
    assert spark.table(table).where(F.col("run_id") == "old").count() == 0


def _outcome_examples(outcome: Any) -> tuple[str, ...]:
    return tuple(sorted(json.dumps(e, sort_keys=True, default=str) for e in outcome.examples))


def _found(report: QualityReport) -> tuple[Any, ...]:
    """What a check found: each expectation's outcome, the counts and the open snapshots."""
    outcomes = {
        (o.key, o.success, o.observed, o.unexpected_count, o.element_count, _outcome_examples(o))
        for o in report.outcomes
    }
    return outcomes, report.counts, report.open_snapshots, report.resumed_snapshots


def _in_spark(config: AppConfig, **spark: Any) -> AppConfig:
    """``config`` with the check's metric frames computed by Spark, with ``spark`` settings."""
    return config.model_copy(
        update={
            "quality": config.quality.model_copy(
                update={"on_driver_below_bytes": 0, "columnar_below_bytes": 0}
            ),
            "spark": config.spark.model_copy(update=spark),
        }
    )


def test_the_fixtures_check_ran_in_the_driver_and_runs_no_spark_job(
    spark: SparkSession, bucket: Bucket
) -> None:
    """``quality.columnar_below_bytes``: the check reads bronze and silver with delta-rs and
    computes its frames in the driver over columns; the results are appended from the
    driver."""
    assert bucket.clean.full_because is not None
    assert "columnar_below_bytes" in bucket.clean.full_because
    with counted(spark) as jobs:
        again = check_bucket(spark, bucket.config, bucket.config.buckets[0])
    assert jobs.count == 0, jobs.what
    assert _found(again) == _found(bucket.clean)


def test_a_check_asks_the_catalog_of_each_table_once(
    spark: SparkSession, bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check takes the entries of the tables and views it reads and writes from the
    catalog at its start (a call per database); afterwards it asks ``tableExists`` only of a
    table the catalog did not hold then, and looks up no table's location."""
    from pyspark.sql.catalog import Catalog

    asked: list[str] = []
    exists = Catalog.tableExists
    located: list[str] = []
    delta_log = delta_io._delta_log

    def counted_exists(self: Catalog, name: str, *args: Any) -> bool:
        asked.append(name)
        return exists(self, name, *args)

    def counted_log(spark: SparkSession, table: str) -> Any:
        if table_entries.location(table) is None:
            located.append(table)
        return delta_log(spark, table)

    monkeypatch.setattr(Catalog, "tableExists", counted_exists)
    monkeypatch.setattr(delta_io, "_delta_log", counted_log)
    again = check_bucket(spark, bucket.config, bucket.config.buckets[0])
    monkeypatch.undo()
    assert _found(again) == _found(bucket.clean)
    assert not [t for t in asked if spark.catalog.tableExists(t)], asked
    assert not [t for t in located if spark.catalog.tableExists(t)], located


def test_pinned_versions_are_every_table_the_check_reads_at_its_latest(
    spark: SparkSession, bucket: Bucket
) -> None:
    """The bucket's tables and its registry's collection tables that exist, each at its
    latest version, read without a Spark job; a bucket never ingested has none."""
    names = BucketTables(bucket.name)
    with counted(spark) as jobs:
        pinned = pinned_versions(spark, bucket.name)
    assert jobs.count == 0, jobs.what
    registry = spark.table(names.registry).where(F.col("status").isin(*WITH_TABLES))
    collections = sorted(all_rows(r["table_name"]) for r in registry.collect())
    assert collections
    wanted = [names.events, names.quarantine, names.ingest_log, names.stream_state]
    wanted += [names.pending, names.purges, names.registry, *collections]
    exist = [t for t in wanted if spark.catalog.tableExists(t)]
    assert sorted(pinned) == sorted(exist)
    assert set(collections) <= set(pinned)
    assert pinned == {t: delta_io.table_version(spark, t) for t in exist}
    assert pinned_versions(spark, f"never_{uuid.uuid4().hex[:8]}") == {}


def test_a_compiled_check_in_spark_finds_what_the_driver_found(
    spark: SparkSession, bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixture's check ran in the driver; Spark's check of the same tables, its queries
    compiled (``spark.interpreted_below_bytes`` 0), gives the same outcomes, counts and
    snapshots. (test_quality_incremental.py compares the interpreted ones' metric rows.)"""
    events = BucketTables(bucket.name).events
    assert delta_io.table_size(spark, events)[1] < SparkConfig().interpreted_below_bytes
    chosen: list[bool] = []
    real = delta_io.static_plan_session

    def spied(session: SparkSession, *, interpreted: bool = False) -> SparkSession:
        chosen.append(interpreted)
        return real(session, interpreted=interpreted)

    monkeypatch.setattr(delta_io, "static_plan_session", spied)
    config = _in_spark(bucket.config, interpreted_below_bytes=0)
    compiled = check_bucket(spark, config, config.buckets[0])
    assert chosen == [False]
    assert _found(compiled) == _found(bucket.clean)


# --- injected faults ----------------------------------------------------------------------


@dataclass
class Faults:
    duplicate: Row  # the frame written twice
    gap: Row  # the data event at a snapshot's end, deleted from bronze
    deleted: Row  # the silver row deleted by hand (its table in ``table``)
    dropped_cid: int
    resurrected_vb: int
    exit_code: int
    stdout: str
    stderr: str
    run_id: str
    results: dict[str, dict[str, Any]]  # suite.expectation -> its row in the results table


def _append(spark: SparkSession, rows: list[dict[str, Any]], schema: Any, table: str) -> None:
    spark.createDataFrame(rows, schema=schema).write.format("delta").mode("append").saveAsTable(
        table
    )


@pytest.fixture(scope="module")
def faults(spark: SparkSession, bucket: Bucket) -> Faults:
    names = BucketTables(bucket.name).bronze
    events = spark.table(names["events"])
    data = F.col("op").isin("mutation", "deletion", "expiration") & ~F.col("in_oso")

    def in_scenario(scenario: str) -> Any:
        return F.col("vbucket").between(OFFSET[scenario], OFFSET[scenario] + VBUCKETS - 1)

    # a frame written twice: the same mutation again right after itself
    duplicate = (
        events.where(data & in_scenario("basic"))
        .orderBy("session_id", "file_sequence", "offset")
        .collect()[20]
    )
    _append(
        spark,
        [{**duplicate.asDict(), "offset": duplicate["offset"] + 1}],
        schemas.EVENTS,
        names["events"],
    )

    # a gap inside a snapshot: the event at a (not last) snapshot's end is lost
    later_marker = events.where(F.col("op") == "snapshot_marker").select(
        F.col("session_id").alias("m_session"),
        F.col("vbucket").alias("m_vb"),
        F.struct("file_sequence", "offset").alias("m_pos"),
    )
    gap = (
        events.where(data & in_scenario("ttl") & (F.col("by_seqno") == F.col("in_snapshot_end")))
        .join(
            later_marker,
            (F.col("session_id") == F.col("m_session"))
            & (F.col("vbucket") == F.col("m_vb"))
            & (F.col("m_pos") > F.struct("file_sequence", "offset")),
            how="left_semi",
        )
        .orderBy("session_id", "file_sequence", "offset")
        .collect()[5]
    )
    spark.sql(
        f"DELETE FROM {names['events']} WHERE file = '{gap['file']}' AND offset = {gap['offset']}"
    )

    # a row of a collection dropped in its vbucket comes back
    registry = (
        spark.table(BucketTables(bucket.name).registry).where("status != 'retired'").collect()
    )
    dropped_cid = min(bucket.truths["collection-lifecycle"]["dropped_collections"])
    table = next(r["table_name"] for r in registry if r["collection_id"] == dropped_cid)
    sample = spark.table(all_rows(table)).where(~F.col("_deleted")).limit(1).collect()[0]
    vb = OFFSET["collection-lifecycle"]
    _append(
        spark,
        [{**sample.asDict(), "key": "resurrected::1", "_vbucket": vb}],
        spark.table(all_rows(table)).schema,
        all_rows(table),
    )

    # a silver row deleted by hand, in a collection the other faults leave alone
    lo = OFFSET["history"]
    deleted = next(
        Row(**r.asDict(), table=reg["table_name"])
        for reg in registry
        if reg["collection_id"] not in (dropped_cid, gap["collection_id"])
        for r in spark.table(reg["table_name"])
        .where(F.col("_vbucket").between(lo, lo + VBUCKETS - 1))
        .limit(1)
        .collect()
    )
    spark.sql(f"DELETE FROM {all_rows(deleted['table'])} WHERE key = '{deleted['key']}'")

    # a malformed frame in quarantine
    file = spark.table(names["ingest_log"]).where("status = 'ingested'").collect()[0]["file"]
    quarantined = {f.name: None for f in schemas.QUARANTINE.fields} | {
        "bucket": bucket.name,
        "file": file,
        "offset": 24,
        "opcode": 0x57,
        "reason": "extras length does not fit the opcode",
        "truncated": False,
    }
    _append(spark, [quarantined], schemas.QUARANTINE, names["quarantine"])

    argv = ["check", "--config", str(bucket.config_file), "--bucket", bucket.name]
    if find_chromium():
        argv.append("--screenshot")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(argv, out=out)
    match = re.search(r"run (\S+),", out.getvalue())
    assert match, out.getvalue() + err.getvalue()
    run_id = match.group(1)
    results = {
        f"{r['suite']}.{r['expectation']}": r.asDict()
        for r in spark.table(BucketTables(bucket.name).results)
        .where(F.col("run_id") == run_id)
        .collect()
    }
    return Faults(
        duplicate,
        gap,
        deleted,
        dropped_cid,
        vb,
        code,
        out.getvalue(),
        err.getvalue(),
        run_id,
        results,
    )


def _examples(faults: Faults, key: str) -> list[dict[str, Any]]:
    row = faults.results[key]
    assert not row["success"], key
    return list(json.loads(row["examples"]))


def test_check_exits_1_naming_the_failed_error_expectations(faults: Faults) -> None:
    assert faults.exit_code == 1, faults.stderr
    named = faults.stderr.split("failed error expectations: ")[1]
    for key in (
        "snapshot_completeness.no_duplicate_seqno",
        "snapshot_completeness.snapshot_complete",
        "silver_reconciliation.live_count_matches",
        "silver_reconciliation.no_dropped_collection_rows",
        "bronze_integrity.quarantine_within_threshold",
    ):
        assert key in named
    assert "ERROR silver_reconciliation.live_count_matches" in faults.stdout


def test_a_duplicated_frame_fails_no_duplicate_seqno(faults: Faults) -> None:
    d = faults.duplicate
    where = f"vb {d['vbucket']} · session {d['session_id']} · stream "
    examples = _examples(faults, "snapshot_completeness.no_duplicate_seqno")
    assert [x["duplicate_seqno_detail"] for x in examples if x["where"].startswith(where)] == [
        f"seqno {d['by_seqno']} repeated"
    ]
    regressions = _examples(faults, "snapshot_completeness.seqnos_increase_within_stream")
    assert [x["regression_detail"] for x in regressions if x["where"].startswith(where)] == [
        f"seqno {d['by_seqno']} after {d['by_seqno']}"
    ]


def test_a_gap_inside_a_snapshot_fails_snapshot_complete(faults: Faults) -> None:
    g = faults.gap
    where = f"vb {g['vbucket']} · session {g['session_id']} · stream "
    examples = [
        x
        for x in _examples(faults, "snapshot_completeness.snapshot_complete")
        if x["where"].startswith(where)
    ]
    (example,) = examples
    detail = example["incomplete_detail"]
    assert detail.startswith(f"[{g['in_snapshot_start']}, {g['in_snapshot_end']}] missing ")
    assert detail.endswith(f"..{g['in_snapshot_end']}")


def test_a_silver_row_deleted_by_hand_fails_reconciliation(faults: Faults) -> None:
    cid = faults.deleted["_collection_id"]
    for key in (
        "silver_reconciliation.live_count_matches",
        "silver_reconciliation.checksum_matches",
    ):
        (example,) = [
            x for x in _examples(faults, key) if x["where"].startswith(f"collection 0x{cid:x} ")
        ]
        if key.endswith("live_count_matches"):
            assert example["bronze_live"] == example["silver_live"] + 1


def test_a_row_of_a_dropped_collection_fails_no_dropped_collection_rows(faults: Faults) -> None:
    (example,) = _examples(faults, "silver_reconciliation.no_dropped_collection_rows")
    assert example["where"].startswith(f"collection 0x{faults.dropped_cid:x} ")
    assert example["dropped_rows"] == 1
    assert example["dropped_detail"].endswith(f" key resurrected::1 in vb {faults.resurrected_vb}")


def test_a_malformed_frame_over_the_threshold_fails_quarantine(faults: Faults) -> None:
    row = faults.results["bronze_integrity.quarantine_within_threshold"]
    assert not row["success"] and row["severity"] == "error"
    assert row["observed_value"] == "1 (at most 0)"
    (example,) = json.loads(row["examples"])
    assert example["malformed_detail"] == "offset 24: extras length does not fit the opcode"


def test_the_summary_page_in_headless_chromium_shows_the_failures(
    faults: Faults, bucket: Bucket
) -> None:
    if find_chromium() is None:
        pytest.skip("no chromium binary on PATH (.ci/run installs Debian's chromium as root)")
    folder = Path(bucket.config.warehouse) / "quality" / bucket.name
    png = folder / "summary.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    dom = dump_dom(folder / "summary.html")
    failing = dom.split('id="failing"')[1].split("</div>")[0]
    for key in (
        "snapshot_completeness.no_duplicate_seqno",
        "silver_reconciliation.live_count_matches",
        "silver_reconciliation.no_dropped_collection_rows",
        "snapshot_completeness.last_snapshot_complete",
    ):
        assert f'data-expectation="{key}"' in failing
    assert "resurrected::1" in failing
    assert "FAILED: " in dom.split('id="status"')[1][:40]
    docs = dump_dom(folder / "data_docs" / "index.html")
    assert "snapshot_completeness" in docs and "silver_reconciliation" in docs


# --- the metric transforms on a hand-made stream ------------------------------------------


def _frame(offset: int, op: str, **fields: Any) -> dict[str, Any]:
    opcodes = {
        "stream_request": 0x53,
        "stream_request_response": 0x53,
        "snapshot_marker": 0x56,
        "mutation": 0x57,
        "stream_end": 0x55,
        "seqno_advanced": 0x64,
    }
    row: dict[str, Any] = {f.name: None for f in schemas.DECODE_OUTPUT.fields}
    response = op.endswith("_response")
    row.update(
        offset=offset,
        frame_len=24,
        op=op,
        magic=0x81 if response else 0x80,
        opcode=opcodes[op],
        opaque=5,
        bucket="b",
        session_started_at="2026-01-05T09:30:00+00:00",
        session_id="s",
        file="/landing/s-0.dcpcap",
        file_sequence=0,
        frame_index=offset,
    )
    row["status" if response else "vbucket"] = fields.pop("status", 0 if response else 5)
    if op == "mutation":
        row.update(rev_seqno=1, cas=fields["by_seqno"], collection_id=0, is_json=True)
    row.update(fields)
    return row


def _key(k: str) -> bytes:
    return k.encode()


STREAM = [
    _frame(1, "stream_request", start_seqno=0, end_seqno=30),
    _frame(2, "stream_request_response", failover_log=[{"vb_uuid": 7, "seqno": 0}]),
    _frame(3, "snapshot_marker", start_seqno=1, end_seqno=10, snapshot_flags=1),
    _frame(4, "mutation", by_seqno=3, key=_key("a")),
    _frame(5, "mutation", by_seqno=10, key=_key("b")),  # [1, 10] reached its end
    _frame(6, "snapshot_marker", start_seqno=11, end_seqno=20, snapshot_flags=1),
    _frame(7, "mutation", by_seqno=12, key=_key("c")),
    _frame(8, "mutation", by_seqno=12, key=_key("c")),  # the same frame again
    _frame(9, "snapshot_marker", start_seqno=18, end_seqno=25, snapshot_flags=1),  # covers 20
    _frame(10, "mutation", by_seqno=19, key=_key("d")),
    _frame(11, "mutation", by_seqno=26, key=_key("e")),  # outside [18, 25]
    _frame(12, "snapshot_marker", start_seqno=27, end_seqno=30, snapshot_flags=1),
    _frame(13, "mutation", by_seqno=28, key=_key("f")),  # 29..30 never came
    _frame(14, "stream_end", reason_code=1, reason="closed"),  # bounded, but not Ok
    _frame(15, "stream_request", start_seqno=28, end_seqno=-1),
    _frame(16, "stream_request_response", status=0x23, rollback_seqno=15),
    _frame(17, "stream_request", start_seqno=15, end_seqno=-1),
    _frame(
        18,
        "stream_request_response",
        failover_log=[{"vb_uuid": 9, "seqno": 15}, {"vb_uuid": 7, "seqno": 0}],
    ),
    _frame(19, "snapshot_marker", start_seqno=16, end_seqno=40, snapshot_flags=2),
    _frame(20, "mutation", by_seqno=16, key=_key("g")),  # below 28, but after the rollback
    _frame(21, "mutation", by_seqno=40, key=_key("h")),
    _frame(22, "snapshot_marker", start_seqno=41, end_seqno=50, snapshot_flags=1),  # empty
    _frame(23, "snapshot_marker", start_seqno=51, end_seqno=60, snapshot_flags=1),
    _frame(24, "seqno_advanced", by_seqno=60),
]


def _stream_metrics(spark: SparkSession, *sessions: list[dict[str, Any]]) -> dict[Any, Any]:
    """stream_metrics over hand-made sessions (one file each, decoded in session order):
    the rows by (session id, stream number)."""
    tables = []
    for frames in sessions:
        decoded = pa.Table.from_pylist(frames, schema=to_arrow_schema(schemas.DECODE_OUTPUT))
        for name, column in SessionOrder({}).columns(decoded).items():
            decoded = decoded.append_column(name, column)
        tables.append(decoded)
    frames_df = spark.createDataFrame(pa.concat_tables(tables))
    events = bronze_transforms.events(frames_df, "run", F.current_timestamp()).localCheckpoint()
    placed = stream_frames(base_frames(events)).localCheckpoint()
    metrics = stream_metrics(placed, snapshots(placed), duplicate_seqnos(placed))
    return {(r["session_id"], r["stream_no"]): r.asDict() for r in metrics.collect()}


def _session(name: str, minute: int, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    where = {
        "session_id": name,
        "session_started_at": f"2026-01-05T09:{minute:02d}:00+00:00",
        "file": f"/landing/{name}-0.dcpcap",
    }
    return [f | where for f in frames]


CUT_AT_120 = [  # asked to end at 150; the connection was cut after seqno 120
    _frame(1, "stream_request", start_seqno=100, end_seqno=150),
    _frame(2, "stream_request_response", failover_log=[{"vb_uuid": 7, "seqno": 0}]),
    _frame(3, "snapshot_marker", start_seqno=101, end_seqno=120, snapshot_flags=2),
    _frame(4, "mutation", by_seqno=120, key=_key("a")),
]
RESUMED_TO_150 = [  # another session resumed it and reached the end
    _frame(1, "stream_request", start_seqno=120, end_seqno=150),
    _frame(2, "stream_request_response", failover_log=[{"vb_uuid": 7, "seqno": 0}]),
    _frame(3, "snapshot_marker", start_seqno=121, end_seqno=150, snapshot_flags=2),
    _frame(4, "mutation", by_seqno=150, key=_key("b")),
    _frame(5, "stream_end", reason_code=0, reason="ok"),
]


def test_a_bounded_stream_another_session_resumed_is_a_recovered_fault(
    spark: SparkSession,
) -> None:
    """A cut connection leaves a bounded stream without its end; that is an error while it
    is the vbucket's latest stream, and a recovered fault once a later one finished it."""
    cut = _stream_metrics(spark, _session("s1", 30, CUT_AT_120))
    assert cut[("s1", 1)] == cut[("s1", 1)] | {
        "latest": True,
        "bounded_end_ok": False,
        "end_detail": "asked to end at 150, no stream end",
    }
    both = _stream_metrics(
        spark, _session("s1", 30, CUT_AT_120), _session("s2", 31, RESUMED_TO_150)
    )
    assert {k: (r["latest"], r["bounded_end_ok"], r["end_detail"]) for k, r in both.items()} == {
        ("s1", 1): (False, True, None),
        ("s2", 1): (True, True, None),
    }


def test_stream_metrics_of_a_hand_made_session(spark: SparkSession) -> None:
    # session order as the ingest's decode task gives it (one file, nothing carried in)
    decoded = pa.Table.from_pylist(STREAM, schema=to_arrow_schema(schemas.DECODE_OUTPUT))
    for name, column in SessionOrder({}).columns(decoded).items():
        decoded = decoded.append_column(name, column)
    frames = spark.createDataFrame(decoded)
    events = bronze_transforms.events(frames, "run", F.current_timestamp()).localCheckpoint()
    placed = stream_frames(base_frames(events)).localCheckpoint()
    snaps = snapshots(placed)
    rows = {
        r["stream_no"]: r.asDict()
        for r in stream_metrics(placed, snaps, duplicate_seqnos(placed)).collect()
    }
    assert sorted(rows) == [1, 2]  # the rollback response and re-request belong to stream 2
    first, second = rows[1], rows[2]
    assert (first["latest"], second["latest"]) == (False, True)
    assert first == first | {
        "snapshots": 4,
        "items": 7,
        "out_of_range": 1,
        "out_of_range_detail": "seqno 26 outside [18, 25]",
        "incomplete": 0,
        "incomplete_detail": None,
        "last_snapshot_complete": None,  # a later stream exists: reported, not failed
        "open_start": 27,
        "open_end": 30,
        "open_last_seqno": 28,
        "open_missing_from": 29,
        "open_detail": "[27, 30] received up to 28, missing 29..30",
        "regressions": 1,
        "regression_detail": "seqno 12 after 12",
        "duplicate_seqnos": 2,
        "duplicate_seqno_detail": "seqno 12 repeated",
        "duplicate_keys": 1,
        "duplicate_key_detail": "[11, 20]: 2 data events for 1 keys",
        "bounded": True,
        "requested_end": 30,
        "bounded_end_ok": True,  # ended closed, but the next stream resumed it
        "end_detail": None,
        "producer_high": 30,
    }
    assert second == second | {
        "snapshots": 3,
        "items": 3,
        "out_of_range": 0,
        "regressions": 0,
        "duplicate_seqnos": 0,
        "incomplete": 1,
        "incomplete_detail": "[41, 50] missing 41..50",
        "last_snapshot_complete": True,
        "open_detail": None,
        "bounded": False,
        "requested_end": None,
        "bounded_end_ok": None,
        "requested_start": 15,
        "producer_high": 60,
        "complete_end": 60,
    }

    branches = {(r["uuid"], r["branch_end"]) for r in latest_branches(placed).collect()}
    assert branches == {(9, None), (7, 15)}
    alive, dead = split_history(history_items(placed), latest_branches(placed), rollbacks(placed))
    assert sorted(r["seqno"] for r in alive.collect()) == [3, 10, 12, 12, 16, 40]
    assert sorted(r["seqno"] for r in dead.collect()) == [19, 26, 28]  # above the rollback to 15


LOG = "ARRAY<STRUCT<vb_uuid: BIGINT, seqno: BIGINT>>"


def test_cluster_branches_take_the_newest_log_and_a_high_seqno_not_older(
    spark: SparkSession,
) -> None:
    """What the captures say the cluster's history is: per vbucket the newest failover log
    (a stream's or a DCP_GET_FAILOVER_LOG reply's) and a high seqno of its session or later."""
    columns = (
        f"vbucket INT, op STRING, status INT, session_started_at STRING, session_id STRING, "
        f"file_sequence INT, offset BIGINT, failover_log {LOG}, "
        "high_seqnos ARRAY<STRUCT<vbucket: INT, seqno: BIGINT>>"
    )
    t1, t2 = "2026-01-05T09:30:00", "2026-01-05T09:40:00"
    base = spark.createDataFrame(
        [
            (3, "stream_request_response", 0, t1, "s1", 0, 24, [(11, 0)], None),
            (3, "failover_log_response", 0, t1, "s1", 0, 900, [(11, 0)], None),
            (3, "stream_request_response", 0, t2, "s2", 0, 24, [(12, 1), (11, 0)], None),
            (3, "failover_log_response", 7, t2, "s2", 0, 800, None, None),  # refused
            (4, "failover_log_response", 0, t2, "s2", 0, 900, [(11, 0)], None),
            (None, "vb_seqnos_response", 0, t1, "s1", 0, 850, None, [(3, 6), (4, 20)]),
            (None, "vb_seqnos_response", 0, t2, "s2", 0, 850, None, [(3, 3)]),
        ],
        columns,
    )
    rows = {r["vbucket"]: r.asDict() for r in cluster_branches(base).collect()}
    assert rows == {
        3: {
            "vbucket": 3,
            "log": [Row(vb_uuid=12, seqno=1), Row(vb_uuid=11, seqno=0)],
            "log_session": "s2",
            "high": 3,
        },
        4: {"vbucket": 4, "log": [Row(vb_uuid=11, seqno=0)], "log_session": "s2", "high": None},
    }  # vbucket 4's high (20) is of an older session than its log: not used


def test_on_cluster_branch_of_hand_made_positions(spark: SparkSession) -> None:
    """Silver's branch at its consistent seqno against the cluster's newest failover log and
    high seqno: the expected verdicts and details written down."""
    states = spark.createDataFrame(
        [
            (3, 6, 11, [(11, 0)]),  # the cluster's branch 11 ended at 1: a missed rollback
            (4, 9, 11, [(11, 0)]),  # on the newest branch, below its high seqno
            (5, 12, 11, [(11, 0)]),  # past the newest branch's high seqno (10)
            (6, 3, 13, [(13, 0)]),  # a branch the cluster does not hold
            (7, 3, 11, [(11, 0)]),  # nothing recorded: not judged
            (8, 4, 12, [(12, 5), (11, 0)]),  # silver's branch at 4 is 11, which ended at 5
            (9, 0, None, []),  # no uuid in silver (no stream opened): not judged
            (10, 50, 11, [(11, 0)]),  # the newest branch, no high seqno recorded: no end known
        ],
        f"vbucket INT, consistent_seqno BIGINT, vb_uuid BIGINT, failover_log {LOG}",
    )
    cluster = spark.createDataFrame(
        [
            (3, [(12, 1), (11, 0)], "s2", 3),
            (4, [(11, 0)], "s2", 9),
            (5, [(11, 0)], "s2", 10),
            (6, [(12, 0)], "s2", None),
            (8, [(14, 6), (12, 5), (11, 0)], "s2", 30),
            (9, [(11, 0)], "s2", 3),
            (10, [(11, 0)], "s2", None),
        ],
        f"vbucket INT, log {LOG}, log_session STRING, high BIGINT",
    )
    rows = {
        r["vbucket"]: (r["on_cluster_branch"], r["cluster_branch_detail"])
        for r in on_branch(states, cluster).collect()
    }
    assert rows == {
        3: (
            False,
            "silver at seqno 6 of vb uuid 11; the cluster's branch 11 ended at seqno 1 "
            "(newest failover log, session s2: [12@1, 11@0])",
        ),
        4: (True, None),
        5: (
            False,
            "silver at seqno 12 of vb uuid 11; the cluster's branch 11 is at seqno 10 "
            "(its high seqno; newest failover log, session s2: [11@0])",
        ),
        6: (
            False,
            "silver at seqno 3 of vb uuid 13; the cluster no longer holds that branch "
            "(newest failover log, session s2: [12@0])",
        ),
        8: (True, None),
        10: (True, None),
    }


def test_sparks_xxhash64_is_the_drivers(spark: SparkSession) -> None:
    """The reconciliation checksum hashes (key, seqno) as Spark's ``xxhash64`` does: keys of
    every length (each of XXH64's tails and stripes), non-ASCII, and seqnos of any sign."""
    rng = random.Random(7)
    alphabet = "ab/_-é€𝄞0123456789"
    rows = [
        ("".join(rng.choice(alphabet) for _ in range(n)), rng.randrange(-(1 << 63), 1 << 63))
        for n in [*range(70), 250]
    ]
    rows += [("", 0), ("k", None), (None, 5)]
    found = spark.createDataFrame(rows, "key STRING, seqno BIGINT").select(
        "key", "seqno", F.xxhash64("key", "seqno").alias("h")
    )
    for r in found.collect():
        key = None if r["key"] is None else r["key"].encode()
        assert xxhash64(key, r["seqno"]) == r["h"], (r["key"], r["seqno"])


def test_the_overview_read_in_the_driver_is_sparks(spark: SparkSession, bucket: Bucket) -> None:
    """``dcp-cdc run``'s overview of a small bucket, read through delta-rs, says what Spark's
    queries of the same tables say: events by type, quarantined frames, documents per
    collection (live, tombstones, expired) and open snapshots."""
    read = bucket_overview_read(spark, bucket.name)
    interpreted = delta_io.static_plan_session(spark, interpreted=True)  # as a small run's
    assert read == bucket_overview(interpreted, bucket.name)
    assert sum(c.live for c in read.collections) > 0 and read.events_by_op
