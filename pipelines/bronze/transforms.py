"""Pure DataFrame → DataFrame steps of the bronze ingest (no reads, no writes).

The decode tasks (pipelines/bronze/decode.py) already give every frame its lineage and its
session-order state; what is left here is the shape of the two tables.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import schemas


def vb_key() -> Column:
    """The stream a frame belongs to: the vbucket of a request, the opaque of a response
    (a consumer sets each stream request's opaque to its vbucket, docs/protocol/capture-format.md). The
    decode tasks key session order the same way (pipelines/bronze/decode.py)."""
    return F.when(F.col("status").isNotNull(), F.col("opaque").cast("int")).otherwise(
        F.col("vbucket")
    )


def events(frames: DataFrame, run_id: str, ingested_at: Column) -> DataFrame:
    """The rows of ``bronze.<bucket>_events`` from the decoded events (``DECODED_EVENTS``)."""
    run = {"ingest_run_id": F.lit(run_id), "ingested_at": ingested_at}
    return frames.select(
        [run.get(f.name, F.col(f.name)).cast(f.dataType).alias(f.name) for f in schemas.EVENTS]
    )


def quarantine(frames: DataFrame, run_id: str, ingested_at: Column) -> DataFrame:
    """The rows of ``bronze.<bucket>_quarantine`` from decoded ``op = 'error'`` rows."""
    return frames.where(F.col("op") == "error").select(
        "bucket",
        "session_id",
        "file",
        "file_sequence",
        "offset",
        "opcode",
        F.col("error_reason").alias("reason"),
        F.col("error_expected").alias("expected"),
        F.col("error_got").alias("got"),
        F.col("error_frame_length").alias("frame_length"),
        F.col("error_truncated").alias("truncated"),
        "raw",
        F.col("error_raw_length").alias("raw_length"),
        F.lit(run_id).alias("ingest_run_id"),
        ingested_at.alias("ingested_at"),
    )
