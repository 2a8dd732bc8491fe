"""History tables (SCD type 2) over simulator captures: every version a consumer received, in
the order of its vbucket, equals the truth's versions (``truth/history.jsonl``), whatever the
order, repetition or interruption of the input; point-in-time (``AS OF``) queries give the
bucket as it was."""

from __future__ import annotations

import base64
import datetime as dt
import fnmatch
import json
import random
import shutil
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.capture import iter_capture
from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.naming import identifier
from dcp_cdc.protocol import cas_time
from dcp_cdc.simulator import SCENARIOS, SimulationResult, simulate
from pipelines import tables
from pipelines.bronze.job import ingest_bucket
from pipelines.lake import delta_io
from pipelines.silver import state
from pipelines.silver.job import apply_bucket
from pipelines.tables import BucketTables
from tests.support.reference_consumer import capture_files
from tests.support.silver_runs import arrive_in_batches, pipeline, side_by_side
from tests.support.truth import assert_equal_to_truth, utc

Version = tuple[int, str, int]  # collection id, key, seqno


def _key(record: dict[str, Any]) -> str:
    if "key" in record:
        return str(record["key"])
    return base64.b64decode(record["key_b64"]).decode("utf-8", "replace")


@dataclass
class Expected:
    """One version of the truth as a history table must hold it."""

    record: dict[str, Any]
    change: str
    valid_to_seqno: int | None
    ended_by: str | None
    valid_to: tuple[dt.datetime | None, dt.datetime | None] | None
    """The end's time: exact (both the same), or the bounds of a drop or flush (DCP gives
    system events no time: after the vbucket's last change before it, before its next)."""


def expected_history(result: SimulationResult) -> dict[Version, Expected]:
    """The versions a consumer received (``streamed``), chained per key in seqno order, ended
    by the key's next received version or by a drop or flush of the collection in its vbucket
    before that; written independently of the pipeline, from the truth alone."""
    truth = result.out / "truth"
    records = [json.loads(line) for line in (truth / "history.jsonl").read_text().splitlines()]
    summary = json.loads((truth / "summary.json").read_text())
    ends: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for vb in summary["vbuckets"]:
        for e in vb["collection_ends"]:
            kind = "drop" if e["kind"] == "drop_collection" else "flush"
            ends.setdefault((vb["vbucket"], e["collection_id"]), []).append((e["seqno"], kind))
    # per vbucket: the CAS of every version by seqno (bounds of an event's time)
    clock_all: dict[int, list[tuple[int, int]]] = {}
    clock_streamed: dict[int, list[tuple[int, int]]] = {}
    for r in records:
        clock_all.setdefault(r["vbucket"], []).append((r["seqno"], r["cas"]))
        if r["streamed"]:
            clock_streamed.setdefault(r["vbucket"], []).append((r["seqno"], r["cas"]))
    for clocks in (clock_all, clock_streamed):
        for seq in clocks.values():
            seq.sort()

    def bounds(vb: int, seqno: int) -> tuple[dt.datetime | None, dt.datetime | None]:
        before = [c for s, c in clock_streamed.get(vb, []) if s < seqno]
        after = [c for s, c in clock_all.get(vb, []) if s > seqno]
        return (cas_time(max(before)) if before else None, cas_time(min(after)) if after else None)

    by_key: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in records:
        if r["streamed"]:
            by_key.setdefault((r["collection_id"], _key(r)), []).append(r)
    out: dict[Version, Expected] = {}
    for (cid, key), versions in by_key.items():
        versions.sort(key=lambda r: r["seqno"])
        for i, v in enumerate(versions):
            prev = versions[i - 1] if i else None
            nxt = versions[i + 1] if i + 1 < len(versions) else None
            vb_ends = sorted(ends.get((v["vbucket"], cid), []))
            end = next(((s, k) for s, k in vb_ends if s > v["seqno"]), None)
            if end is not None and (nxt is None or end[0] < nxt["seqno"]):
                to, by, at = end[0], end[1], bounds(v["vbucket"], end[0])
            elif nxt is not None:
                exact = cas_time(nxt["cas"])
                to, by, at = nxt["seqno"], "change", (exact, exact)
            else:
                to, by, at = None, None, None
            if v["deleted"]:
                change = v["change"]
            elif (
                prev is None
                or prev["deleted"]
                or any(prev["seqno"] < s < v["seqno"] for s, _ in vb_ends)
            ):
                change = "insert"
            else:
                change = "update"
            out[(cid, key, v["seqno"])] = Expected(v, change, to, by, at)
    return out


def history_rows(spark: SparkSession, bucket: str) -> dict[Version, dict[str, Any]]:
    """Every row of every history table of ``bucket``, live and archived."""
    rows: dict[Version, dict[str, Any]] = {}
    for name in _history_tables(spark, bucket):
        for r in spark.table(name).collect():
            ident = (r["_collection_id"], r["key"], r["_seqno"])
            assert ident not in rows, f"{ident} twice"
            rows[ident] = r.asDict()
    return rows


def assert_history_equal_to_truth(
    spark: SparkSession, bucket: str, results: Iterable[tuple[SimulationResult, str]]
) -> int:
    """Every history row of ``bucket`` whose key has one of the prefixes is a version the
    truth has, with its document, metadata and end; and every version the consumer received
    is there. Returns how many versions were compared."""
    rows = history_rows(spark, bucket)
    compared = 0
    for result, prefix in results:
        expected = expected_history(result)
        mine = {k: v for k, v in rows.items() if k[1].startswith(prefix)}
        missing, extra = set(expected) - set(mine), set(mine) - set(expected)
        assert not missing and not extra, (
            f"{result.out.name}: missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}"
        )
        for ident, e in expected.items():
            row, d = mine[ident], e.record
            where = f"{result.out.name} {ident}"
            if d["deleted"]:
                assert row["doc"] is None and row["doc_binary"] is None, where
            elif d["is_json"]:
                assert row["doc"] == d["value"] and row["doc_binary"] is None, where
            assert row["_deleted"] == d["deleted"], where
            assert (row["_rev_seqno"], row["_vbucket"]) == (d["rev_seqno"], d["vbucket"]), where
            assert row["_cas"] == (d["cas"] - (1 << 64) if d["cas"] >= 1 << 63 else d["cas"])
            assert utc(row["_modified_at"]) == cas_time(d["cas"]), where
            got = (row["_change"], row["_valid_to_seqno"], row["_ended_by"])
            assert got == (e.change, e.valid_to_seqno, e.ended_by), where
            if e.valid_to is None:
                assert row["_valid_to"] is None, where
            else:
                low, high = e.valid_to
                at = utc(row["_valid_to"])
                assert at is not None and (low is None or at >= low), (where, at, low)
                assert high is None or at <= high, (where, at, high)
            compared += 1
    return compared


def _history_tables(spark: SparkSession, bucket: str) -> list[str]:
    """The history tables of ``bucket``, live and archived."""
    return [
        f"silver.{t.name}"
        for t in spark.catalog.listTables("silver")
        if t.name.startswith(f"{identifier(bucket)}__") and t.name.endswith(tables.HISTORY_SUFFIX)
    ]


def _table_versions(spark: SparkSession, bucket: str) -> dict[str, int]:
    return {
        name: spark.sql(f"DESCRIBE HISTORY {name}").count()
        for name in _history_tables(spark, bucket)
    }


@pytest.mark.long
def test_history_equals_every_version_received_in_any_arrival_order(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """Every scenario (rollbacks, drops, flushes, expirations, a cut session, a resume that
    re-sends, OSO, history collections) shares one bucket on disjoint vbuckets and keys; the
    files arrive in shuffled batches with an ingest and an apply after each. The history
    tables equal the truth; an apply with nothing new, and a rebuild from all of bronze (every
    change replayed), add nothing."""
    results = side_by_side(
        tmp_path, bucket, SCENARIOS, seed=40, vbuckets=4, docs=80, ops=400, max_file_bytes=20_000
    )
    config = AppConfig(
        landing=str(tmp_path / "landing"),
        warehouse=str(spark_warehouse),
        buckets=[BucketConfig(name=bucket, history=True)],
    )
    arrive_in_batches(spark, config, results, seed=4)
    prefixed = [(r, f"{r.out.name}/") for r in results]
    compared = assert_history_equal_to_truth(spark, bucket, prefixed)
    assert compared > 2000
    ended = history_rows(spark, bucket).values()
    assert {r["_ended_by"] for r in ended} >= {"change", "drop", "flush", None}
    assert {r["_change"] for r in ended} == {"insert", "update", "delete", "expire"}
    for result, prefix in prefixed:
        assert_equal_to_truth(spark, bucket, result, key_prefix=prefix)

    commits = _table_versions(spark, bucket)
    again = apply_bucket(spark, config, config.buckets[0])
    assert again.history == {} and _table_versions(spark, bucket) == commits
    rebuilt = apply_bucket(spark, config, config.buckets[0], rebuild=True)
    assert rebuilt.history and set(rebuilt.history.values()) == {0}
    assert_history_equal_to_truth(spark, bucket, prefixed)


def _as_of(spark: SparkSession, table: str, at: dt.datetime) -> dict[str, tuple[int, str]]:
    """The README's point-in-time query: each key's version valid at ``at``."""
    query = f"""
        SELECT key, _seqno, doc FROM {table}
        WHERE _modified_at <= TIMESTAMP '{at.isoformat()}'
          AND (_valid_to IS NULL OR _valid_to > TIMESTAMP '{at.isoformat()}')
          AND NOT _deleted
    """
    return {r["key"]: (r["_seqno"], r["doc"]) for r in spark.sql(query).collect()}


def test_as_of_a_time_gives_the_bucket_as_it_was(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """A collection that keeps history on the server (every version streams): the history
    table queried AS OF a time equals the bucket's documents at that time, replayed from every
    version of the truth, at the times of versions and between them."""
    result, _ = pipeline(
        spark,
        tmp_path / "sim",
        spark_warehouse,
        bucket,
        settings={"buckets": [BucketConfig(name=bucket, history=["inventory.airline"])]},
        scenario="history",
        seed=12,
        vbuckets=4,
        docs=120,
        ops=600,
    )
    summary = json.loads((result.out / "truth" / "summary.json").read_text())
    airline = next(c for c in summary["collections"] if c["name"] == "airline")
    versions = [
        json.loads(line)
        for line in (result.out / "truth" / "history.jsonl").read_text().splitlines()
    ]
    versions = [v for v in versions if v["collection_id"] == airline["collection_id"]]
    assert versions and all(v["streamed"] for v in versions)  # nothing deduplicated away
    registry = spark.table(BucketTables(bucket).registry).collect()
    view = next(r["table_name"] for r in registry if r["name"] == "airline")
    assert _history_tables(spark, bucket) == [tables.history(view)]

    times = sorted({cas_time(v["cas"]) for v in versions})
    assert len(times) > 100
    chosen = [times[i] for i in random.Random(3).sample(range(len(times)), 12)]
    chosen += [t + dt.timedelta(microseconds=1) for t in chosen[:6]]  # between versions
    chosen.append(times[0] - dt.timedelta(seconds=1))  # before anything: empty
    by_time = sorted(versions, key=lambda v: (cas_time(v["cas"]), v["seqno"]))
    stamps = [cas_time(v["cas"]) for v in by_time]
    for at in chosen:
        state: dict[str, tuple[int, str]] = {}
        for v in by_time[: bisect_right(stamps, at)]:  # every version up to ``at``, in order
            if v["deleted"]:
                state.pop(_key(v), None)
            else:
                state[_key(v)] = (v["seqno"], v.get("value") if v["is_json"] else None)
        assert _as_of(spark, tables.history(view), at) == state, at


@pytest.mark.parametrize(
    "killed_at",
    ["committed:silver.*__history", pytest.param("save_states", marks=pytest.mark.long)],
)
def test_a_run_killed_after_a_history_commit_then_run_again_equals_the_truth(
    spark: SparkSession,
    spark_warehouse: Path,
    tmp_path: Path,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    killed_at: str,
) -> None:
    """A run with rollbacks in its batch dies after its first history commit (the rollback's
    removals) or before it saves its position (every history commit done); the next run walks
    the same batch again. History then equals the truth: nothing lost, nothing twice."""
    result = simulate(
        tmp_path / "sim", bucket=bucket, scenario="rollback", seed=5, vbuckets=2, docs=40, ops=160
    )
    config = AppConfig(
        landing=str(result.out / "landing"),
        warehouse=str(spark_warehouse),
        buckets=[BucketConfig(name=bucket, history=True)],
    )
    ingest_bucket(spark, config, config.buckets[0])

    def kill(*_: Any) -> None:
        raise KeyboardInterrupt(f"killed at {killed_at}")

    def point(step: str, name: str) -> None:
        if fnmatch.fnmatchcase(f"{step}:{name}", killed_at):
            kill()

    with monkeypatch.context() as m:
        if killed_at == "save_states":
            m.setattr(state, "save_states", kill)
        else:
            m.setattr(delta_io.faults, "point", point)
        with pytest.raises(KeyboardInterrupt):
            apply_bucket(spark, config, config.buckets[0])
    summary = apply_bucket(spark, config, config.buckets[0])
    assert summary.rollbacks, "the scenario must roll back inside the batch"
    assert assert_history_equal_to_truth(spark, bucket, [(result, "")]) > 100
    assert_equal_to_truth(spark, bucket, result)


@pytest.mark.long
def test_a_rollback_in_a_later_run_removes_the_versions_of_the_abandoned_branch(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, bucket: str
) -> None:
    """The changes a failover lost reach silver in complete snapshots and one run applies
    them; the rollback arrives in the next run's files. That run removes exactly those
    versions from history (the truth never had them), and the version each key had at the
    rollback point is current again until the new branch changes it."""
    result = simulate(
        tmp_path / "sim",
        bucket=bucket,
        scenario="rollback",
        seed=7,
        vbuckets=2,
        docs=40,
        ops=160,
        max_file_bytes=2_000,
    )
    files = capture_files(result.out / "landing")  # one session: in its order
    first = next(
        i
        for i, path in enumerate(files)
        if any(getattr(e, "rollback_seqno", None) is not None for e in iter_capture(path))
    )
    landing = tmp_path / "landing"
    landing.mkdir()
    config = AppConfig(
        landing=str(landing),
        warehouse=str(spark_warehouse),
        buckets=[BucketConfig(name=bucket, history=True)],
    )
    runs = []
    for batch in (files[:first], files[first:]):
        for path in batch:
            shutil.copy(path, landing)
        ingest_bucket(spark, config, config.buckets[0])
        runs.append(apply_bucket(spark, config, config.buckets[0]))
    assert not runs[0].rollbacks and runs[1].rollbacks
    removed = [
        int(r["operationMetrics"].get("numTargetRowsDeleted", "0"))
        for name in _history_tables(spark, bucket)
        for r in spark.sql(f"DESCRIBE HISTORY {name}").where("operation = 'MERGE'").collect()
    ]
    assert sum(removed) >= 12  # the scenario's lost changes of one vbucket at least
    assert assert_history_equal_to_truth(spark, bucket, [(result, "")]) > 100
    assert_equal_to_truth(spark, bucket, result)
