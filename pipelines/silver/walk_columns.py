"""Silver's per-vbucket walk over a group's columns: :func:`walk_group` gives what
:func:`pipelines.silver.walk.walk_group_rows` gives, row for row, without a Python row per frame.

The rules are those of :mod:`pipelines.silver.walk` (docs/protocol/dcp.md §6–§7), which stays
their readable statement and this walk's oracle: ``tests/unit/test_walk_columns.py`` checks
that both give the same table over generated streams. What a rollback and a committed system
event do to the state, and where a failover log branches, are the same functions here.

Why a second walk: building a dict of some thirty values for every frame, and one for every
row out, costs several times what the state machine does. Here only the narrow columns the
rules read (op, seqnos, CAS, collection, marker fields) become Python lists, in session order,
and the state machine keeps the indices of the frames it commits. The output rows are gathered
from the group's table by those indices (``take``: keys, values and XATTRs are never Python
objects), with the few values the walk sets itself laid over them.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.events import DATA_OPS
from dcp_cdc.protocol import OsoFlag
from pipelines.silver.walk import (
    ENDED_CHANGE,
    ENDING_EVENTS,
    Position,
    VbState,
    branch_point,
    record_event,
    retract,
)

# The ops the walk acts on, as small integers: data changes first, then what else a snapshot
# buffers, then the frames that open, close or reset one. Any other op is read and ignored.
_OPS = (
    *DATA_OPS,
    "system_event",
    "seqno_advanced",
    "snapshot_marker",
    "oso_snapshot",
    "stream_end",
    "stream_request_response",
)
_DATA = len(DATA_OPS)  # ops below it are data changes
SYSTEM_EVENT, _, MARKER, OSO, STREAM_END, RESPONSE, OTHER = range(_DATA, _DATA + 7)
_OP_CODES = pa.array(_OPS)
_NARROW = ["op", "by_seqno", "cas", "collection_id", "start_seqno", "end_seqno", "purge_seqno"]
"""The columns the rules read for every frame."""


class _Order:
    """A group's rows in session order (``rows``: row numbers of the table, stable for equal
    positions, as Python's sort of :func:`pipelines.silver.walk.position_of` is) and the
    position of each."""

    def __init__(self, table: pa.Table) -> None:
        started, started_rank, self._started = _ranked(
            pc.fill_null(table.column("session_started_at"), "")
        )
        session, session_rank, self._session = _ranked(table.column("session_id"))
        sequence = table.column("file_sequence").to_numpy()
        offset = table.column("offset").to_numpy()
        # lexsort: the last key first; the row number last of all keeps equal positions in order
        keys = (np.arange(len(offset)), offset, sequence, session_rank, started_rank)
        self.rows = np.lexsort(keys)
        self.started = started[self.rows].tolist()
        self.session = session[self.rows].tolist()
        self.sequence = sequence[self.rows].tolist()
        self.offset = offset[self.rows].tolist()

    def position(self, i: int) -> Position:
        """The position of the ``i``-th row in session order."""
        return (
            self._started[self.started[i]],
            self._session[self.session[i]],
            self.sequence[i],
            self.offset[i],
        )

    def first_after(self, position: Position | None, lo: int = 0) -> int:
        """The first row from ``lo`` on whose position is after ``position`` (all: ``None``)."""
        if position is None:
            return lo
        return bisect_right(range(len(self.rows)), position, lo=lo, key=self.position)


def _ranked(column: pa.ChunkedArray) -> tuple[Any, Any, list[Any]]:
    """A string column as codes into its distinct values (``values``), and each row's rank
    among those values in Python's order: (codes, ranks, values)."""
    encoded = pc.dictionary_encode(column.combine_chunks(), null_encoding="encode")
    values = encoded.dictionary.to_pylist()
    rank = {v: r for r, v in enumerate(sorted(values))}
    codes = encoded.indices.to_numpy()
    return codes, np.array([rank[v] for v in values], dtype=np.int64)[codes], values


class _Frames:
    """The frames the walk reads (rows ``first`` on of ``order``), frame ``j`` being the
    ``j``-th of them: the columns read for every frame as lists, the others on demand, and
    where each snapshot may end (:attr:`points`)."""

    def __init__(self, table: pa.Table, order: _Order, first: int) -> None:
        self.table = table
        self.order = order
        self.first = first
        self.rows = order.rows[first:]
        narrow = table.select(_NARROW).combine_chunks().take(self.rows)
        codes = pc.fill_null(pc.index_in(narrow.column("op"), value_set=_OP_CODES), OTHER)
        by_seqno, end_seqno = narrow.column("by_seqno"), narrow.column("end_seqno")
        ops = codes.to_numpy()
        self.ops: list[int] = ops.tolist()
        self.by_seqno: list[Any] = by_seqno.to_pylist()
        self.cas: list[int] = _filled(narrow.column("cas"))
        # ``collection_id or 0``, as the rules compare it; a system event's own reads the column
        self.collection: list[int] = _filled(narrow.column("collection_id"))
        self.start_seqno: list[Any] = narrow.column("start_seqno").to_pylist()
        self.end_seqno: list[Any] = end_seqno.to_pylist()
        self.purge_seqno: list[Any] = narrow.column("purge_seqno").to_pylist()

        buffered, data = ops < MARKER, ops < _DATA
        self.buffered_before: list[int] = [0, *np.cumsum(buffered).tolist()]
        """How many frames before frame ``j`` a snapshot buffers (at ``j``)."""
        self.data_before: list[int] = [0, *np.cumsum(data).tolist()]
        """How many frames before frame ``j`` are data changes (at ``j``)."""
        # The frames the state machine stops at: those that open, close or reset a snapshot,
        # and the buffered ones at the end seqno of the last marker before them (an open
        # snapshot completes there). The frames between are buffered, nothing more.
        markers = np.flatnonzero(ops == MARKER)
        at_end = np.zeros(len(ops), dtype=bool)
        if len(markers):
            before = np.searchsorted(markers, np.arange(len(ops)))  # markers before frame j
            last = markers[np.maximum(before - 1, 0)]  # the last of them (any, where none)
            seqno = pc.fill_null(by_seqno, 0).to_numpy()
            end = pc.fill_null(end_seqno, 0).to_numpy()
            at_end = (
                buffered
                & (before > 0)
                & _valid(by_seqno)
                & _valid(end_seqno)[last]
                & (seqno == end[last])
            )
        self.points: list[int] = np.flatnonzero(at_end | (~buffered & (ops != OTHER))).tolist()

    def __len__(self) -> int:
        return len(self.ops)

    def value(self, name: str, j: int) -> Any:
        """Column ``name`` of frame ``j`` (for the few frames that need more than the lists)."""
        return self.table.column(name)[int(self.rows[j])].as_py()

    def position(self, j: int) -> Position:
        return self.order.position(self.first + j)

    def before(self, j: int) -> Position:
        """The position just before frame ``j``: a marker opens a snapshot that may not finish."""
        started, session, sequence, offset = self.position(j)
        return (started, session, sequence, offset - 1)

    def buffered(self, start: int, stop: int) -> list[int]:
        """The frames from ``start`` to before ``stop`` that a snapshot buffers."""
        ops = self.ops
        return [j for j in range(start, stop) if ops[j] < MARKER]


def _valid(column: pa.Array) -> Any:
    """Where ``column`` is not null, as a numpy array."""
    return pc.is_valid(column).to_numpy(zero_copy_only=False)


def _filled(column: pa.Array) -> list[int]:
    """An integer column as a list, nulls as 0."""
    return pc.fill_null(column, 0).to_numpy().tolist()  # type: ignore[no-any-return]


@dataclass
class _Walked:
    """:class:`pipelines.silver.walk.WalkResult` with frame indices for frames."""

    changes: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    events: list[tuple[int, str | None, int]] = field(default_factory=list)  # frame, kind, CAS
    rollbacks: list[int] = field(default_factory=list)
    ignored: int = 0


def _walk(fr: _Frames, state: VbState, eager: bool) -> _Walked:
    """:func:`pipelines.silver.walk.walk` over ``fr``: the same steps, on indices, taken only
    at the frames where something happens (:attr:`_Frames.points`). The buffer of the open
    snapshot is a span of frames, ``start`` to the current one (those of them it buffers)."""
    out = _Walked()
    ops, seqnos, cas_of, cid_of = fr.ops, fr.by_seqno, fr.cas, fr.collection
    buffered_before, data_before = fr.buffered_before, fr.data_before
    start = 0  # the buffer: the buffered frames from here to the current one
    snap_end: int | None = None
    oso = False
    # the last position moved to: the frame it is at, or (a marker's) just before, as
    # (frame, before); found only at the end
    moved: tuple[int, bool] | None = None

    def rollback(seqno: int) -> None:
        out.changes = [c for c in out.changes if seqnos[c] <= seqno]
        out.ended = [c for c in out.ended if seqnos[c] <= seqno]
        out.events = [e for e in out.events if seqnos[e[0]] <= seqno]
        out.rollbacks.append(seqno)
        retract(state, seqno)

    def system_event(j: int, clock: int) -> None:
        cid = fr.value("collection_id", j)
        seqno = seqnos[j]
        kind = record_event(state, fr.value("event", j), cid, seqno, fr.value("manifest_uid", j))
        if kind in ENDING_EVENTS:
            gone = [c for c in out.changes if cid_of[c] == cid and seqnos[c] < seqno]
            if gone:
                out.ended.extend(gone)
                ended = set(gone)
                out.changes = [c for c in out.changes if c not in ended]
        out.events.append((j, kind, clock))

    def commit_each(buffer: list[int]) -> int:
        """The buffered frames one by one, as the row walk's ``complete`` takes them; their
        highest seqno (or the consistent seqno)."""
        top = state.consistent_seqno
        clock = state.last_cas
        for j in buffer:
            seqno = seqnos[j]
            top = max(top, seqno)
            if ops[j] < _DATA:
                clock = max(clock, cas_of[j])
                cid = cid_of[j]
                if cid in state.dropped and state.dropped[cid] <= seqno:
                    out.ignored += 1
                    continue
                out.changes.append(j)
                state.last_applied_seqno = max(state.last_applied_seqno, seqno)
            elif ops[j] == SYSTEM_EVENT:
                earlier = [cas_of[i] for i in buffer if ops[i] < _DATA and seqnos[i] < seqno]
                system_event(j, max([state.last_cas, *earlier]))
        state.last_cas = clock
        return top

    def complete(stop: int, closing: int | None) -> None:
        """The row walk's ``complete``, the buffer being the frames ``start`` to ``stop``."""
        nonlocal start, snap_end, moved
        top = state.consistent_seqno
        buffered = buffered_before[stop] - buffered_before[start]
        dropped = state.dropped
        if not buffered:
            pass
        elif data_before[stop] - data_before[start] == stop - start and (
            not dropped or dropped.keys().isdisjoint(cid_of[start:stop])
        ):  # data changes only, of collections not dropped: all commit, in one step
            highest = max(seqnos[start:stop])
            top = max(top, highest)
            state.last_cas = max(state.last_cas, max(cas_of[start:stop]))
            out.changes.extend(range(start, stop))
            state.last_applied_seqno = max(state.last_applied_seqno, highest)
        else:
            top = commit_each(fr.buffered(start, stop))
        if snap_end is not None and not oso:
            top = max(top, snap_end)
        if buffered or snap_end is not None:
            state.consistent_seqno = top
        start = stop
        snap_end = None
        state.open_snapshot = None
        if closing is not None:
            moved = (closing, False)

    for j in fr.points:
        op = ops[j]
        if op < MARKER:  # a buffered frame at the end seqno of the last marker
            if not oso and snap_end is not None:
                complete(j + 1, j)
        elif op == MARKER:
            if not oso:
                complete(j, None)
                moved = (j, True)
            start, snap_end = j + 1, fr.end_seqno[j]
            state.open_snapshot = (fr.start_seqno[j], fr.end_seqno[j])
            purge = fr.purge_seqno[j]
            if purge is not None:
                state.purge_seqno = max(state.purge_seqno, purge)
        elif op == OSO:
            if fr.value("oso_flags", j) & OsoFlag.START:
                complete(j, None)
                moved = (j, True)
                oso, start, snap_end = True, j + 1, None
            else:
                complete(j, j)
                oso = False
        elif op == STREAM_END:
            if not oso:
                complete(j, j)
        elif op == RESPONSE:
            rollback_seqno = fr.value("rollback_seqno", j)
            if rollback_seqno is not None:
                rollback(rollback_seqno)
                start, snap_end, oso = j + 1, None, False
                state.open_snapshot = None
                moved = (j, False)
            else:
                entries = fr.value("failover_log", j)
                if entries:
                    start, snap_end, oso = j + 1, None, False  # a new stream: the open one is gone
                    state.open_snapshot = None
                    log = [(e["vb_uuid"], e["seqno"]) for e in entries]
                    branch = branch_point(state.failover_log, log, state.last_applied_seqno)
                    if branch is not None:
                        rollback(branch)
                    state.failover_log = log
                    state.vb_uuid = log[0][0]
                    moved = (j, False)
    if eager and not oso:
        _apply_tail(fr, fr.buffered(start, len(fr)), state, out)
    if moved is not None:
        j, before = moved
        state.position = fr.before(j) if before else fr.position(j)
    return out


def _apply_tail(fr: _Frames, buffer: list[int], state: VbState, out: _Walked) -> None:
    """:func:`pipelines.silver.walk._apply_tail` on indices."""
    created_here = set()
    for j in buffer:
        if fr.ops[j] == SYSTEM_EVENT:
            cid = fr.value("collection_id", j)
            if cid:
                created_here.add(cid)
    for j in buffer:
        cid = fr.collection[j]
        if fr.ops[j] >= _DATA or cid in created_here:
            continue
        seqno = fr.by_seqno[j]
        if cid in state.dropped and state.dropped[cid] <= seqno:
            continue
        out.changes.append(j)
        state.last_applied_seqno = max(state.last_applied_seqno, seqno)


def walk_group(table: pa.Table, out_schema: pa.Schema, eager: bool) -> pa.Table:
    """:func:`pipelines.silver.walk.walk_group_rows`, over the group's columns: one vbucket's
    frames walked from its saved state into rows of :data:`pipelines.schemas.WALKED`."""
    vb = table.column("vb_key")[0].as_py()
    text = table.column("saved_state")[0].as_py()
    saved = json.loads(text) if text else None
    state = VbState.from_json(saved) if saved else VbState(vb)
    seen = saved.get("seen_version", 0) if saved else 0
    order = _Order(table)
    first = order.first_after(state.position)
    frames = _Frames(table, order, first)
    walked = _walk(frames, state, eager)
    # the run holding the first frame not consumed (or the last one read): the next run reads
    # bronze from that run on
    position_run = position_version = None
    if len(frames):
        after = order.first_after(state.position, first)
        row = int(order.rows[after if after < len(order.rows) else -1])
        position_run = table.column("ingest_run_id")[row].as_py()
        position_version = table.column("run_version")[row].as_py()
    if position_run is None and saved:
        position_run, position_version = saved.get("run_id"), saved.get("position_version")
    seen = max(seen, pc.max(table.column("run_version")).as_py())
    last = {
        "kind": "state",
        "vbucket": vb,
        "frames": len(frames),
        "ignored": walked.ignored,
        "state": json.dumps(
            {
                **state.to_json(),
                "run_id": position_run,
                "position_version": position_version,
                "seen_version": seen,
            }
        ),
        "position_run_id": position_run,
    }
    tail = [{"kind": "rollback", "vbucket": vb, "rollback_seqno": s} for s in walked.rollbacks]
    return pa.concat_tables(
        [
            _walked_rows(table, out_schema, vb, frames, walked),
            pa.Table.from_pylist([*tail, last], schema=out_schema),
        ]
    )


_SET_BY_WALK = frozenset(("kind", "vbucket", "state", "frames", "ignored", "position_run_id"))
"""The columns of a walked row the walk fills itself, whatever its frame has."""
_KINDS = pa.array(["change", ENDED_CHANGE, "system_event"])


def _walked_rows(
    table: pa.Table, out_schema: pa.Schema, vb: int, frames: _Frames, walked: _Walked
) -> pa.Table:
    """The committed changes, the ended ones and the system events, as rows of ``out_schema``:
    the frames' own columns gathered from ``table``, the walk's values laid over them."""
    picked = [*walked.changes, *walked.ended, *(j for j, _, _ in walked.events)]
    rows = frames.rows[np.array(picked, dtype=np.int64)]
    n, n_events = len(picked), len(walked.events)
    counts = [len(walked.changes), len(walked.ended), n_events]
    kind = pa.DictionaryArray.from_arrays(np.repeat(np.arange(3, dtype=np.int8), counts), _KINDS)
    own = {  # what an event row says instead of its frame
        "event": [event for _, event, _ in walked.events],
        "cas": [clock for _, _, clock in walked.events],
    }
    present = set(table.column_names) - _SET_BY_WALK
    names = [f.name for f in out_schema if f.name in present]
    gathered = table.select(names).combine_chunks().take(rows)
    arrays: list[pa.Array | pa.ChunkedArray] = []
    for f in out_schema:
        if f.name == "kind":
            arrays.append(kind.cast(f.type))
        elif f.name == "vbucket":
            arrays.append(pa.array(np.full(n, vb), f.type))
        elif f.name in gathered.column_names:
            column = gathered.column(f.name).cast(f.type)
            if f.name in own and n_events:
                head = column.slice(0, n - n_events)
                column = pa.chunked_array([*head.chunks, pa.array(own[f.name], f.type)])
            arrays.append(column)
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=out_schema)
