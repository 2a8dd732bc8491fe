"""The cluster state a capture session ends with, from capture files to the quality check.

Each session of the capture agent ends by recording what its node holds (GET_ALL_VB_SEQNOS and
a DCP_GET_FAILOVER_LOG per vbucket, requests and replies). The captures here are written frame
by frame with the encoder, so every seqno and vb uuid is the one written below:

- ``s1`` streams vbuckets 3 and 4 from 0 to 6 on their first branches, then records the
  cluster: high seqnos 6 and 6, each vbucket's one-entry failover log.
- ``s2`` is the agent as it used to be: both vbuckets were at their end, so it asked nothing,
  while vbucket 3 had failed over to a replica that held seqno 1 only and grew to 3. It
  records the cluster: high seqnos 3 and 6, vbucket 3's log ``[B3@1, A3@0]``.
- ``s3`` is the agent as it is: vbucket 3's stream request from 6 is answered with a
  rollback to 1, the re-request with the new log, and seqnos 2 and 3 of branch B3 follow.

Bronze keeps the cluster-state frames, silver ignores them, and ``on_cluster_branch`` fails
after ``s1`` and ``s2`` (silver holds seqnos 2..6 of a branch that ended at 1) and passes once
``s3`` rolled silver back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dcp_cdc.capture import CaptureWriter
from dcp_cdc.config import AppConfig, BucketConfig, IngestConfig
from dcp_cdc.encoder import encode, make_header
from dcp_cdc.events import (
    Event,
    FailoverLog,
    FailoverLogRequest,
    FailoverLogResponse,
    Mutation,
    SnapshotMarker,
    StreamEnd,
    StreamRequest,
    StreamRequestResponse,
    VbSeqnosRequest,
    VbSeqnosResponse,
)
from dcp_cdc.protocol import ClientOpcode, Datatype, Opcode, Status, VbucketState
from pipelines import schemas
from pipelines.bronze.job import ingest_bucket
from pipelines.bronze.store import EVENTS_CLUSTERING
from pipelines.lake import delta_io
from pipelines.quality.job import check_bucket
from pipelines.silver import live
from pipelines.silver.job import apply_bucket
from pipelines.tables import BucketTables

A3, A4, B3 = 0xA3A3_0000_0003, 0xA4A4_0000_0004, 0xB3B3_0000_0003  # vb uuids
CLUSTER_OPAQUE = 0x10000  # the agent's command opaques start here; stream opaques are vbuckets
CAS = 0x17A8_B0D8_E6F4_0000  # a CAS of the spec's examples; each change adds its seqno above it
CLUSTER_STATE_OPS = (
    "vb_seqnos_request",
    "vb_seqnos_response",
    "failover_log_request",
    "failover_log_response",
)


# --- the captures --------------------------------------------------------------------------


def _mutation(vb: int, seqno: int, key: str) -> Mutation:
    h = make_header(
        Opcode.DCP_MUTATION, vbucket=vb, opaque=vb, cas=CAS + (seqno << 16), datatype=Datatype.JSON
    )
    key = f"vb{vb}-{key}"  # a key lives in one vbucket
    body = f'{{"key":"{key}","seqno":{seqno}}}'.encode()
    return Mutation(h, seqno, 1, 0, 0, 0, 0, 0, 0, key.encode(), body, None)


def _stream(
    vb: int,
    *,
    start: int,
    end: int,
    vb_uuid: int,
    log: FailoverLog,
    changes: list[tuple[int, str]],
) -> list[Event]:
    """A stream request answered with ``log``, one snapshot of ``changes``, an OK end."""
    events: list[Event] = [
        StreamRequest(
            make_header(Opcode.DCP_STREAM_REQ, vbucket=vb, opaque=vb),
            0,
            start,
            end,
            vb_uuid,
            start,
            start,
            "",
        ),
        StreamRequestResponse(
            make_header(Opcode.DCP_STREAM_REQ, status=Status.SUCCESS, opaque=vb),
            "success",
            log,
            None,
            b"",
        ),
        SnapshotMarker(
            make_header(Opcode.DCP_SNAPSHOT_MARKER, vbucket=vb, opaque=vb), "1", start + 1, end, 1
        ),
    ]
    events += [_mutation(vb, seqno, key) for seqno, key in changes]
    events.append(StreamEnd(make_header(Opcode.DCP_STREAM_END, vbucket=vb, opaque=vb), 0, "ok"))
    return events


def _cluster_state(highs: dict[int, int], logs: dict[int, FailoverLog]) -> list[Event]:
    """What the agent records as a session ends: the node's high seqnos, then each vbucket's
    failover log (opaque = the vbucket)."""
    seqnos = ClientOpcode.GET_ALL_VB_SEQNOS
    events: list[Event] = [
        VbSeqnosRequest(make_header(seqnos, opaque=CLUSTER_OPAQUE), VbucketState.ACTIVE, None),
        VbSeqnosResponse(
            make_header(seqnos, status=Status.SUCCESS, opaque=CLUSTER_OPAQUE),
            "success",
            tuple(highs.items()),
            b"",
        ),
    ]
    for vb, log in logs.items():
        get_log = Opcode.DCP_GET_FAILOVER_LOG
        events.append(FailoverLogRequest(make_header(get_log, vbucket=vb, opaque=vb)))
        events.append(
            FailoverLogResponse(
                make_header(get_log, status=Status.SUCCESS, opaque=vb), "success", log, b""
            )
        )
    return events


FIRST = [(seqno, key) for seqno, key in enumerate("abcdef", start=1)]
BRANCHED = ((B3, 1), (A3, 0))  # vbucket 3's log after its failover
# what each session ends with: the high seqnos and the failover logs
CLUSTER: dict[str, tuple[dict[int, int], dict[int, FailoverLog]]] = {
    "s1": ({3: 6, 4: 6}, {3: ((A3, 0),), 4: ((A4, 0),)}),
    "s2": ({3: 3, 4: 6}, {3: BRANCHED, 4: ((A4, 0),)}),
    "s3": ({3: 3, 4: 6}, {3: BRANCHED, 4: ((A4, 0),)}),
}


def s1() -> list[Event]:
    return [
        *_stream(3, start=0, end=6, vb_uuid=0, log=((A3, 0),), changes=FIRST),
        *_stream(4, start=0, end=6, vb_uuid=0, log=((A4, 0),), changes=FIRST),
        *_cluster_state(*CLUSTER["s1"]),
    ]


def s2() -> list[Event]:
    return _cluster_state(*CLUSTER["s2"])


def s3() -> list[Event]:
    """From 6 on A3 (past vbucket 3's end: the node judges the branch), rolled back to 1."""
    asked = make_header(Opcode.DCP_STREAM_REQ, vbucket=3, opaque=3)
    rollback = make_header(Opcode.DCP_STREAM_REQ, status=Status.ROLLBACK, opaque=3)
    return [
        StreamRequest(asked, 0, 6, 3, A3, 6, 6, ""),
        StreamRequestResponse(rollback, "rollback", None, 1, b""),
        *_stream(3, start=1, end=3, vb_uuid=A3, log=BRANCHED, changes=[(2, "b"), (3, "g")]),
        *_cluster_state(*CLUSTER["s3"]),
    ]


SESSIONS = (("s1", 0, s1), ("s2", 10, s2), ("s3", 20, s3))  # name, minute started, frames


def _write(landing: Path, bucket: str, session: str, minute: int, events: list[Event]) -> None:
    with CaptureWriter(
        landing,
        bucket=bucket,
        session_id=session,
        collections=True,
        features=("xattr", "json"),
        source="test",
        started_at=f"2026-01-05T09:{minute:02d}:00+00:00",
    ) as writer:
        for event in events:
            writer.write(encode(event))


def _without_cluster_state(events: list[Event]) -> list[Event]:
    return [e for e in events if e.op not in CLUSTER_STATE_OPS]


# --- the pipeline --------------------------------------------------------------------------


def _drop(spark: SparkSession, bucket: str) -> None:
    for db in ("bronze", "silver", "quality"):
        if not spark.catalog.databaseExists(db):
            continue
        for t in spark.catalog.listTables(db):
            if t.name.startswith(bucket):
                kind = "VIEW" if t.tableType == "VIEW" else "TABLE"
                spark.sql(f"DROP {kind} IF EXISTS {db}.{t.name}")


@pytest.fixture
def buckets(spark: SparkSession) -> Iterator[list[str]]:
    """Fresh bucket names (plain: their identifiers are themselves); their tables dropped."""
    names: list[str] = []
    yield names
    for name in names:
        _drop(spark, name)


def _config(landing: Path, warehouse: Path, bucket: str, **ingest: Any) -> AppConfig:
    landing.mkdir(parents=True, exist_ok=True)
    return AppConfig(
        landing=str(landing),
        warehouse=str(warehouse),
        buckets=[BucketConfig(name=bucket)],
        ingest=IngestConfig(**ingest),
    )


def _silver(spark: SparkSession, bucket: str) -> dict[str, Any]:
    """What silver holds, leaving out when and by which runs: every row of every collection
    as its view shows it (its table and the live layer, tombstones too), and each vbucket's
    position (not where in bronze it stands)."""
    names = BucketTables(bucket)
    registry = spark.table(names.registry).collect()
    rows = sorted(
        (f"{reg['scope']}.{reg['name']}", *r)
        for reg in registry
        for r in live.current_rows(spark, bucket, reg["table_name"], reg["collection_id"])
        .select("key", "doc", "_vbucket", "_vb_uuid", "_seqno", "_deleted", "_change")
        .collect()
    )
    states = sorted(
        spark.table(names.stream_state)
        .select("vbucket", "consistent_seqno", "last_applied_seqno", "vb_uuid", "failover_log")
        .collect()
    )
    return {"rows": rows, "states": states}


def _live_keys(spark: SparkSession, bucket: str) -> dict[int, dict[str, int]]:
    """Per vbucket, each live document's key (without its ``vbN-`` prefix) and seqno."""
    names = BucketTables(bucket)
    out: dict[int, dict[str, int]] = {}
    for t in [r["table_name"] for r in spark.table(names.registry).collect()]:
        for r in spark.table(t).select("_vbucket", "key", "_seqno").collect():
            out.setdefault(r["_vbucket"], {})[r["key"].split("-", 1)[1]] = r["_seqno"]
    return out


# --- the tests -----------------------------------------------------------------------------


def test_silver_ignores_the_cluster_state_frames_bronze_keeps(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, buckets: list[str]
) -> None:
    """The same sessions with and without their cluster-state frames: bronze keeps them (the
    high seqnos in ``high_seqnos``, the failover logs in ``failover_log``, each reply with its
    request's opaque), and the two silvers are equal, rows and positions."""
    silvers = {}
    for kept in (True, False):
        bucket = f"cs{uuid.uuid4().hex[:8]}"
        buckets.append(bucket)
        landing = tmp_path / f"landing-{kept}"
        for session, minute, events in SESSIONS:
            frames = events() if kept else _without_cluster_state(events())
            if frames:  # s2 is nothing but the cluster state
                _write(landing, bucket, session, minute, frames)
        config = _config(landing, spark_warehouse, bucket)
        ingest_bucket(spark, config, config.buckets[0])
        apply_bucket(spark, config, config.buckets[0])
        silvers[kept] = _silver(spark, bucket)
        recorded = [
            r.asDict(recursive=True)
            for r in spark.table(BucketTables(bucket).events)
            .where(F.col("op").isin(*CLUSTER_STATE_OPS))
            .select(
                "session_id", "op", "vbucket", "opaque", "status", "failover_log", "high_seqnos"
            )
            .collect()
        ]
        if not kept:
            assert recorded == []
            continue
        requests = sorted(
            (r["session_id"], r["op"], r["vbucket"], r["opaque"])
            for r in recorded
            if r["op"].endswith("_request")
        )
        assert requests == [
            (session, op, vb, opaque)
            for session, _, _ in SESSIONS
            for op, vb, opaque in (
                ("failover_log_request", 3, 3),
                ("failover_log_request", 4, 4),
                ("vb_seqnos_request", 0, CLUSTER_OPAQUE),
            )
        ]
        replies = {
            (r["session_id"], r["op"], r["opaque"]): (
                r["status"],
                r["failover_log"],
                r["high_seqnos"],
            )
            for r in recorded
            if r["op"].endswith("_response")
        }
        expected: dict[tuple[str, str, int], tuple[int, Any, Any]] = {}
        for session, (highs, logs) in CLUSTER.items():
            pairs = [{"vbucket": vb, "seqno": seqno} for vb, seqno in highs.items()]
            expected[(session, "vb_seqnos_response", CLUSTER_OPAQUE)] = (0, None, pairs)
            for vb, log in logs.items():
                entries = [{"vb_uuid": u, "seqno": seqno} for u, seqno in log]
                expected[(session, "failover_log_response", vb)] = (0, entries, None)
        assert replies == expected
    assert silvers[True] == silvers[False]
    assert len(silvers[True]["rows"]) == 3 + 6  # vb 3: a, b (again) and g; c..f removed


def test_a_bronze_table_of_an_earlier_version_gains_high_seqnos(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, buckets: list[str]
) -> None:
    """An events table made before ``high_seqnos`` existed gains it (at its end) on the next
    ingest, whichever writer writes, and the replies' pairs land in it by name."""
    for writer in ("arrow", "spark"):
        bucket = f"cs{uuid.uuid4().hex[:8]}"
        buckets.append(bucket)
        landing = tmp_path / writer
        _write(landing, bucket, "s1", 0, s1())
        config = _config(landing, spark_warehouse, bucket, writer=writer)
        table = BucketTables(bucket).events
        earlier = T.StructType([f for f in schemas.EVENTS.fields if f.name != "high_seqnos"])
        delta_io.ensure_database(spark, table)
        delta_io.create_table(spark, table, earlier, {}, cluster_by=EVENTS_CLUSTERING)
        ingest_bucket(spark, config, config.buckets[0])
        events = spark.table(table)
        assert events.columns[-1] == "high_seqnos"
        assert events.schema["high_seqnos"].dataType == schemas.EVENTS["high_seqnos"].dataType
        (reply,) = events.where(F.col("op") == "vb_seqnos_response").collect()
        assert [h.asDict() for h in reply["high_seqnos"]] == [
            {"vbucket": 3, "seqno": 6},
            {"vbucket": 4, "seqno": 6},
        ]
        assert events.where(F.col("high_seqnos").isNotNull()).count() == 1
        assert events.where(F.col("op") == "mutation").count() == 12


@pytest.mark.long
def test_a_missed_rollback_fails_on_cluster_branch_and_the_rollback_makes_it_pass(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, buckets: list[str]
) -> None:
    bucket = f"cs{uuid.uuid4().hex[:8]}"
    buckets.append(bucket)
    landing = tmp_path / "landing"
    config = _config(landing, spark_warehouse, bucket)
    _write(landing, bucket, "s1", 0, s1())
    _write(landing, bucket, "s2", 10, s2())
    ingest_bucket(spark, config, config.buckets[0])
    apply_bucket(spark, config, config.buckets[0])
    report = check_bucket(spark, config, config.buckets[0])

    # silver holds seqnos 2..6 of branch A3, which the cluster's newest log ends at 1
    assert report.failed_errors == ["stream_coverage.on_cluster_branch"], report.render()
    assert report.failed_warnings == [], report.render()
    outcome = report.outcome("stream_coverage.on_cluster_branch")
    assert outcome.observed == "1 of 2 vbuckets"
    assert outcome.examples == (
        {
            "where": "vb 3",
            "cluster_branch_detail": (
                f"silver at seqno 6 of vb uuid {A3}; the cluster's branch {A3} ended at seqno 1 "
                f"(newest failover log, session s2: [{B3}@1, {A3}@0])"
            ),
            "on_cluster_branch": False,
        },
    )
    assert _live_keys(spark, bucket)[3] == dict(zip("abcdef", range(1, 7), strict=True))

    # the same files and the session that rolled back
    _write(landing, bucket, "s3", 20, s3())
    ingest_bucket(spark, config, config.buckets[0])
    apply_bucket(spark, config, config.buckets[0])
    report = check_bucket(spark, config, config.buckets[0])
    assert report.passed and report.failed_warnings == [], report.render()
    assert report.outcome("stream_coverage.on_cluster_branch").observed == "0 of 2 vbuckets"
    assert _live_keys(spark, bucket) == {
        3: {"a": 1, "b": 2, "g": 3},
        4: dict(zip("abcdef", range(1, 7), strict=True)),
    }
