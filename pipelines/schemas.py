"""Every explicit schema of the Spark jobs, in one place.

The decoded-frame columns come from :data:`dcp_cdc.columnar.ARROW_SCHEMA` (the columnar
decoder's output), converted type by type; the rest is declared here. Arrow schemas for
``mapInArrow`` are derived from the Spark ones so both sides always agree.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import types as T

from dcp_cdc.columnar import ARROW_SCHEMA

_SCALARS: dict[pa.DataType, T.DataType] = {
    pa.int16(): T.ShortType(),
    pa.int32(): T.IntegerType(),
    pa.int64(): T.LongType(),
    pa.bool_(): T.BooleanType(),
    pa.string(): T.StringType(),
    pa.binary(): T.BinaryType(),
    pa.float64(): T.DoubleType(),
}


def spark_type(arrow: pa.DataType) -> T.DataType:
    """The Spark type of an Arrow type of the decoder's schema."""
    if arrow in _SCALARS:
        return _SCALARS[arrow]
    if pa.types.is_map(arrow):
        return T.MapType(spark_type(arrow.key_type), spark_type(arrow.item_type), True)
    if pa.types.is_list(arrow):
        return T.ArrayType(spark_type(arrow.value_type), True)
    if pa.types.is_struct(arrow):
        return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in arrow])
    if pa.types.is_timestamp(arrow):
        return T.TimestampType()
    raise TypeError(f"no Spark type for Arrow {arrow}")


def arrow_type(spark: T.DataType) -> pa.DataType:
    """The Arrow type ``mapInArrow`` must produce for a Spark type."""
    for arrow, candidate in _SCALARS.items():
        if candidate == spark:
            return arrow
    if isinstance(spark, T.MapType):
        return pa.map_(arrow_type(spark.keyType), arrow_type(spark.valueType))
    if isinstance(spark, T.ArrayType):
        return pa.list_(arrow_type(spark.elementType))
    if isinstance(spark, T.StructType):
        return pa.struct([pa.field(f.name, arrow_type(f.dataType)) for f in spark.fields])
    if isinstance(spark, T.TimestampType):
        return pa.timestamp("us", tz="UTC")
    raise TypeError(f"no Arrow type for Spark {spark}")


def arrow_schema(schema: T.StructType) -> pa.Schema:
    return pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in schema.fields])


def projection(schema: T.StructType, *names: str) -> list[T.StructField]:
    """Some of ``schema``'s fields, by name, in the order given (for a frame that holds a
    projection of a table)."""
    return [schema[name] for name in names]


def _fields(*pairs: tuple[str, T.DataType]) -> list[T.StructField]:
    return [T.StructField(name, dtype, True) for name, dtype in pairs]


DECODED = T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in ARROW_SCHEMA])
"""One row per frame, as :func:`dcp_cdc.columnar.decode_batch` gives it."""

LINEAGE = _fields(
    ("bucket", T.StringType()),
    ("session_started_at", T.StringType()),
    ("session_id", T.StringType()),
    ("file", T.StringType()),
    ("file_sequence", T.IntegerType()),
    ("frame_index", T.LongType()),
)
"""Where a frame came from: ``offset`` (a decoded column) is its byte offset in ``file``.
Session order is (``session_started_at``, ``session_id``, ``file_sequence``, ``offset``)."""

ERROR = _fields(
    ("error_reason", T.StringType()),
    ("error_expected", T.StringType()),
    ("error_got", T.StringType()),
    ("error_frame_length", T.LongType()),
    ("error_truncated", T.BooleanType()),
    ("error_raw_length", T.LongType()),
)

DECODE_OUTPUT = T.StructType([*DECODED.fields, *LINEAGE, *ERROR])
"""Frames and ``op = 'error'`` rows for the quarantine: what the quarantine's decode tasks
emit (only the error rows)."""

SESSION_ORDER = _fields(
    ("in_snapshot_start", T.LongType()),
    ("in_snapshot_end", T.LongType()),
    ("in_snapshot_flags", T.LongType()),
    ("in_oso", T.BooleanType()),
    ("in_vb_uuid", T.LongType()),
)
"""Derived from session order: the snapshot (or OSO backfill) a frame arrived in and the vb
uuid in force (entry 0 of the last failover log of its stream)."""

RUN = _fields(("ingest_run_id", T.StringType()), ("ingested_at", T.TimestampType()))

EVENTS = T.StructType([*DECODED.fields, *SESSION_ORDER, *LINEAGE, *RUN])
"""``bronze.<bucket>_events``."""

DECODED_EVENTS = T.StructType([*DECODED.fields, *SESSION_ORDER, *LINEAGE])
"""What the events' decode tasks emit: the events but for the run columns."""

SCAN = T.StructType(
    _fields(
        ("file", T.StringType()),
        ("vb_key", T.LongType()),
        ("has_snapshot", T.BooleanType()),
        ("snapshot_start", T.LongType()),
        ("snapshot_end", T.LongType()),
        ("snapshot_flags", T.LongType()),
        ("snapshot_oso", T.BooleanType()),
        ("vb_uuid", T.LongType()),
    )
)
"""Per file and stream (vb_key) it changes: the state its last snapshot marker, OSO marker or
stream-request response set (``has_snapshot``), and the vb uuid of its last failover log."""

QUARANTINE = T.StructType(
    _fields(
        ("bucket", T.StringType()),
        ("session_id", T.StringType()),
        ("file", T.StringType()),
        ("file_sequence", T.IntegerType()),
        ("offset", T.LongType()),
        ("opcode", T.ShortType()),
        ("reason", T.StringType()),
        ("expected", T.StringType()),
        ("got", T.StringType()),
        ("frame_length", T.LongType()),
        ("truncated", T.BooleanType()),
        ("raw", T.BinaryType()),
        ("raw_length", T.LongType()),
    )
    + RUN
)
"""``bronze.<bucket>_quarantine``: malformed frames and cut tails, raw bytes bounded."""

INGEST_LOG = T.StructType(
    _fields(
        ("run_version", T.LongType()),
        ("ingest_run_id", T.StringType()),
        ("status", T.StringType()),
        ("file", T.StringType()),
        ("size", T.LongType()),
        ("modified_ms", T.LongType()),
        ("session_id", T.StringType()),
        ("file_sequence", T.IntegerType()),
        ("frames", T.LongType()),
        ("errors", T.LongType()),
        ("end_state", T.StringType()),
        ("message", T.StringType()),
        ("logged_at", T.TimestampType()),
        ("digest", T.StringType()),  # last: added so to a log from before it
    )
)
"""``bronze.<bucket>_ingest_log``: ``planned`` (with the ``size`` and ``digest`` of the bytes
planned, and the stream state the file ends in) then ``ingested`` per file and run;
``changed`` when a file ingested before is found with another size or time. A planned file
whose bytes changed (``changed``) or that vanished (``missing``) before the run wrote it is
left out of the run, with a ``message``; the run's closing rows are appended in one commit.
``lost``: a session's sequence declared lost (``dcp-cdc landing skip``; ``file`` names the
session and sequence), past which ingest goes on."""

FILES = T.StructType(
    _fields(
        ("path", T.StringType()),
        ("bucket", T.StringType()),
        ("session_started_at", T.StringType()),
        ("session_id", T.StringType()),
        ("file_sequence", T.IntegerType()),
        ("collections", T.BooleanType()),
        ("header_length", T.LongType()),
        ("size", T.LongType()),
        ("carry", T.StringType()),
    )
)
"""The files a run decodes: one row each, the input of the decode tasks. ``carry`` is the
state of the session's streams before the file (JSON ``{vb_key: [start, end, flags, oso,
vb_uuid]}``, as in the ingest log's ``end_state``)."""

WRITTEN = T.StructType(
    _fields(
        ("path", T.StringType()),
        ("size", T.LongType()),
        ("modification_time", T.LongType()),
        ("num_records", T.LongType()),
        ("stats", T.StringType()),
    )
)
"""A Parquet file a decode task wrote into a table's folder (:mod:`pipelines.bronze.writer`):
its path relative to the table, size, time (ms), rows and Delta statistics (JSON), what its
``add`` action carries when the driver commits it."""

QUALITY_RESULTS = T.StructType(
    _fields(
        ("run_id", T.StringType()),
        ("bucket", T.StringType()),
        ("suite", T.StringType()),
        ("expectation", T.StringType()),
        ("expectation_type", T.StringType()),
        ("severity", T.StringType()),
        ("success", T.BooleanType()),
        ("observed_value", T.StringType()),
        ("unexpected_count", T.LongType()),
        ("element_count", T.LongType()),
        ("examples", T.StringType()),
        ("checked_at", T.TimestampType()),
    )
)
"""``quality.<bucket>_results``: one row per expectation and run; ``examples`` is a JSON
array of failing rows (their ``where`` label and what is wrong there)."""

CHECK_STATE = T.StructType(_fields(("kind", T.StringType()), ("row", T.StringType())))
"""``quality.<bucket>_check_state``: what a check carries to the next one
(:mod:`pipelines.quality.carry`), one JSON row per record, ``kind`` naming its frame."""

CHECK_COLUMNS = T.StructType(_fields(("kind", T.StringType()), ("body", T.BinaryType())))
"""``quality.<bucket>_check_columns``: what a columnar check carries to the next
(:mod:`pipelines.quality.small.carried`), one row per record kind, its ``body`` JSON or an
Arrow IPC stream."""

HELD_BACK_METRICS = T.StructType(
    _fields(
        ("where", T.StringType()),
        ("session_id", T.StringType()),
        ("missing_sequence", T.LongType()),
        ("held_back_files", T.LongType()),
        ("held_back_bytes", T.LongType()),
        ("held_back_s", T.DoubleType()),
        ("held_back_overdue", T.LongType()),
        ("held_back_detail", T.StringType()),
    )
)
"""The ``landing_continuity`` metric frame
(:func:`pipelines.quality.suites.held_back_rows`): one row per capture session."""

SILVER = T.StructType(
    [
        T.StructField("key", T.StringType(), False),
        T.StructField("doc", T.StringType()),
        T.StructField("doc_binary", T.BinaryType()),
        T.StructField("xattrs", T.MapType(T.StringType(), T.StringType())),
        T.StructField("_collection_id", T.LongType()),
        T.StructField("_vbucket", T.IntegerType()),
        T.StructField("_vb_uuid", T.LongType()),
        T.StructField("_seqno", T.LongType()),
        T.StructField("_rev_seqno", T.LongType()),
        T.StructField("_cas", T.LongType()),
        T.StructField("_flags", T.LongType()),
        T.StructField("_expiry", T.LongType()),
        T.StructField("_deleted", T.BooleanType()),
        T.StructField("_change", T.StringType()),
        T.StructField("_applied_at", T.TimestampType()),
        T.StructField("_ingest_run_id", T.StringType()),
        T.StructField("_modified_at", T.TimestampType()),
    ]
)
"""A silver collection table (``..._all``); the user-facing view drops tombstones and expired.
``_modified_at`` is when the change happened in Couchbase, by its CAS
(:func:`dcp_cdc.protocol.cas_time`), ``_applied_at`` when silver applied it. Columns added
after a first release come last: a table of an earlier version gains them at its end."""

HISTORY = T.StructType(
    [
        *(f for f in SILVER.fields if f.name not in ("_applied_at", "_ingest_run_id")),
        T.StructField("_valid_to_seqno", T.LongType()),
        T.StructField("_valid_to", T.TimestampType()),
        T.StructField("_ended_by", T.StringType()),
        T.StructField("_applied_at", T.TimestampType()),
        T.StructField("_ingest_run_id", T.StringType()),
    ]
)
"""A collection's history (``..._history``, SCD type 2): one row per version of a document,
valid from its ``_seqno`` / ``_modified_at`` to ``_valid_to_seqno`` / ``_valid_to`` (null while
it is the current version). ``_change`` is ``insert``, ``update``, ``delete`` or ``expire``;
``_ended_by`` what ended it: ``change`` (the key's next version), ``drop`` or ``flush`` of the
collection, null while current."""

HISTORY_CHAIN = ("_change", "_valid_to_seqno", "_valid_to", "_ended_by")
"""The columns of a history row that a later version, a drop or a rollback can change."""

DOCUMENT_VARIANT = "doc_variant"
"""The companion column ``[silver] document_variant`` adds to a silver collection table:
``doc`` as a VARIANT (``try_parse_json(doc)``), null where ``doc`` is (binary documents,
tombstones) or is not JSON."""

SILVER_VARIANT = T.StructType([*SILVER.fields, T.StructField(DOCUMENT_VARIANT, T.VariantType())])
"""A silver collection table with the companion column :data:`DOCUMENT_VARIANT` (last)."""

PENDING = T.StructType([*SILVER.fields, T.StructField("_batch", T.LongType(), False)])
"""``silver.<bucket>__pending``, the live layer (``[silver] live_layer``): the rows the applies
since the last compaction chose for every collection of the bucket (the collection is
``_collection_id``), each with its append's random 63-bit stamp (``_batch``): a key's newest
row there, if newer than its row in the collection table, is what the collection's view
shows."""

PENDING_PARTITIONS = ("_batch",)
"""The pending table is partitioned by its appends' stamps: an append writes a partition of its
own, and a compaction removes the partitions it merged (a DELETE of whole files), which no
append committed meanwhile conflicts with."""

REGISTRY = T.StructType(
    [
        T.StructField("collection_id", T.LongType()),
        T.StructField("scope_id", T.LongType()),
        T.StructField("scope", T.StringType()),
        T.StructField("name", T.StringType()),
        T.StructField("table_name", T.StringType()),
        T.StructField("max_ttl", T.LongType()),
        T.StructField("history", T.BooleanType()),
        T.StructField("created_uid", T.LongType()),
        T.StructField("dropped_uid", T.LongType()),
        T.StructField("create_seqnos", T.MapType(T.IntegerType(), T.LongType())),
        T.StructField("drop_seqnos", T.MapType(T.IntegerType(), T.LongType())),
        T.StructField("flush_seqnos", T.MapType(T.IntegerType(), T.LongType())),
        T.StructField("status", T.StringType()),
        T.StructField("updated_at", T.TimestampType()),
        T.StructField("renamed_from", T.StringType()),
    ]
)
"""``silver.<bucket>__collections``: ``renamed_from`` is the collection's former name while
its tables are being renamed (a collection registered before its create event was seen, as
``_unknown.collection_<id>``, takes its name when the event arrives; only a killed run leaves
it set, and the next run finishes the renames). ``status`` is live, dropped (not yet in every vbucket),
retiring (its drop reached every vbucket: its tables are being archived or dropped; only a
killed run leaves it so, and the next run finishes the retire) or retired (its tables
archived or dropped)."""

STATE = T.StructType(
    [
        T.StructField("vbucket", T.IntegerType()),
        T.StructField("vb_uuid", T.LongType()),
        T.StructField("failover_log", DECODED["failover_log"].dataType),
        T.StructField("last_applied_seqno", T.LongType()),
        T.StructField("consistent_seqno", T.LongType()),
        T.StructField("manifest_uid", T.LongType()),
        T.StructField("purge_seqno", T.LongType()),
        T.StructField("open_snapshot_start", T.LongType()),
        T.StructField("open_snapshot_end", T.LongType()),
        T.StructField("position_run_id", T.StringType()),
        T.StructField("state", T.StringType()),
        T.StructField("updated_at", T.TimestampType()),
    ]
)
"""``silver.<bucket>__stream_state``: per vbucket, where silver stands."""

WALKED = T.StructType(
    [
        # change | ended_change | system_event | rollback | state
        T.StructField("kind", T.StringType()),
        T.StructField("vbucket", T.IntegerType()),
        T.StructField("frames", T.LongType()),
        T.StructField("ignored", T.LongType()),
        T.StructField("state", T.StringType()),
        T.StructField("position_run_id", T.StringType()),
        # on the state row: a frame of a run finished after the walk's ``late_after`` sorts at
        # or before the vbucket's saved position (files of an older session arrived late)
        T.StructField("late", T.BooleanType()),
        T.StructField("rollback_seqno", T.LongType()),
        T.StructField("op", T.StringType()),
        T.StructField("event", T.StringType()),
        T.StructField("collection_id", T.LongType()),
        T.StructField("scope_id", T.LongType()),
        T.StructField("name", T.StringType()),
        T.StructField("manifest_uid", T.LongType()),
        T.StructField("max_ttl", T.LongType()),
        T.StructField("history", T.BooleanType()),
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("is_json", T.BooleanType()),
        T.StructField("xattrs", T.MapType(T.StringType(), T.StringType())),
        T.StructField("by_seqno", T.LongType()),
        T.StructField("rev_seqno", T.LongType()),
        T.StructField("cas", T.LongType()),
        T.StructField("flags", T.LongType()),
        T.StructField("expiration", T.LongType()),
        T.StructField("in_vb_uuid", T.LongType()),
        T.StructField("ingest_run_id", T.StringType()),
        # on the state row: the vbucket's versions summed up (pipelines.silver.walk_summary)
        T.StructField("change_keys", T.MapType(T.LongType(), T.LongType())),
        T.StructField("version_collections", T.ArrayType(T.LongType())),
        T.StructField("cas_count", T.LongType()),
        T.StructField("cas_sum", T.DoubleType()),
        T.StructField("cas_points", T.ArrayType(T.DoubleType())),
    ]
)

PURGES = T.StructType(
    [
        T.StructField("table_name", T.StringType()),
        T.StructField("vbucket", T.IntegerType()),
        T.StructField("purged_through_seqno", T.LongType()),
        T.StructField("purged_at", T.TimestampType()),
    ]
)
"""``silver.<bucket>__tombstone_purges``: per table and vbucket, the highest seqno of a
tombstone the maintenance purge removed. A change at or below it for a key the table no
longer has is refused: it is older than a deletion that was purged (no resurrection)."""
