"""The decode tasks of the bronze ingest: capture files in, Arrow batches of frames out.

Runs inside Spark executors through ``mapInArrow``: one input row per capture file, read in
chunks of ``chunk_bytes`` so that a file larger than a task's memory streams through. Each chunk
goes through the columnar decoder once; malformed frames and cut tails become ``op = 'error'``
rows for the quarantine. No Spark import here: it is plain pyarrow and unit-testable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from dcp_cdc.columnar import decode_batch
from dcp_cdc.config import is_uri
from dcp_cdc.errors import MalformedFrameError, TruncatedFrameError

MAX_ROWS_PER_BATCH = 65536


def open_input(location: str) -> BinaryIO:
    """A binary reader for a local path or a filesystem URI (``s3a://`` is read as ``s3://``)."""
    if not is_uri(location) or location.startswith("file:"):
        return open(location.removeprefix("file://").removeprefix("file:"), "rb")
    uri = "s3://" + location[len("s3a://") :] if location.startswith("s3a://") else location
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs.open_input_stream(path)  # type: ignore[no-any-return]


def _error_row(
    error: MalformedFrameError, file: dict[str, Any], raw: bytes, raw_length: int
) -> dict[str, Any]:
    return {
        "op": "error", "offset": error.offset, "opcode": error.opcode,
        "bucket": file["bucket"], "session_id": file["session_id"], "file": file["path"],
        "file_sequence": file["file_sequence"], "error_reason": error.reason,
        "error_expected": error.expected, "error_got": error.got,
        "error_frame_length": error.frame_length,
        "error_truncated": isinstance(error, TruncatedFrameError), "raw": raw,
        "error_raw_length": raw_length,
    }  # fmt: skip


def decode_file(
    file: dict[str, Any], schema: pa.Schema, *, chunk_bytes: int, raw_limit: int
) -> Iterator[pa.RecordBatch]:
    """Every frame of one capture file, in order, as batches of ``schema``."""
    path = file["path"]
    position = file["header_length"]  # file offset of buf[0]
    frames_before = 0
    tail = b""
    with open_input(path) as fh:
        fh.read(position)
        while True:
            chunk = fh.read(chunk_bytes)
            final = not chunk
            buf = tail + chunk
            if not buf:
                return
            batch = decode_batch(buf, collections=file["collections"], base_offset=position,
                                 final=final, file=path)  # fmt: skip
            errors = [
                _error_row(e, file, buf[e.offset - position : e.offset - position + min(
                    e.frame_length or 0, raw_limit)], e.frame_length or 0)
                for e in batch.errors
            ]  # fmt: skip
            stop = batch.fatal is not None and (
                final or not isinstance(batch.fatal, TruncatedFrameError)
            )
            if stop:
                assert batch.fatal is not None
                start = batch.fatal.offset - position
                rest = len(buf) - start
                if not final:  # the rest of the file cannot be framed: one record for all of it
                    rest = file["size"] - batch.fatal.offset
                errors.append(_error_row(batch.fatal, file, buf[start : start + raw_limit], rest))
            table = _with_lineage(batch.table, file, errors, frames_before, schema)
            frames_before += batch.table.num_rows + len(batch.errors)
            yield from table.to_batches(max_chunksize=MAX_ROWS_PER_BATCH)
            if errors:
                yield from pa.Table.from_pylist(errors, schema=schema).to_batches()
            if stop or final:
                return
            tail = buf[batch.consumed :]
            position += batch.consumed


def _with_lineage(
    decoded: pa.Table,
    file: dict[str, Any],
    errors: list[dict[str, Any]],
    frames_before: int,
    schema: pa.Schema,
) -> pa.Table:
    n = decoded.num_rows
    offsets = decoded.column("offset").to_numpy()
    error_offsets = np.array(sorted(e["offset"] for e in errors if e["error_frame_length"]),
                             dtype=np.int64)  # fmt: skip
    # frame index in the file counts malformed frames too (they are frames of the session)
    index = frames_before + np.arange(n, dtype=np.int64) + np.searchsorted(error_offsets, offsets)
    for e in errors:  # a malformed frame with a known boundary is a frame too: index it
        if e["error_frame_length"]:
            rank = int(np.searchsorted(error_offsets, e["offset"]))
            e["frame_index"] = frames_before + int(np.searchsorted(offsets, e["offset"])) + rank
    columns: dict[str, pa.Array] = {name: decoded.column(name) for name in decoded.column_names}
    columns["bucket"] = _constant(file["bucket"], n)
    columns["session_id"] = _constant(file["session_id"], n)
    columns["session_started_at"] = _constant(file["session_started_at"] or "", n)
    columns["file"] = _constant(file["path"], n)
    columns["file_sequence"] = pa.array(np.full(n, file["file_sequence"], dtype=np.int32))
    columns["frame_index"] = pa.array(index)
    arrays = [
        columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _constant(text: str, n: int) -> pa.Array:
    indices = pa.array(np.zeros(n, dtype=np.int32))
    return pa.DictionaryArray.from_arrays(indices, pa.array([text])).cast(pa.string())


def decode_files(
    batches: Iterator[pa.RecordBatch], schema: pa.Schema, *, chunk_bytes: int, raw_limit: int
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: rows of file descriptors in, frames out."""
    for batch in batches:
        for file in batch.to_pylist():
            yield from decode_file(file, schema, chunk_bytes=chunk_bytes, raw_limit=raw_limit)
