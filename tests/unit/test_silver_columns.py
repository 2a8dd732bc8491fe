"""The columnar check's overlay of the live layer's pending rows on a collection's ``_all``
rows gives the rows of the row rule (pipelines.silver.rows_read.overlay), on random tables,
pending rows and purge marks."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from pipelines.lake.delta_rs import spark_rows
from pipelines.quality.silver_side import ROWS_COLUMNS
from pipelines.quality.small.silver_columns import READ_COLUMNS, _field, view_rows
from pipelines.silver.rows_read import overlay
from pipelines.tables import all_rows

VIEW = "silver.b__c"
SCHEMA = pa.schema([_field(c) for c in READ_COLUMNS])


def _row(rng: random.Random, key: str, cid: int) -> dict[str, Any]:
    return {
        "_collection_id": cid,
        "_vbucket": rng.randrange(4),
        "_vb_uuid": rng.choice([None, 7, 9]),
        "_seqno": rng.choice([None, *range(1, 40)]) if rng.random() < 0.1 else rng.randrange(1, 40),
        "key": key,
        "_deleted": rng.random() < 0.2,
        "_expiry": rng.choice([0, 0, 0, 5, None]),
        "_rev_seqno": rng.choice([None, 1, 2, 3]),
    }


def _sorted(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(repr(sorted({c: r[c] for c in (*ROWS_COLUMNS, "table")}.items())) for r in rows)


@pytest.mark.parametrize("seed", range(40))
def test_the_overlay_over_columns_gives_the_rows_of_the_row_rule(seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(30)]
    table_rows = [_row(rng, k, 8) for k in rng.sample(keys, 20)]
    pending = [_row(rng, rng.choice(keys), rng.choice([8, 8, 8, 9])) for _ in range(25)]
    purges = [
        {
            "table_name": all_rows(VIEW),
            "vbucket": v,
            "purged_through_seqno": rng.choice([None, 10, 30]),
        }
        for v in rng.sample(range(4), rng.randrange(3))
    ]
    purges.append({"table_name": "silver.other_all", "vbucket": 0, "purged_through_seqno": 99})
    table = pa.Table.from_pylist(table_rows, schema=SCHEMA)
    pending_table = pa.Table.from_pylist(pending, schema=SCHEMA)
    ours = spark_rows(view_rows(table, VIEW, 8, pending_table, purges))
    theirs = overlay(spark_rows(table), VIEW, 8, pending, purges, ROWS_COLUMNS)
    assert _sorted(ours) == _sorted(theirs)


def test_without_pending_rows_the_table_rows_are_the_view_rows() -> None:
    rng = random.Random(1)
    rows = [_row(rng, f"k{i}", 8) for i in range(5)]
    found = spark_rows(
        view_rows(pa.Table.from_pylist(rows, schema=SCHEMA), VIEW, 8, SCHEMA.empty_table(), [])
    )
    assert _sorted(found) == _sorted([{**r, "table": VIEW} for r in rows])
