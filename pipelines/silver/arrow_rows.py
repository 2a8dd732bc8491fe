"""Silver's rows of a walk the driver did, in Arrow: the rule of
:func:`pipelines.silver.transforms.silver_rows` (the newest change per collection and key, in the
silver table's columns) over the walk's Arrow table, with no Spark job. What an apply appends to
the live layer from the driver (:func:`pipelines.silver.live.append_from_driver`);
tests/spark/test_transform_rules.py holds both ways to the same rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.protocol import HLC_COUNTER_MASK
from pipelines import schemas
from pipelines.silver.walk import CHANGE_OF, RowKind


def silver_rows(
    walked: pa.Table, collections: Collection[int], applied_at: dt.datetime
) -> pa.Table | None:
    """The walked ``change`` rows of ``collections`` (the walk's rows, :data:`schemas.WALKED`)
    as silver rows (:data:`schemas.SILVER`), the newest change per collection and key (by
    ``by_seqno``, then ``rev_seqno``), stamped ``applied_at``. None when a key or a JSON
    document is not UTF-8, which Arrow's cast refuses where Spark's takes the bytes as they
    are: the caller takes Spark's way then."""
    changes = walked.filter(
        pc.and_(
            pc.equal(walked["kind"], RowKind.CHANGE.value),
            pc.is_in(walked["collection_id"], pa.array(sorted(collections), pa.int64())),
        )
    )
    newest = _newest_per_key(changes)
    try:
        return _columns(newest, applied_at)
    except pa.ArrowInvalid:  # not UTF-8
        return None


def _newest_per_key(changes: pa.Table) -> pa.Table:
    """One row per ``(collection_id, key)``: the highest ``by_seqno``, then ``rev_seqno``."""
    if changes.num_rows == 0:
        return changes
    order = pc.sort_indices(
        changes,
        sort_keys=[
            ("collection_id", "ascending"),
            ("key", "ascending"),
            ("by_seqno", "descending"),
            ("rev_seqno", "descending"),
        ],
    )
    ordered = changes.take(order)
    cids, keys = ordered["collection_id"], ordered["key"]
    first = pc.or_(
        pc.not_equal(cids[1:], cids[:-1]),
        pc.not_equal(keys[1:], keys[:-1]),
    )
    mask = pa.concat_arrays([pa.array([True]), *pc.fill_null(first, True).chunks])
    return ordered.filter(mask)


def _columns(changes: pa.Table, applied_at: dt.datetime) -> pa.Table:
    """:func:`pipelines.silver.transforms.version_rows`' columns, one row per change."""
    target = schemas.arrow_schema(schemas.SILVER)
    n = changes.num_rows
    op = changes["op"]
    deleted = pc.not_equal(op, "mutation")
    kept = pc.invert(deleted)
    is_json = changes["is_json"]
    value = changes["value"]
    null_binary = pa.nulls(n, pa.binary())
    json_doc = pc.and_kleene(kept, is_json)
    binary_doc = pc.and_kleene(kept, pc.invert(is_json))
    mask = ~HLC_COUNTER_MASK
    cas = changes["cas"]
    micros = pc.divide(pc.bit_wise_and(cas, pa.scalar(mask, pa.int64())), 1000)
    columns = {
        "key": pc.cast(changes["key"], pa.string()),
        "doc": pc.cast(pc.if_else(json_doc, value, null_binary), pa.string()),
        "doc_binary": pc.if_else(binary_doc, value, null_binary),
        "xattrs": _user_xattrs(changes["xattrs"], kept, target.field("xattrs").type),
        "_collection_id": changes["collection_id"],
        "_vbucket": changes["vbucket"],
        "_vb_uuid": changes["in_vb_uuid"],
        "_seqno": changes["by_seqno"],
        "_rev_seqno": changes["rev_seqno"],
        "_cas": cas,
        "_flags": pc.fill_null(changes["flags"], 0),
        "_expiry": pc.fill_null(changes["expiration"], 0),
        "_deleted": deleted,
        "_change": pa.array([CHANGE_OF.get(o) for o in op.to_pylist()], pa.string()),
        "_applied_at": pa.repeat(pa.scalar(applied_at, target.field("_applied_at").type), n),
        "_ingest_run_id": changes["ingest_run_id"],
        "_modified_at": pc.if_else(
            pc.greater(cas, 0),
            pc.cast(micros, pa.timestamp("us")).cast(target.field("_modified_at").type),
            pa.nulls(n, target.field("_modified_at").type),
        ),
    }
    return pa.table([columns[f.name] for f in target], schema=target)


def _user_xattrs(xattrs: pa.ChunkedArray, kept: pa.ChunkedArray, dtype: pa.DataType) -> pa.Array:
    """A kept change's extended attributes but the system ones (names starting ``_``); null
    for a deletion, as Spark's ``map_filter`` under ``when``."""
    out: list[list[tuple[str, str]] | None] = []
    for pairs, keep in zip(xattrs.to_pylist(), kept.to_pylist(), strict=True):
        if not keep or pairs is None:
            out.append(None)
        else:
            out.append([(k, v) for k, v in pairs if not k.startswith("_")])
    return pa.array(out, dtype)
