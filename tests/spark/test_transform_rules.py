"""Silver's and quality's rules, each on a few rows written out: small DataFrames with explicit
schemas go through one pure transform, and the rows that come out are compared, sorted, with
rows written down here (never computed by the code under test)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.quality.branches import bronze_live_documents, collection_cuts
from pipelines.quality.streams import duplicate_seqnos
from pipelines.silver import arrow_rows
from pipelines.silver.transforms import history_fixes, rolled_back_keys, silver_rows

CHANGES = (
    "op STRING, key BINARY, value BINARY, is_json BOOLEAN, xattrs MAP<STRING, STRING>, "
    "collection_id LONG, vbucket INT, in_vb_uuid LONG, by_seqno LONG, rev_seqno LONG, "
    "cas LONG, flags LONG, expiration LONG, ingest_run_id STRING"
)
"""The walked change rows silver's columns are made from (a part of ``schemas.WALKED``)."""


def rows(frame: DataFrame, *columns: str) -> list[tuple[Any, ...]]:
    """``columns`` of every row of ``frame``, as sorted tuples (``None`` sorts first)."""
    out = [tuple(r) for r in frame.select(*columns).collect()]
    return sorted(out, key=lambda row: [(v is not None, v) for v in row])


def change(
    op: str,
    key: str,
    seqno: int,
    value: bytes | None = None,
    *,
    collection: int = 0,
    is_json: bool = True,
    xattrs: dict[str, str] | None = None,
    cas: int | None = None,
) -> tuple[Any, ...]:
    """A walked change of ``key`` at ``seqno`` in vbucket 0 (vb uuid 100), its rev seqno
    ``seqno`` and its CAS ``cas`` (else ``1000 + seqno``), flags and expiry 0, of run
    ``run-1``."""
    vbucket, vb_uuid, rev_seqno, flags, expiry = 0, 100, seqno, 0, 0
    cas = 1000 + seqno if cas is None else cas
    return (
        *(op, key.encode(), value, is_json, xattrs, collection, vbucket, vb_uuid, seqno),
        *(rev_seqno, cas, flags, expiry, "run-1"),
    )


# --- silver: the current state ------------------------------------------------------------


def silver_of(spark: SparkSession, changes: DataFrame, way: str) -> DataFrame:
    """:func:`silver_rows` of ``changes``, by Spark or (``arrow``) by the driver's rule
    (:func:`pipelines.silver.arrow_rows.silver_rows`, over the same rows in Arrow)."""
    if way == "spark":
        return silver_rows(changes)
    walked = changes.withColumn("kind", F.lit("change")).toArrow()
    cids = {r[0] for r in changes.select("collection_id").distinct().collect()}
    found = arrow_rows.silver_rows(walked, cids, dt.datetime.now(dt.UTC))
    assert found is not None
    return spark.createDataFrame(found, schema=schemas.SILVER)


@pytest.mark.parametrize("way", ["spark", "arrow"])
def test_the_newest_change_of_each_key_wins_and_a_deletion_leaves_a_deleted_row(
    spark: SparkSession, way: str
) -> None:
    changes = spark.createDataFrame(
        [
            change("mutation", "a", 1, b'{"v":1}'),
            change("mutation", "a", 5, b'{"v":2}'),
            change("mutation", "b", 2, b'{"v":3}'),
            change("deletion", "b", 6),
            change("mutation", "a", 3, b'{"v":9}', collection=8),  # another collection's "a"
        ],
        CHANGES,
    )
    assert rows(
        silver_of(spark, changes, way),
        *("_collection_id", "key", "doc", "_seqno", "_deleted", "_change"),
    ) == [
        (0, "a", '{"v":2}', 5, False, "upsert"),
        (0, "b", None, 6, True, "delete"),
        (8, "a", '{"v":9}', 3, False, "upsert"),
    ]


@pytest.mark.parametrize("way", ["spark", "arrow"])
def test_a_binary_body_goes_to_doc_binary_and_system_xattrs_are_dropped(
    spark: SparkSession, way: str
) -> None:
    xattrs = {"_sync": "{}", "owner": '"ann"'}
    changes = spark.createDataFrame(
        [change("mutation", "k", 4, b"\x00\x01", is_json=False, xattrs=xattrs)], CHANGES
    )
    assert rows(silver_of(spark, changes, way), "key", "doc", "doc_binary", "xattrs") == [
        ("k", None, bytearray(b"\x00\x01"), {"owner": '"ann"'})
    ]


@pytest.mark.parametrize("way", ["spark", "arrow"])
def test_a_change_is_dated_by_its_cas_clock_and_a_cas_of_0_or_past_2262_has_no_date(
    spark: SparkSession, way: str
) -> None:
    """The CAS's nanoseconds with the counter's 16 bits masked off, to the microsecond."""
    cases = (0, -7, 1700039999999971892)
    changes = spark.createDataFrame(
        [change("mutation", f"k{i}", 1, b"{}", cas=cas) for i, cas in enumerate(cases)], CHANGES
    )
    dated = silver_of(spark, changes, way).select(
        "key", "_cas", F.unix_micros("_modified_at").alias("micros"), "_expiry", "_flags"
    )
    assert rows(dated, "key", "_cas", "micros", "_expiry", "_flags") == [
        ("k0", 0, None, 0, 0),
        ("k1", -7, None, 0, 0),
        ("k2", 1700039999999971892, 1700039999999967, 0, 0),
    ]


def test_a_key_or_json_body_that_is_not_utf8_leaves_the_rows_to_spark(
    spark: SparkSession,
) -> None:
    """Arrow's cast to a string checks UTF-8 where Spark's takes the bytes as they are: the
    driver's rule gives no rows then (its caller appends Spark's), for a key or a JSON body
    that is not UTF-8, and only then."""
    now = dt.datetime.now(dt.UTC)
    bad = b'{"a":"\xff"}'
    op, _, *rest = change("mutation", "k", 1, b"{}")
    for row in (change("mutation", "k", 1, bad), (op, b"k\xff", *rest)):
        walked = spark.createDataFrame([row], CHANGES).withColumn("kind", F.lit("change"))
        assert arrow_rows.silver_rows(walked.toArrow(), {0}, now) is None
    binary = spark.createDataFrame([change("mutation", "k", 1, bad, is_json=False)], CHANGES)
    kept = arrow_rows.silver_rows(binary.withColumn("kind", F.lit("change")).toArrow(), {0}, now)
    assert kept is not None and kept["doc_binary"].to_pylist() == [bad]


# --- silver: rollbacks ----------------------------------------------------------------------

ROLLBACK_POINTS = "p_vb INT, p_seqno LONG"


def test_keys_applied_above_a_rollback_point_roll_back_unless_the_run_itself_wrote_them(
    spark: SparkSession,
) -> None:
    """Vbucket 0 rolls back to seqno 7: ``x`` (seqno 10) is above it and goes back; ``y``
    (5) is below; ``z`` is in vbucket 1, which did not roll back; ``w`` (12) is where this
    run's own changes take it already (an earlier attempt of the run wrote it)."""
    table = spark.createDataFrame(
        [("x", 0, 100, 10), ("y", 0, 100, 5), ("z", 1, 100, 50), ("w", 0, 200, 12)],
        "key STRING, _vbucket INT, _vb_uuid LONG, _seqno LONG",
    )
    points = spark.createDataFrame([(0, 7)], ROLLBACK_POINTS)
    batch = spark.createDataFrame([("w", 200, 12)], "key STRING, _vb_uuid LONG, _seqno LONG")
    assert rows(rolled_back_keys(table, points, batch), "key", "vb", "p_seqno") == [("x", 0, 7)]


def test_a_rollback_abandons_history_above_its_point_and_reopens_what_a_drop_above_it_ended(
    spark: SparkSession,
) -> None:
    """Vbucket 0 rolls back to seqno 7. ``a``'s version 9 is on the abandoned branch; its
    version 3, ended by version 9, is to be recomputed (neither flag); ``b``'s version 4,
    ended by a drop at 8, is open again; ``c``'s versions end below the point: untouched."""
    history = spark.createDataFrame(
        [
            ("a", 0, 100, 3, 9, "change"),
            ("a", 0, 100, 9, None, None),
            ("b", 0, 100, 4, 8, "drop"),
            ("c", 0, 100, 2, 5, "change"),
            ("c", 0, 100, 5, None, None),
        ],
        "key STRING, _vbucket INT, _vb_uuid LONG, _seqno LONG, _valid_to_seqno LONG, "
        "_ended_by STRING",
    )
    points = spark.createDataFrame([(0, 7)], ROLLBACK_POINTS)
    batch = spark.createDataFrame([], "key STRING, _vb_uuid LONG, _seqno LONG")
    assert rows(
        history_fixes(history, points, batch), "key", "_seqno", "_abandoned", "_reopen"
    ) == [
        ("a", 3, False, False),
        ("a", 9, True, False),
        ("b", 4, False, True),
    ]


# --- quality: what bronze implies ----------------------------------------------------------


def test_a_drop_cuts_a_collection_and_a_second_create_flushes_below_it(
    spark: SparkSession,
) -> None:
    system_events = spark.createDataFrame(
        [
            ("system_event", 8, 0, "create_collection", 1),
            ("system_event", 8, 0, "drop_collection", 9),
            ("system_event", 9, 1, "create_collection", 1),
            ("system_event", 9, 1, "create_collection", 5),
            ("system_event", 10, 0, "create_collection", 2),
        ],
        "op STRING, collection_id LONG, vbucket INT, event STRING, seqno LONG",
    )
    assert rows(collection_cuts(system_events), "cid", "vbucket", "dropped", "flush_seqno") == [
        (8, 0, True, None),
        (9, 1, False, 5),
        (10, 0, False, None),
    ]


def test_the_live_documents_bronze_implies(spark: SparkSession) -> None:
    """Per key the newest change counts: ``a`` lives at 4; ``b`` was deleted; ``e`` expired
    in 1970, ``f`` expires in 2100; collection 8 was dropped in vbucket 0; collection 9 was
    flushed at seqno 5 in vbucket 1, so ``g`` (3) is gone and ``h`` (7) lives."""
    alive = spark.createDataFrame(
        [
            ("mutation", 0, b"a", 0, 1, 1, 0),
            ("mutation", 0, b"a", 0, 4, 2, 0),
            ("mutation", 0, b"b", 0, 2, 1, 0),
            ("deletion", 0, b"b", 0, 5, 2, 0),
            ("mutation", 0, b"e", 0, 3, 1, 1),
            ("mutation", 0, b"f", 0, 6, 1, 4102444800),
            ("mutation", 8, b"d", 0, 2, 1, 0),
            ("mutation", 9, b"g", 1, 3, 1, 0),
            ("mutation", 9, b"h", 1, 7, 1, 0),
        ],
        "op STRING, collection_id LONG, key BINARY, vbucket INT, seqno LONG, rev_seqno LONG, "
        "expiration LONG",
    )
    cuts = spark.createDataFrame(
        [(8, 0, True, None), (9, 1, False, 5)],
        "cid LONG, vbucket INT, dropped BOOLEAN, flush_seqno LONG",
    )
    assert rows(bronze_live_documents(alive, cuts), "collection_id", "key", "seqno") == [
        (0, "a", 4),
        (0, "f", 6),
        (9, "h", 7),
    ]


def test_a_seqno_sent_twice_in_a_stream_or_naming_two_changes_is_a_duplicate(
    spark: SparkSession,
) -> None:
    """Seqno 5 comes twice in stream 1; seqno 6 again in stream 2 after a resume, the same
    change (fine); seqno 7 in both streams with different CAS values."""
    frames = spark.createDataFrame(
        [
            ("mutation", 0, b"a", 1, 10, 0, 100, 5, "s", 1),
            ("mutation", 0, b"a", 1, 10, 0, 100, 5, "s", 1),
            ("mutation", 0, b"b", 1, 11, 0, 100, 6, "s", 1),
            ("mutation", 0, b"b", 1, 11, 0, 100, 6, "s", 2),
            ("mutation", 0, b"c", 1, 12, 0, 100, 7, "s", 1),
            ("mutation", 0, b"c", 1, 13, 0, 100, 7, "s", 2),
        ],
        "op STRING, collection_id LONG, key BINARY, rev_seqno LONG, cas LONG, vbucket INT, "
        "in_vb_uuid LONG, seqno LONG, session_id STRING, stream_no INT",
    ).withColumn("session_started_at", F.lit("2024-01-09T13:28:24Z"))
    assert rows(duplicate_seqnos(frames), "stream_no", "seqno", "problem") == [
        (1, 5, "repeated"),
        (1, 5, "repeated"),
        (1, 7, "with different changes"),
        (2, 7, "with different changes"),
    ]
