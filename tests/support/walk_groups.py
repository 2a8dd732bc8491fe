"""The tables silver's walk gets, without Spark: one per vbucket, as ``walk_frames`` hands them
to ``applyInArrow`` (the walked columns with Spark's types, ``vb_key`` first, the vbucket's
``saved_state``, ``late_after`` and ``read_through`` last, in record batches), built from
frame dicts or from capture files decoded as bronze decodes them. For the walk's tests and
its benchmark (``benchmarks/walk.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines import schemas
from pipelines.bronze.decode import decode_file
from pipelines.bronze.landing import list_captures, read_header
from pipelines.bronze.tasks import file_row
from pipelines.silver.transforms import WALK_COLUMNS, WALK_OPS

ARROW_BATCH_ROWS = 10_000
"""Rows of a record batch Spark hands a Python function (``maxRecordsPerBatch``'s default)."""

_EVENTS = schemas.arrow_schema(schemas.EVENTS)
_TYPES = {f.name: f.type for f in _EVENTS} | {"run_version": pa.int64()}
GROUP_SCHEMA = pa.schema(
    [
        ("vb_key", pa.int32()),
        *[(name, _TYPES[name]) for name in WALK_COLUMNS],
        ("saved_state", pa.string()),
        ("late_after", pa.int64()),
        ("read_through", pa.int64()),
    ]
)
"""The columns of a vbucket's group, as ``walk_frames`` selects them."""


def group_table(
    rows: Sequence[Mapping[str, Any]],
    batch_rows: Sequence[int] = (ARROW_BATCH_ROWS,),
    *,
    offset: int = 0,
    garbage: int | None = None,
) -> pa.Table:
    """A group from frame dicts (a column a dict lacks is null), cut into record batches of
    ``batch_rows`` rows in turn (the last size repeats). ``offset``: the arrays start that far
    into their buffers (as slices of a larger batch do); ``garbage``: what integer columns hold
    under their nulls (Arrow leaves those bytes undefined; pyarrow writes 0)."""
    table = pa.Table.from_pylist([{}] * offset + [dict(r) for r in rows], schema=GROUP_SCHEMA)
    if garbage is not None:
        table = pa.Table.from_arrays(
            [_garbage(c.combine_chunks(), garbage) for c in table.columns], schema=GROUP_SCHEMA
        )
    table = table.slice(offset)
    batches, at, i = [], 0, 0
    while at < table.num_rows:
        size = max(1, batch_rows[min(i, len(batch_rows) - 1)])
        batches.extend(table.slice(at, size).to_batches())
        at, i = at + size, i + 1
    return pa.Table.from_batches(batches, schema=GROUP_SCHEMA)


def _garbage(array: pa.Array, value: int) -> pa.Array:
    """``array`` with ``value`` (or its type's largest) under its nulls, if it is of integers."""
    if not pa.types.is_integer(array.type) or not array.null_count:
        return array
    validity, data = array.buffers()
    values = np.frombuffer(data, dtype=array.type.to_pandas_dtype()).copy()
    values[: len(array)][np.asarray(array.is_null())] = min(value, np.iinfo(values.dtype).max)
    return pa.Array.from_buffers(array.type, len(array), [validity, pa.py_buffer(values)])


def groups_from_captures(landing: Path, run_id: str = "run-1") -> list[pa.Table]:
    """Every capture file under ``landing`` decoded as bronze decodes it, the events of one
    ingest run (``run_id``, version 1), cut into the groups the walk gets, a fresh state each."""
    found, _ = list_captures(str(landing))
    files = sorted(
        (read_header(f) for f in found),
        key=lambda f: (f.started_at, f.session_id, f.file_sequence),
    )
    batches: list[pa.RecordBatch] = []
    for f in files:
        batches.extend(
            decode_file(file_row(f), _EVENTS, chunk_bytes=64 << 20, raw_limit=256, errors=False)
        )
    events = pa.Table.from_batches(batches, schema=_EVENTS)
    events = events.filter(pc.is_in(events["op"], pa.array(WALK_OPS)))
    n = events.num_rows
    vb_key = pc.if_else(
        pc.is_valid(events["status"]), pc.cast(events["opaque"], pa.int32()), events["vbucket"]
    )
    run = {
        "ingest_run_id": pa.array([run_id] * n, pa.string()),
        "run_version": pa.array(np.ones(n, dtype=np.int64)),
    }
    columns = [
        vb_key,
        *[run[name] if name in run else events[name] for name in WALK_COLUMNS],
        pa.nulls(n, pa.string()),
        pa.nulls(n, pa.int64()),
        pa.array(np.ones(n, dtype=np.int64)),  # the one run, the newest read
    ]
    table = pa.Table.from_arrays(columns, schema=GROUP_SCHEMA)
    keys = vb_key.to_numpy()
    return [  # each group in batches of its own, as Spark sends a group
        pa.Table.from_batches(
            table.filter(pa.array(keys == vb))
            .combine_chunks()
            .to_batches(max_chunksize=ARROW_BATCH_ROWS)
        )
        for vb in np.unique(keys)
    ]
