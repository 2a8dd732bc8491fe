"""Silver's per-vbucket walk over a group's columns: :func:`walk_group_columns` gives what
:func:`pipelines.silver.walk.walk_group_rows` gives, row for row, without a Python row per frame.
:func:`walk_group`, what silver runs, picks one of the two by the group's size.

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

It costs some fifty Arrow and numpy calls a group, whatever its size: below
:data:`SMALL_GROUP` frames the row walk, two Arrow calls and a little Python per frame, is
faster (``python -m benchmarks.walk`` measures both).
"""

from __future__ import annotations

import itertools
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
    ENDING_EVENTS,
    Position,
    RowKind,
    VbState,
    branch_point,
    late_threshold,
    next_position,
    record_event,
    retract,
    walk_group_rows,
    walked_rows,
)
from pipelines.silver.walk_summary import summarize

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
_CODE = {op: code for code, op in enumerate(_OPS)}
_KEPT = -1  # not a frame: the state's own open snapshot, which the walk did not touch
_KINDS = (
    RowKind.CHANGE,
    RowKind.ENDED_CHANGE,
    RowKind.SYSTEM_EVENT,
    RowKind.ROLLBACK,
    RowKind.STATE,
)
"""The kinds of walked rows, in the order they come."""


def _array(table: pa.Table, name: str) -> pa.Array:
    """A column of ``table`` as one array (a group usually comes as one record batch)."""
    return _one(table.column(name))


def _values(array: pa.Array) -> Any:
    """An integer array as numpy, read from its buffers (few Arrow calls: a group is often
    small, and a call costs more than its work), 0 where null."""
    n, offset = len(array), array.offset
    data = array.buffers()[1]
    values = np.frombuffer(data, dtype=array.type.to_pandas_dtype(), count=offset + n)[offset:]
    return np.where(_valid(array), values, 0) if array.null_count else values


def _valid(array: pa.Array) -> Any:
    """Where ``array`` is not null, as a numpy array (from its validity bitmap)."""
    n, offset = len(array), array.offset
    if not array.null_count:
        return np.ones(n, dtype=bool)
    bits = np.frombuffer(array.buffers()[0], dtype=np.uint8)
    return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].astype(bool)


def _ranked(array: pa.Array, null_as: str | None = None) -> tuple[Any, Any, list[Any]]:
    """A string array as codes into its distinct values (nulls as ``null_as``), and each row's
    rank among those values in Python's order: (codes, ranks, values)."""
    encoded = pc.dictionary_encode(array, null_encoding="encode")
    values: list[Any] = [null_as if v is None else v for v in encoded.dictionary.to_pylist()]
    rank = {v: r for r, v in enumerate(sorted(set(values)))}
    codes = _values(encoded.indices)
    return codes, np.array([rank[v] for v in values], dtype=np.int64)[codes], values


class _Order:
    """A group's rows in session order (``rows``: row numbers of the table, stable for equal
    positions, as Python's sort of :func:`pipelines.silver.walk.position_of` is) and the
    position of each."""

    def __init__(self, table: pa.Table) -> None:
        started, started_rank, self._started = _ranked(
            _array(table, "session_started_at"), null_as=""
        )
        session, session_rank, self._session = _ranked(_array(table, "session_id"))
        sequence = _values(_array(table, "file_sequence"))
        offset = _values(_array(table, "offset"))
        # lexsort is stable, and sorts by its last key first
        self.rows = np.lexsort((offset, sequence, session_rank, started_rank))
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


def _narrow(table: pa.Table, name: str, rows: Any) -> tuple[Any, Any]:
    """An integer column's values and validity at ``rows``, as numpy arrays."""
    array = _array(table, name)
    return _values(array)[rows], _valid(array)[rows]


class _Frames:
    """The frames the walk reads (rows ``first`` on of ``order``), frame ``j`` being the
    ``j``-th of them: the columns read for every frame as lists, the others on demand, and
    where each snapshot may end (:attr:`points`)."""

    def __init__(self, table: pa.Table, order: _Order, first: int) -> None:
        self.table = table
        self.order = order
        self.first = first
        self.rows = rows = order.rows[first:]
        self.rows_list: list[int] = rows.tolist()
        self._values: dict[str, list[Any]] = {}
        op = pc.dictionary_encode(_array(table, "op"), null_encoding="encode")
        code = np.array([_CODE.get(v, OTHER) for v in op.dictionary.to_pylist()], dtype=np.int8)
        ops = code[_values(op.indices)][rows]
        seqno, seqno_valid = _narrow(table, "by_seqno", rows)
        end, end_valid = _narrow(table, "end_seqno", rows)
        purge, purge_valid = _narrow(table, "purge_seqno", rows)
        self.ops: list[int] = ops.tolist()
        self.by_seqno: list[Any] = seqno.tolist()
        for j in np.flatnonzero(~seqno_valid).tolist():  # None, as the rows have it
            self.by_seqno[j] = None
        self.cas: list[int] = _values(_array(table, "cas"))[rows].tolist()
        # ``collection_id or 0``, as the rules compare it; a system event's own reads the column
        self.collection: list[int] = _values(_array(table, "collection_id"))[rows].tolist()
        self.end_seqno: list[int] = end.tolist()
        self.end_valid: list[bool] = end_valid.tolist()
        marker = ops == MARKER
        purges = purge[marker & purge_valid]
        self.purge_seqno = int(purges.max()) if len(purges) else None
        """The highest purge seqno of the markers (each raises the state's, in any order)."""

        buffered, data = ops < MARKER, ops < _DATA
        self.buffered_before: list[int] = [0, *np.cumsum(buffered).tolist()]
        """How many frames before frame ``j`` a snapshot buffers (at ``j``)."""
        self.data_before: list[int] = [0, *np.cumsum(data).tolist()]
        """How many frames before frame ``j`` are data changes (at ``j``)."""
        # The frames the state machine stops at: those that open, close or reset a snapshot,
        # and the buffered ones at the end seqno of the last marker before them (an open
        # snapshot completes there). The frames between are buffered, nothing more.
        markers = np.flatnonzero(marker)
        at_end = np.zeros(len(ops), dtype=bool)
        if len(markers):
            before = np.searchsorted(markers, np.arange(len(ops)))  # markers before frame j
            last = markers[np.maximum(before - 1, 0)]  # the last of them (any, where none)
            at_end = buffered & (before > 0) & seqno_valid & end_valid[last] & (seqno == end[last])
        self.points: list[int] = np.flatnonzero(at_end | (~buffered & (ops != OTHER))).tolist()

    def __len__(self) -> int:
        return len(self.ops)

    def value(self, name: str, j: int) -> Any:
        """Column ``name`` of frame ``j``, for the few frames that need more than the lists
        (the column becomes a list, in table order, the first time one is asked for)."""
        values = self._values.get(name)
        if values is None:
            values = self._values[name] = _array(self.table, name).to_pylist()
        return values[self.rows_list[j]]

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
    at the frames where something happens (:attr:`_Frames.points`)."""
    walk = _Walk(fr, state)
    for j in fr.points:
        walk.at_point(j)
    return walk.finish(eager)


class _Walk:
    """One vbucket's walk over its frames (:func:`_walk`), between the frames it stops at.

    The buffer of the open snapshot is a span of frames, :attr:`start` to the current one
    (those of them it buffers). :attr:`moved` is the last position moved to: the frame it is
    at, or (a marker's) just before, as (frame, before); :attr:`opened` the marker of the open
    snapshot (None: none is open; ``_KEPT``: as the state had it). Nothing reads them before
    the end, where the state gets them (:meth:`finish`)."""

    def __init__(self, fr: _Frames, state: VbState) -> None:
        self.fr = fr
        self.state = state
        self.out = _Walked()
        self.start = 0  # the buffer: the buffered frames from here to the current one
        self.snap_end: int | None = None
        self.oso = False
        self.moved: tuple[int, bool] | None = None
        self.opened: int | None = _KEPT

    def at_point(self, j: int) -> None:
        """What frame ``j``, one of :attr:`_Frames.points`, does: the row walk's loop body."""
        fr = self.fr
        op = fr.ops[j]
        if op < MARKER:  # a buffered frame at the end seqno of the last marker
            if not self.oso and self.snap_end is not None:
                self.complete(j + 1, j)
        elif op == MARKER:
            if not self.oso:
                self.complete(j, None)
                self.moved = (j, True)
            self.start, self.opened = j + 1, j
            self.snap_end = fr.end_seqno[j] if fr.end_valid[j] else None
        elif op == OSO:
            if fr.value("oso_flags", j) & OsoFlag.START:
                self.complete(j, None)
                self.moved = (j, True)
                self.oso, self.start, self.snap_end = True, j + 1, None
            else:
                self.complete(j, j)
                self.oso = False
        elif op == STREAM_END:
            if not self.oso:
                self.complete(j, j)
        elif op == RESPONSE:
            self.stream_response(j)

    def stream_response(self, j: int) -> None:
        """A stream request's response: a rollback, or a new stream whose failover log may
        branch below what was applied (a rollback to there)."""
        state = self.state
        rollback_seqno = self.fr.value("rollback_seqno", j)
        if rollback_seqno is not None:
            self.rollback(rollback_seqno)
            self.start, self.snap_end, self.oso = j + 1, None, False
            self.opened = None
            self.moved = (j, False)
        else:
            entries = self.fr.value("failover_log", j)
            if entries:  # a new stream: the open one is gone
                self.start, self.snap_end, self.oso = j + 1, None, False
                self.opened = None
                log = [(e["vb_uuid"], e["seqno"]) for e in entries]
                branch = branch_point(state.failover_log, log, state.last_applied_seqno)
                if branch is not None:
                    self.rollback(branch)
                state.failover_log = log
                state.vb_uuid = log[0][0]
                self.moved = (j, False)

    def rollback(self, seqno: int) -> None:
        out, seqnos = self.out, self.fr.by_seqno
        out.changes = [c for c in out.changes if seqnos[c] <= seqno]
        out.ended = [c for c in out.ended if seqnos[c] <= seqno]
        out.events = [e for e in out.events if seqnos[e[0]] <= seqno]
        out.rollbacks.append(seqno)
        retract(self.state, seqno)

    def system_event(self, j: int, clock: int) -> None:
        fr, state, out, seqnos = self.fr, self.state, self.out, self.fr.by_seqno
        cid = fr.value("collection_id", j)
        seqno = seqnos[j]
        kind = record_event(state, fr.value("event", j), cid, seqno, fr.value("manifest_uid", j))
        if kind in ENDING_EVENTS:
            gone = [c for c in out.changes if fr.collection[c] == cid and seqnos[c] < seqno]
            if gone:
                out.ended.extend(gone)
                ended = set(gone)
                out.changes = [c for c in out.changes if c not in ended]
        out.events.append((j, kind, clock))

    def complete(self, stop: int, closing: int | None) -> None:
        """The row walk's ``complete``, the buffer being the frames :attr:`start` to ``stop``."""
        fr, state, start = self.fr, self.state, self.start
        buffered = fr.buffered_before[stop] - fr.buffered_before[start]
        if not buffered and self.snap_end is None and closing is None:  # nothing to complete
            self.start, self.opened = stop, None
            return
        top = state.consistent_seqno
        dropped = state.dropped
        if not buffered:
            pass
        elif fr.data_before[stop] - fr.data_before[start] == stop - start and (
            not dropped or dropped.keys().isdisjoint(fr.collection[start:stop])
        ):  # data changes only, of collections not dropped: all commit, in one step
            top = self.commit_data(start, stop)
        else:
            top = self.commit_each(fr.buffered(start, stop))
        if self.snap_end is not None and not self.oso:
            top = max(top, self.snap_end)
        if buffered or self.snap_end is not None:
            state.consistent_seqno = top
        self.start = stop
        self.snap_end = None
        self.opened = None
        if closing is not None:
            self.moved = (closing, False)

    def commit_data(self, start: int, stop: int) -> int:
        """The frames ``start`` to ``stop``, data changes of collections not dropped, committed
        in one step; their highest seqno (or the consistent seqno)."""
        fr, state = self.fr, self.state
        highest: int = max(fr.by_seqno[start:stop])
        clock = max(fr.cas[start:stop])
        top = max(state.consistent_seqno, highest)
        if clock > state.last_cas:
            state.last_cas = clock
        self.out.changes.extend(range(start, stop))
        if highest > state.last_applied_seqno:
            state.last_applied_seqno = highest
        return top

    def commit_each(self, buffer: list[int]) -> int:
        """The buffered frames one by one, as the row walk's ``complete`` takes them; their
        highest seqno (or the consistent seqno)."""
        fr, state, out = self.fr, self.state, self.out
        ops, seqnos, cas_of, cid_of = fr.ops, fr.by_seqno, fr.cas, fr.collection
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
                self.system_event(j, max([state.last_cas, *earlier]))
        state.last_cas = clock
        return top

    def finish(self, eager: bool) -> _Walked:
        """The end of the frames: with ``eager``, the tail's data changes applied; the state
        gets its position, its open snapshot and its purge seqno."""
        fr, state = self.fr, self.state
        if eager and not self.oso:
            _apply_tail(fr, fr.buffered(self.start, len(fr)), state, self.out)
        if self.moved is not None:
            j, before = self.moved
            state.position = fr.before(j) if before else fr.position(j)
        if self.opened != _KEPT:
            opened = self.opened
            state.open_snapshot = (
                None
                if opened is None
                else (fr.value("start_seqno", opened), fr.value("end_seqno", opened))
            )
        if fr.purge_seqno is not None:
            state.purge_seqno = max(state.purge_seqno, fr.purge_seqno)
        return self.out


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


SMALL_GROUP = 64
"""Frames of a group below which the row walk is the faster (measured on 2 cores: at 32 frames
the row walk takes 0.77 of the columnar walk's time, at 64 as long, at 256 three times as
long)."""


def walk_vbuckets(table: pa.Table, out_schema: pa.Schema, eager: bool) -> pa.Table:
    """The frames of several vbuckets (a group of :func:`pipelines.silver.transforms.walk_frames`,
    its grouping column dropped) walked one vbucket at a time, as :func:`walk_group` walks
    each, each vbucket's rows summed up on its ``state`` row (:func:`walk_summary.summarize`,
    once for all). A group of some vbuckets, not one, saves Spark's cost per group (an Arrow
    stream each way) where a run brings a few frames to each of many vbuckets.

    The vbuckets of fewer than :data:`SMALL_GROUP` frames share their Arrow calls: their
    frames become dicts in one call, and their rows one table (with 1,024 vbuckets of some
    ten frames each, a table in and one out per vbucket would cost more than the walk)."""
    if not table.num_rows:
        return out_schema.empty_table()
    keys = table.column("vb_key").to_numpy()
    order = np.argsort(keys, kind="stable")
    table = table.take(order)  # one copy, each vbucket's rows then a slice of it
    starts = [0, *(np.flatnonzero(np.diff(keys[order])) + 1).tolist(), table.num_rows]
    bounds = list(itertools.pairwise(starts))
    small = [(a, b) for a, b in bounds if b - a < SMALL_GROUP]
    if len(small) < len(bounds):  # the small vbuckets' rows only
        picked = np.concatenate([np.arange(a, b) for a, b in small] or [np.zeros(0, np.int64)])
        frames = iter(table.take(pa.array(picked, pa.int64())).to_pylist())
    else:
        frames = iter(table.to_pylist())
    walked: list[pa.Table] = []
    rows: list[dict[str, Any]] = []  # the small vbuckets' rows since the last large one
    source = _gatherable(table, out_schema)
    large = _Output(source, out_schema)  # the large ones' since the last small one
    for a, b in bounds:
        if b - a < SMALL_GROUP:
            if large.size:
                walked.append(large.table())
                large = _Output(source, out_schema)
            rows += walked_rows(list(itertools.islice(frames, b - a)), out_schema.names, eager)
            continue
        if rows:
            walked.append(pa.Table.from_pylist(rows, out_schema))
            rows = []
        large.add(a, *_walk_group(table.slice(a, b - a), eager))
    if rows:
        walked.append(pa.Table.from_pylist(rows, out_schema))
    if large.size:
        walked.append(large.table())
    return summarize(pa.concat_tables(walked))


def walk_group(table: pa.Table, out_schema: pa.Schema, eager: bool) -> pa.Table:
    """One vbucket's frames walked from its saved state into rows of
    :data:`pipelines.schemas.WALKED`: by :func:`walk_group_columns`, or for a group of fewer
    than :data:`SMALL_GROUP` frames by :func:`pipelines.silver.walk.walk_group_rows` (both give
    the same table)."""
    if table.num_rows < SMALL_GROUP:
        return walk_group_rows(table, out_schema, eager)
    return walk_group_columns(table, out_schema, eager)


def walk_group_columns(table: pa.Table, out_schema: pa.Schema, eager: bool) -> pa.Table:
    """:func:`pipelines.silver.walk.walk_group_rows`, over the group's columns."""
    out = _Output(_gatherable(table, out_schema), out_schema)
    out.add(0, *_walk_group(table, eager))
    return out.table()


def _walk_group(table: pa.Table, eager: bool) -> tuple[int, np.ndarray, _Walked, dict[str, Any]]:
    """One vbucket's group walked: its vbucket, its frames' rows in ``table``, what the walk
    found, and the values of its ``state`` row."""
    vb = table.column("vb_key")[0].as_py()
    text = table.column("saved_state")[0].as_py()
    saved = json.loads(text) if text else None
    state = VbState.from_json(saved) if saved else VbState(vb)
    seen = saved.get("seen_version", 0) if saved else 0
    order = _Order(table)
    first = order.first_after(state.position)
    late_after = _first(table, "late_after")
    run_versions = _values(_array(table, "run_version"))
    late = bool(
        late_after is not None
        and first
        and run_versions[order.rows[:first]].max() > late_threshold(late_after, seen)
    )
    frames = _Frames(table, order, first)
    walked = _walk(frames, state, eager)
    unconsumed = last_read = None
    if len(frames):
        after = order.first_after(state.position, first)
        if after < len(order.rows):
            unconsumed = _run_at(table, int(order.rows[after]))
        last_read = _run_at(table, int(order.rows[-1]))
    position_run, position_version = next_position(
        unconsumed, last_read, saved, _first(table, "read_through")
    )
    seen = max(seen, int(run_versions.max()))
    last = {
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
        "late": late,
    }
    return vb, frames.rows, walked, last


def _first(table: pa.Table, name: str) -> Any:
    """Column ``name``'s first value (one value for the whole group), None without it."""
    return table.column(name)[0].as_py() if name in table.schema.names else None


def _run_at(table: pa.Table, row: int) -> tuple[str, int]:
    """The ingest run (id, version) of the group's ``row``."""
    return table.column("ingest_run_id")[row].as_py(), table.column("run_version")[row].as_py()


_SET_BY_WALK = frozenset(
    ("kind", "vbucket", "state", "frames", "ignored", "position_run_id", "late")
)
"""The columns of a walked row the walk fills itself, whatever its frame has."""


class _Output:
    """The rows of ``out_schema`` the row walk gives, for the groups walked over ``table`` (each
    a slice of it, :meth:`add` in order), built once for them all (:meth:`table`): per group,
    in its order, the committed changes, the ended ones, the system events (their frames' own
    columns gathered from ``table``, the walk's values laid over them), then a row per
    rollback and the ``state`` row. A handful of Arrow calls per chunk of groups, not per
    group: with 1,024 vbuckets, the calls of a table per vbucket cost more than their work."""

    def __init__(self, source: pa.Table, out_schema: pa.Schema) -> None:
        self.source, self.out_schema = source, out_schema  # :func:`_gatherable`'s
        self.rows: list[np.ndarray] = []  # per group: its rows' frames in ``table``, -1: none
        self.kinds: list[str] = []
        self.vbuckets: list[np.ndarray] = []
        self.own: dict[str, dict[int, Any]] = {}  # column -> output row -> the walk's value
        self.size = 0

    def add(
        self, offset: int, vb: int, rows: np.ndarray, walked: _Walked, last: dict[str, Any]
    ) -> None:
        """A group's rows: ``rows``, its frames' rows in its slice, which starts at
        ``offset`` of the table."""
        picked = [*walked.changes, *walked.ended, *(j for j, _, _ in walked.events)]
        counts = [len(walked.changes), len(walked.ended), len(walked.events)]
        counts += [len(walked.rollbacks), 1]
        body, n = len(picked), sum(counts)
        at = np.full(n, -1, dtype=np.int64)
        at[:body] = rows[np.array(picked, dtype=np.int64)] + offset
        self.rows.append(at)
        for kind, count in zip(_KINDS, counts, strict=True):
            self.kinds += [kind.value] * count
        self.vbuckets.append(np.full(n, vb, dtype=np.int64))
        first = self.size + counts[0] + counts[1]
        for i, (_, event, clock) in enumerate(walked.events):
            self.own.setdefault("event", {})[first + i] = event
            self.own.setdefault("cas", {})[first + i] = clock
        for i, seqno in enumerate(walked.rollbacks):
            self.own.setdefault("rollback_seqno", {})[self.size + body + i] = seqno
        for name, value in last.items():
            self.own.setdefault(name, {})[self.size + n - 1] = value
        self.size += n

    def table(self) -> pa.Table:
        n = self.size
        rows = np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)
        taken = self.source.take(pa.array(rows, mask=rows < 0))  # the rows of no frame: nulls
        gathered = dict(zip(self.source.column_names, taken.columns, strict=True))
        arrays: list[pa.Array | pa.ChunkedArray] = []
        for name, type_ in _fields(self.out_schema):
            column: pa.Array | pa.ChunkedArray
            if name == "kind":
                column = pa.array(self.kinds, type_, size=n)
            elif name == "vbucket":
                vbuckets = np.concatenate(self.vbuckets) if self.vbuckets else rows
                column = pa.array(vbuckets.astype(type_.to_pandas_dtype()), type_)
            elif name in self.own and name not in gathered:
                values: list[Any] = [None] * n
                for i, value in self.own[name].items():
                    values[i] = value
                column = pa.array(values, type_)
            elif name in gathered:
                column = gathered[name]
                if name in self.own:
                    column = _laid_over(_one(column), self.own[name], n)
            else:
                column = pa.nulls(n, type_)
            arrays.append(column if column.type == type_ else column.cast(type_))
        return pa.Table.from_arrays(arrays, schema=self.out_schema)


def _gatherable(table: pa.Table, out_schema: pa.Schema) -> pa.Table:
    """The columns of ``table`` an :class:`_Output` gathers (those of ``out_schema`` the walk
    does not set itself), each in one chunk: prepared once for all the groups of ``table``."""
    present = set(table.schema.names) - _SET_BY_WALK
    source = table.select([name for name in out_schema.names if name in present])
    if any(c.num_chunks > 1 for c in source.columns):
        source = source.combine_chunks()
    return source


def _laid_over(column: pa.Array, values: dict[int, Any], n: int) -> pa.Array:
    """``column`` with ``values`` (output row -> value) in place of its own."""
    mask = np.zeros(n, bool)
    at = np.fromiter(values, np.int64, len(values))
    mask[at] = True
    order = np.argsort(at)
    replacements = pa.array([values[int(i)] for i in at[order]], column.type)
    return pc.replace_with_mask(column, pa.array(mask), replacements)


_last_fields: list[tuple[pa.Schema, list[tuple[str, pa.DataType]]]] = []


def _fields(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    """``schema``'s names and types, kept for the schema last asked about (pyarrow builds them
    anew on each call; a task walks every group with one schema)."""
    if not _last_fields or _last_fields[0][0] is not schema:
        _last_fields[:] = [(schema, list(zip(schema.names, schema.types, strict=True)))]
    return _last_fields[0][1]


def _one(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
