"""The decode tasks of the bronze ingest: capture files in, Arrow batches of frames out.

Runs inside Spark executors through ``mapInArrow``: one input row per capture file, read in
chunks of ``chunk_bytes`` so that a file larger than a task's memory streams through, and each
batch decompresses at most ``chunk_bytes`` of Snappy values (:data:`MEMORY_PER_CHUNK`). Each
chunk goes through the columnar decoder once; malformed frames and cut tails become ``op = 'error'``
rows for the quarantine, and the file ends with one ``op = 'file_summary'`` row (its counts).

Session order is computed here too, since a file's frames are decoded in order: each frame
gets the stream state in force at it (:class:`SessionOrder`), starting from the state the
session's earlier files left (``carry``, worked out by the driver from :func:`scan_file` of
those files). A scan reads a file's framing and decodes only the frames that change a
stream's state, so the driver knows every file's end state before any event is written.

No Spark import here: it is plain pyarrow and numpy, and unit-testable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.columnar import decode_batch, decode_frames, frame_starts, keep_freed_memory
from dcp_cdc.errors import MalformedFrameError, TruncatedFrameError
from dcp_cdc.protocol import Opcode
from pipelines.bronze.landing import gone, open_input
from pipelines.errors import LandingChangedError

MAX_ROWS_PER_BATCH = 65536
MEMORY_PER_CHUNK = 8
"""A decode task's memory peaks under this many times ``chunk_bytes`` (or times its largest
Snappy value, at most 64 MiB, when that is larger): a batch decompresses at most
``chunk_bytes`` of values (:func:`dcp_cdc.columnar.decode_batch`'s ``max_expanded``), and its
buffer, those values and the Arrow copies of both are what it holds. Measured: 4 to 5.5
times (tests/unit/test_decode_memory.py); without the bound, 70 times."""
SUMMARY_OP = "file_summary"
"""The last row a file's task emits: ``frame_index`` holds the file's well-formed frames,
``error_frame_length`` its quarantined records (neither an event nor an error)."""

StreamState = tuple[int | None, int | None, int | None, bool, int | None]
"""(in_snapshot_start, in_snapshot_end, in_snapshot_flags, in_oso, in_vb_uuid) of a stream."""
NO_STATE: StreamState = (None, None, None, False, None)
# Frames that change a stream's state (see SessionOrder); the scan decodes only these.
_STATE_OPCODES = [
    int(Opcode.DCP_SNAPSHOT_MARKER),
    int(Opcode.DCP_OSO_SNAPSHOT),
    int(Opcode.DCP_STREAM_REQ),
]


DIGEST = "sha256"
"""The hash a run binds each planned file to: of the file's first ``size`` bytes (the size
listed when it was planned), the header included."""


class _Chunks:
    """The first ``file["size"]`` bytes of a capture file (those planned; the file may have
    grown since) in chunks of ``chunk_bytes``: ``(buffer, file offset of its first byte,
    final)``, hashed (:data:`DIGEST`) as they are read. The caller sets ``consumed`` to the
    bytes of each buffer it framed; the rest (a frame cut by the chunk boundary, or frames a
    batch left for later) starts the next buffer, topped up to ``chunk_bytes`` only. So a
    buffer is at most one chunk, unless it holds no whole frame (one frame is at most 64 MiB,
    docs/protocol/dcp.md §1.1). ``storage``: the Spark settings the landing filesystem is built from
    (:func:`pipelines.bronze.landing.filesystem`).

    After the caller's last chunk, :meth:`finish` says whether the bytes were those planned.
    A file that vanishes (or becomes a folder) ends the chunks early; an I/O error on a file
    that is still there is raised.
    """

    def __init__(
        self, file: dict[str, Any], chunk_bytes: int, storage: Mapping[str, str] | None = None
    ) -> None:
        self.file = file
        self.chunk_bytes = chunk_bytes
        self.storage = storage
        self.consumed = 0
        self.read_bytes = 0
        self.hash = hashlib.new(DIGEST)
        self.gone: str | None = None
        self.digest = ""  # of all ``size`` bytes, once finished
        self.grew = False  # the only difference: bytes past ``size`` (the planned are intact)
        self._fh: Any = None

    def _take(self, n: int) -> bytes:
        if n <= 0 or self.gone is not None:
            return b""
        try:
            if self._fh is None:
                self._fh = open_input(self.file["path"], self.storage)
            data: bytes = self._fh.read(n)
        except OSError:
            self.gone = gone(self.file["path"], self.storage)
            if self.gone is None:  # still a file: an I/O error, not a change
                raise
            return b""
        self.hash.update(data)
        self.read_bytes += len(data)
        return data

    def __iter__(self) -> Iterator[tuple[bytes, int, bool]]:
        size = self.file["size"]
        position = len(self._take(self.file["header_length"]))
        tail = b""
        final = False
        while True:
            # a tail without a whole frame needs a whole chunk more; any other tail (a cut
            # frame, or frames a batch left for later) a top-up to one chunk
            want = self.chunk_bytes - len(tail) if self.consumed else self.chunk_bytes
            if not final and want > 0:
                chunk = self._take(min(want, size - self.read_bytes))
                final = not chunk
                tail += chunk
            buf = tail
            if not buf:
                return
            self.consumed = len(buf)
            yield buf, position, final
            if final and (self.consumed == len(buf) or not self.consumed):
                return
            tail = buf[self.consumed :]
            position += self.consumed

    def finish(self, planned_digest: str | None = None, *, growth: bool = True) -> str | None:
        """After the caller's last chunk: how the bytes differ from those planned, or None.

        Reads what the caller left (it stops at a frame it cannot frame), so that all
        ``size`` bytes are hashed (:attr:`digest`) and compared with ``planned_digest`` (when
        given); with ``growth``, bytes past ``size`` are a difference too. Closes the file.
        """
        size = self.file["size"]
        try:
            while self._take(min(self.chunk_bytes, size - self.read_bytes)):
                pass
            self.digest = self.hash.hexdigest()
            more = growth and self.gone is None and bool(self._fh.read(1))
        finally:
            if self._fh is not None:
                self._fh.close()
        if self.gone is not None:
            return self.gone
        if self.read_bytes < size:
            return f"has {self.read_bytes} bytes, not the {size} planned"
        if planned_digest is not None and self.digest != planned_digest:
            return f"its first {size} bytes are not those planned ({DIGEST} differs)"
        self.grew = more
        return f"grew past the {size} bytes planned" if more else None


# --- stream state ----------------------------------------------------------------------------


@dataclass
class StateEvents:
    """The frames of a decoded table that set a stream's state, in row order.

    ``vb_key`` is the stream of every row: the vbucket of a request, the opaque of a response
    (a consumer sets each stream request's opaque to its vbucket, docs/protocol/capture-format.md). A
    snapshot marker sets the snapshot (start, end, flags); an OSO snapshot marker sets the
    OSO flag (start) or clears it (end); a successful stream-request response clears both and
    its failover log's entry 0 sets the vb uuid.
    """

    vb_key: Any
    snapshot: Any  # rows that set the snapshot state
    start: Any
    end: Any
    flags: Any
    start_valid: Any
    end_valid: Any
    flags_valid: Any
    oso: Any
    uuid: Any  # rows that set the vb uuid
    vb_uuid: Any


def _ints(table: pa.Table, name: str) -> tuple[Any, Any]:
    """A nullable integer column as (int64 values with 0 for nulls, validity)."""
    column = table.column(name)
    values = column.fill_null(0).to_numpy().astype(np.int64)
    return values, column.is_valid().to_numpy(zero_copy_only=False)


def state_events(decoded: pa.Table) -> StateEvents:
    """The state-setting frames of ``decoded`` (decoded frames, none malformed)."""
    op = decoded.column("op")
    status, is_response = _ints(decoded, "status")
    opaque, _ = _ints(decoded, "opaque")
    vbucket, _ = _ints(decoded, "vbucket")
    vb_key = np.where(is_response, opaque.astype(np.int32), vbucket)
    marker = pc.equal(op, "snapshot_marker").to_numpy(zero_copy_only=False)
    oso_marker = pc.equal(op, "oso_snapshot").to_numpy(zero_copy_only=False)
    response = pc.equal(op, "stream_request_response").to_numpy(zero_copy_only=False)
    start, start_valid = _ints(decoded, "start_seqno")
    end, end_valid = _ints(decoded, "end_seqno")
    flags, flags_valid = _ints(decoded, "snapshot_flags")
    oso_flags, _ = _ints(decoded, "oso_flags")
    failover = decoded.column("failover_log")
    has_log = response & failover.is_valid().to_numpy(zero_copy_only=False)
    vb_uuid = np.zeros(decoded.num_rows, dtype=np.int64)
    if has_log.any():
        rows = np.flatnonzero(has_log)
        entry = pc.list_element(failover.take(pa.array(rows)), 0)
        vb_uuid[rows] = pc.struct_field(entry, "vb_uuid").to_numpy(zero_copy_only=False)
    return StateEvents(
        vb_key,
        marker | oso_marker | (response & (status == 0)),
        start,
        end,
        flags,
        marker & start_valid,
        marker & end_valid,
        marker & flags_valid,
        oso_marker & ((oso_flags & 1) != 0),
        has_log,
        vb_uuid,
    )


def _last_of_key(keys: Any, order: Any, event: Any) -> Any:
    """Per row, the latest ``event`` row of the same key at or before it, else -1.

    ``order`` sorts the rows by key, stably (the rows of one key stay in row order)."""
    n = len(keys)
    if not n:
        return np.zeros(0, dtype=np.int64)
    sorted_keys = keys[order]
    group_start = np.zeros(n, dtype=np.int64)
    firsts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    group_start[firsts] = firsts
    np.maximum.accumulate(group_start, out=group_start)
    latest = np.where(event[order], np.arange(n), -1)
    np.maximum.accumulate(latest, out=latest)
    found = latest >= group_start
    last = np.empty(n, dtype=np.int64)
    last[order] = np.where(found, order[np.maximum(latest, 0)], -1)
    return last


STATE_COLUMNS = (
    "in_snapshot_start",
    "in_snapshot_end",
    "in_snapshot_flags",
    "in_oso",
    "in_vb_uuid",
)


@dataclass
class StreamStates:
    """Stream states by vb_key, as arrays: ``keys`` sorted, a value and validity per column."""

    keys: Any
    values: dict[str, Any]
    valid: dict[str, Any]

    @classmethod
    def of(cls, states: dict[int, StreamState]) -> StreamStates:
        keys = np.array(sorted(states), dtype=np.int64)
        rows = [states[k] for k in keys.tolist()]
        values, valid = {}, {}
        for i, name in enumerate(STATE_COLUMNS):
            column = [r[i] for r in rows]
            valid[name] = np.array([v is not None for v in column], dtype=np.bool_)
            values[name] = np.array([v or 0 for v in column], dtype=np.int64)
        return cls(keys, values, valid)

    def as_dict(self) -> dict[int, StreamState]:
        columns = [
            [
                v if ok else None
                for v, ok in zip(self.values[n].tolist(), self.valid[n].tolist(), strict=True)
            ]
            for n in STATE_COLUMNS
        ]
        columns[3] = [bool(v) for v in columns[3]]
        return {k: tuple(s) for k, *s in zip(self.keys.tolist(), *columns, strict=True)}

    def lookup(self, keys: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state of each of ``keys``; ``NO_STATE`` for keys without one."""
        at = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        known = self.keys[at] == keys if len(self.keys) else np.zeros(len(keys), np.bool_)
        values = {
            n: np.where(known, self.values[n][at], 0)
            if len(self.keys)
            else np.zeros(len(keys), np.int64)
            for n in STATE_COLUMNS
        }
        valid = {n: known & self.valid[n][at] if len(self.keys) else known for n in STATE_COLUMNS}
        return values, valid


class SessionOrder:
    """The stream state in force at each frame of one file, fed its decoded tables in order.

    A frame's state is that of the last state-setting frame of its stream (:class:`StateEvents`)
    before it or at it, in session order; before the first one, the state the session's earlier
    files left (``carry``).
    """

    def __init__(self, carry: dict[int, StreamState]) -> None:
        self.states = StreamStates.of(carry)

    def columns(self, decoded: pa.Table) -> dict[str, pa.Array]:
        ev = state_events(decoded)
        order = np.argsort(ev.vb_key, kind="stable")
        carried, carried_valid = self.states.lookup(ev.vb_key)
        values, valid = {}, {}
        at = _last_of_key(ev.vb_key, order, ev.snapshot)
        has, src = at >= 0, np.maximum(at, 0)
        for name, value, ok in (
            ("in_snapshot_start", ev.start, ev.start_valid),
            ("in_snapshot_end", ev.end, ev.end_valid),
            ("in_snapshot_flags", ev.flags, ev.flags_valid),
            ("in_oso", ev.oso, np.ones(len(has), dtype=np.bool_)),
        ):
            values[name] = np.where(has, value[src], carried[name])
            valid[name] = np.where(has, ok[src], carried_valid[name])
        at = _last_of_key(ev.vb_key, order, ev.uuid)
        has, src = at >= 0, np.maximum(at, 0)
        values["in_vb_uuid"] = np.where(has, ev.vb_uuid[src], carried["in_vb_uuid"])
        valid["in_vb_uuid"] = has | carried_valid["in_vb_uuid"]
        values["in_oso"] = values["in_oso"].astype(np.bool_) & valid["in_oso"]  # null: False
        self._keep_last(ev.vb_key, order, values, valid)
        return {
            n: pa.array(
                values[n],
                mask=None if n == "in_oso" else ~valid[n],
                type=pa.bool_() if n == "in_oso" else pa.int64(),
            )
            for n in STATE_COLUMNS
        }

    def _keep_last(
        self, keys: Any, order: Any, values: dict[str, Any], valid: dict[str, Any]
    ) -> None:
        """The state after each stream's last frame here is its state for what follows."""
        if not len(keys):
            return
        sorted_keys = keys[order]
        last = order[np.flatnonzero(np.r_[sorted_keys[1:] != sorted_keys[:-1], True])]
        merged = self.states.as_dict()
        latest = StreamStates(
            keys[last],
            {n: values[n][last] for n in STATE_COLUMNS},
            {n: valid[n][last] for n in STATE_COLUMNS},
        )
        merged.update(latest.as_dict())
        self.states = StreamStates.of(merged)


@dataclass
class FileScan:
    """What a file does to its session's streams: per vb_key, the state its last snapshot-
    setting frame set and the vb uuid its last failover log set. ``digest``: of the bytes
    scanned (:data:`DIGEST`); ``problem``: why the file is not the one planned (it vanished,
    shrank, grew or differs from ``planned_digest``), else None."""

    snapshots: dict[int, tuple[int | None, int | None, int | None, bool]] = field(
        default_factory=dict
    )
    uuids: dict[int, int] = field(default_factory=dict)
    digest: str = ""
    problem: str | None = None
    missing: bool = False  # the problem is that the file vanished or is no longer a file
    grew: bool = False  # the problem is only bytes past those planned

    def apply(self, before: dict[int, StreamState]) -> dict[int, StreamState]:
        """The session's stream states after this file, given those before it."""
        after = dict(before)
        for key in self.snapshots.keys() | self.uuids.keys():
            old = after.get(key, NO_STATE)
            snapshot = self.snapshots.get(key, old[:4])
            after[key] = (*snapshot, self.uuids.get(key, old[4]))
        return after


def scan_file(
    file: dict[str, Any],
    *,
    chunk_bytes: int,
    storage: Mapping[str, str] | None = None,
    planned_digest: str | None = None,
    growth: bool = True,
) -> FileScan:
    """Frame the first ``file["size"]`` bytes of one capture file, decode only its state-
    setting frames (:class:`FileScan`) and hash them. A file that vanished, became a folder,
    shrank, grew (with ``growth``), or whose bytes differ from ``planned_digest`` has a
    ``problem``."""
    scan = FileScan()
    chunks = _Chunks(file, chunk_bytes, storage)
    for buf, position, final in chunks:
        starts, chunks.consumed, fatal = frame_starts(buf, final=final, base_offset=position)
        if len(starts):
            opcodes = np.frombuffer(buf, dtype=np.uint8)[starts + 1]
            chosen = starts[np.isin(opcodes, _STATE_OPCODES)]
            decoded, _ = decode_frames(
                buf, chosen, collections=file["collections"], base_offset=position
            )
            _fold_scan(scan, state_events(decoded))
        if fatal is not None and not isinstance(fatal, TruncatedFrameError):
            break  # nothing after an unframeable frame is decoded
    scan.problem = chunks.finish(planned_digest, growth=growth)
    scan.digest, scan.missing, scan.grew = chunks.digest, chunks.gone is not None, chunks.grew
    return scan


def _fold_scan(scan: FileScan, ev: StateEvents) -> None:
    for i in np.flatnonzero(ev.snapshot).tolist():
        scan.snapshots[int(ev.vb_key[i])] = (
            int(ev.start[i]) if ev.start_valid[i] else None,
            int(ev.end[i]) if ev.end_valid[i] else None,
            int(ev.flags[i]) if ev.flags_valid[i] else None,
            bool(ev.oso[i]),
        )
    for i in np.flatnonzero(ev.uuid).tolist():
        scan.uuids[int(ev.vb_key[i])] = int(ev.vb_uuid[i])


# --- the decode task ---------------------------------------------------------------------


def _error_row(
    error: MalformedFrameError, file: dict[str, Any], raw: bytes, raw_length: int
) -> dict[str, Any]:
    return {
        "op": "error",
        "offset": error.offset,
        "opcode": error.opcode,
        "bucket": file["bucket"],
        "session_id": file["session_id"],
        "file": file["path"],
        "file_sequence": file["file_sequence"],
        "error_reason": error.reason,
        "error_expected": error.expected,
        "error_got": error.got,
        "error_frame_length": error.frame_length,
        "error_truncated": isinstance(error, TruncatedFrameError),
        "raw": raw,
        "error_raw_length": raw_length,
    }


FileDone = Callable[[str, int, int], None]
"""Told ``(file, frames, errors)`` once a file is decoded to its end."""


def decode_file(
    file: dict[str, Any],
    schema: pa.Schema,
    *,
    chunk_bytes: int,
    raw_limit: int,
    frames: bool = True,
    errors: bool = True,
    done: FileDone | None = None,
    storage: Mapping[str, str] | None = None,
    planned_digest: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Every frame of one capture file, in order, as batches of ``schema``: its well-formed
    frames (``frames``) and its malformed ones as ``op = 'error'`` rows (``errors``).

    When ``schema`` has the session-order columns, each frame gets the state in force at it,
    starting from ``file["carry"]`` (JSON ``{vb_key: [start, end, flags, oso, vb_uuid]}``).

    Only the first ``file["size"]`` bytes are read (those planned). When they are not those
    planned (the file vanished or shrank, or they differ from ``planned_digest``), the task
    fails with :class:`LandingChangedError` after its last batch, so its write commits nothing.
    """
    path = file["path"]
    order = None
    if "in_snapshot_start" in schema.names:
        carry = json.loads(file.get("carry") or "{}")
        order = SessionOrder({int(k): tuple(v) for k, v in carry.items()})
    frames_before = n_frames = n_errors = 0
    chunks = _Chunks(file, chunk_bytes, storage)
    for buf, position, final in chunks:
        batch = decode_batch(
            buf,
            collections=file["collections"],
            base_offset=position,
            final=final,
            file=path,
            max_expanded=chunk_bytes,
        )
        error_rows = [
            _error_row(
                e,
                file,
                buf[
                    e.offset - position : e.offset - position + min(e.frame_length or 0, raw_limit)
                ],
                e.frame_length or 0,
            )
            for e in batch.errors
        ]
        stop = batch.fatal is not None and (
            final or not isinstance(batch.fatal, TruncatedFrameError)
        )
        if stop:
            assert batch.fatal is not None
            start = batch.fatal.offset - position
            rest = len(buf) - start
            if not final:  # the rest of the file cannot be framed: one record for all of it
                rest = file["size"] - batch.fatal.offset
            error_rows.append(_error_row(batch.fatal, file, buf[start : start + raw_limit], rest))
        decoded = batch.table
        n_frames += decoded.num_rows
        n_errors += len(error_rows)
        if frames:
            session = order.columns(decoded) if order is not None else {}
            table = _with_lineage(decoded, file, error_rows, frames_before, schema, session)
            yield from table.to_batches(max_chunksize=MAX_ROWS_PER_BATCH)
        else:
            _frame_indices(decoded, error_rows, frames_before)
        if errors and error_rows:
            yield from pa.Table.from_pylist(error_rows, schema=schema).to_batches()
        frames_before += decoded.num_rows + len(batch.errors)
        if stop:
            break
        chunks.consumed = batch.consumed
    problem = chunks.finish(planned_digest, growth=False)
    if problem is not None:  # fails the task, so the run writes nothing
        raise LandingChangedError(f"{path}: {problem}; nothing of its run was written")
    if done is not None:
        done(path, n_frames, n_errors)


def _frame_indices(decoded: pa.Table, errors: list[dict[str, Any]], frames_before: int) -> Any:
    """The frame index of each decoded row; malformed frames with a known boundary are frames
    of the session too, so they take an index (set in their rows) and shift the rest."""
    offsets = decoded.column("offset").to_numpy()
    error_offsets = np.array(
        sorted(e["offset"] for e in errors if e["error_frame_length"]), dtype=np.int64
    )
    index = frames_before + np.arange(len(offsets), dtype=np.int64)
    index += np.searchsorted(error_offsets, offsets)
    for e in errors:
        if e["error_frame_length"]:
            rank = int(np.searchsorted(error_offsets, e["offset"]))
            e["frame_index"] = frames_before + int(np.searchsorted(offsets, e["offset"])) + rank
    return index


def _with_lineage(
    decoded: pa.Table,
    file: dict[str, Any],
    errors: list[dict[str, Any]],
    frames_before: int,
    schema: pa.Schema,
    session: dict[str, pa.Array],
) -> pa.Table:
    n = decoded.num_rows
    columns: dict[str, pa.Array] = {name: decoded.column(name) for name in decoded.column_names}
    columns |= session
    columns["bucket"] = _constant(file["bucket"], n)
    columns["session_id"] = _constant(file["session_id"], n)
    columns["session_started_at"] = _constant(file["session_started_at"] or "", n)
    columns["file"] = _constant(file["path"], n)
    columns["file_sequence"] = pa.array(np.full(n, file["file_sequence"], dtype=np.int32))
    columns["frame_index"] = pa.array(_frame_indices(decoded, errors, frames_before))
    arrays = [
        columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _constant(text: str, n: int) -> pa.Array:
    indices = pa.array(np.zeros(n, dtype=np.int32))
    return pa.DictionaryArray.from_arrays(indices, pa.array([text])).cast(pa.string())


def decode_files(
    batches: Iterator[pa.RecordBatch],
    schema: pa.Schema,
    *,
    chunk_bytes: int,
    raw_limit: int,
    frames: bool = True,
    errors: bool = True,
    done: FileDone | None = None,
    storage: Mapping[str, str] | None = None,
    planned_digests: Mapping[str, str] | None = None,
    worker: bool = True,
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: rows of file descriptors in, frames out.
    ``planned_digests``: by path, the digest each file's planned bytes must have.

    A Python ``worker`` keeps its freed memory for the next buffer
    (:func:`dcp_cdc.columnar.keep_freed_memory`): each 64 MiB chunk is decoded into memory
    the chunk before it used, with no page fault (0.44 s a file without, 0.37 s with). The
    driver (``worker`` False: a small run decoded there) does not: it would keep its peak."""
    if worker:
        keep_freed_memory()
    for batch in batches:
        for file in batch.to_pylist():
            yield from decode_file(
                file,
                schema,
                chunk_bytes=chunk_bytes,
                raw_limit=raw_limit,
                frames=frames,
                errors=errors,
                done=done,
                storage=storage,
                planned_digest=(planned_digests or {}).get(file["path"]),
            )


ScanDone = Callable[[str, FileScan], None]
"""Told ``(file, scan)`` once a file is scanned."""


def scan_files(
    batches: Iterator[pa.RecordBatch],
    schema: pa.Schema,
    *,
    chunk_bytes: int,
    storage: Mapping[str, str] | None = None,
    planned_digests: Mapping[str, str] | None = None,
    growth: bool = True,
    done: ScanDone | None = None,
    worker: bool = True,
) -> Iterator[pa.RecordBatch]:
    """The scan's ``mapInArrow`` function: rows of file descriptors in; out, per file and
    stream it sets the state of, what its last state-setting frames set (``schemas.SCAN``).
    ``done`` is told each file's scan (its digest and problem, :func:`scan_file`; compared
    with ``planned_digests``, by path, when a file has one)."""
    if worker:
        keep_freed_memory()  # as decode_files does
    for batch in batches:
        for file in batch.to_pylist():
            scan = scan_file(
                file,
                chunk_bytes=chunk_bytes,
                storage=storage,
                planned_digest=(planned_digests or {}).get(file["path"]),
                growth=growth,
            )
            if done is not None:
                done(file["path"], scan)
            rows = []
            for key in sorted(scan.snapshots.keys() | scan.uuids.keys()):
                snapshot = scan.snapshots.get(key)
                rows.append(
                    {
                        "file": file["path"],
                        "vb_key": key,
                        "has_snapshot": snapshot is not None,
                        "snapshot_start": snapshot[0] if snapshot else None,
                        "snapshot_end": snapshot[1] if snapshot else None,
                        "snapshot_flags": snapshot[2] if snapshot else None,
                        "snapshot_oso": snapshot[3] if snapshot else None,
                        "vb_uuid": scan.uuids.get(key),
                    }
                )
            yield pa.RecordBatch.from_pylist(rows, schema=schema)
