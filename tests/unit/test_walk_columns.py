"""The columnar walk (``pipelines/silver/walk_columns.py``) gives what the row walk
(``walk_group_rows`` over ``pipelines/silver/walk.py``, the rules as written) gives: the same
table, row for row, state JSON included.

Hypothesis draws streams of one vbucket over several sessions and files: snapshots whose end
seqno arrives or not, seqno-advanced, OSO backfills, stream ends, rollback responses, new
streams whose failover log branches or not, collection creates, drops, flushes and other
system events, frames of dropped collections, unfinished tails (eager or not), the group's rows
in any order, cut into record batches of any size, its arrays at an offset into their buffers
and with other values than 0 under their nulls; walked from a fresh state, from a drawn
one, and in two runs (the second from the state the first saved). A simulation decoded as
bronze decodes it is walked both ways as well.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcp_cdc.simulator import simulate
from pipelines import schemas
from pipelines.silver.walk import walk_group_rows
from pipelines.silver.walk_columns import (
    SMALL_GROUP,
    walk_group,
    walk_group_columns,
    walk_vbuckets,
)
from pipelines.silver.walk_summary import summarize
from tests.support.walk_groups import group_table, groups_from_captures

OUT = schemas.arrow_schema(schemas.WALKED)
VB = 7
UUIDS = (0xAA, 0xBB, 0xCC, 0xDD)
COLLECTIONS = (None, 0, 8, 9)
EVENTS = (
    "create_collection",
    "drop_collection",
    "flush_collection",
    "modify_collection",
    "create_scope",
    "drop_scope",
)
MANY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

small = st.integers(0, 12)
failover_logs = st.lists(st.tuples(st.sampled_from(UUIDS), small), min_size=1, max_size=3)

data_ops = st.sampled_from(("mutation", "mutation", "deletion", "expiration"))
data_step = st.tuples(
    st.just("data"),
    data_ops,
    st.sampled_from(COLLECTIONS),
    st.integers(-2, 3),
    st.sampled_from(("rising", "rising", "none", "zero", "negative")),
)
event_step = st.tuples(
    st.just("event"),
    st.sampled_from(EVENTS),
    st.sampled_from((None, 8, 9)),
    st.one_of(st.none(), small),
    st.sampled_from((1, 1, 0, -1)),
)
# a whole snapshot: its marker, then one item per seqno up to its end (it completes)
snapshot_step = st.tuples(
    st.just("snapshot"),
    st.lists(
        st.one_of(
            st.tuples(
                st.just("data"), data_ops, st.sampled_from((0, 8, 9)), st.just(1), st.just("rising")
            ),
            st.tuples(
                st.just("data"), data_ops, st.sampled_from((0, 8, 9)), st.just(1), st.just("rising")
            ),
            event_step,
        ),
        min_size=1,
        max_size=6,
    ),
)
# a snapshot whose end is still far: the stream's tail, if nothing follows it
unfinished_step = st.tuples(
    st.just("unfinished"),
    st.lists(
        st.one_of(
            st.tuples(
                st.just("data"), data_ops, st.sampled_from((0, 8, 9)), st.just(1), st.just("rising")
            ),
            event_step,
        ),
        max_size=5,
    ),
)
# a drop of a collection, then a snapshot of data changes only, some of that collection
dropped_step = st.tuples(
    st.just("dropped"),
    st.sampled_from((8, 9)),
    st.lists(st.sampled_from((0, 8, 9)), min_size=1, max_size=5),
)
# One step of a stream: what it adds, and the drawn values it needs; the common ones are
# listed more than once (one_of draws its branches alike).
steps = st.one_of(
    snapshot_step,
    snapshot_step,
    snapshot_step,
    unfinished_step,
    dropped_step,
    data_step,
    data_step,
    st.tuples(st.just("marker"), st.integers(-1, 4), st.one_of(st.none(), small), st.booleans()),
    st.tuples(st.just("advance"), st.integers(0, 2)),
    event_step,
    st.tuples(st.just("open"), st.one_of(failover_logs, st.just([]), st.none())),
    st.tuples(st.just("rollback"), small),
    st.tuples(st.just("oso"), st.sampled_from((1, 2, 2, 0, 3))),
    st.tuples(st.just("end")),
    st.tuples(st.just("file")),
    st.tuples(st.sampled_from(("noop", None))),
)


class _Writer:
    """Frames of one vbucket, built step by step: positions in session order, seqnos that
    mostly rise, and a CAS clock that does."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.seqno = 0
        self.cas = 0x17A8_B0D8_0000_0000
        self.session = ("", "s0", 0)
        self.offset = 0

    def start_session(self, started: str | None, session_id: str) -> None:
        self.session = (started, session_id, 0)  # type: ignore[assignment]
        self.offset = 0

    def add(self, op: str | None, *, tie: bool = False, **fields: Any) -> None:
        started, session_id, sequence = self.session
        self.offset += 0 if tie and self.offset else 24 + len(self.frames) % 7
        frame = {
            "vb_key": VB,
            "op": op,
            "vbucket": VB,
            "session_started_at": started,
            "session_id": session_id,
            "file_sequence": sequence,
            "offset": self.offset,
            "ingest_run_id": "run-1",
            "run_version": 1,
        }
        frame.update(fields)
        self.frames.append(frame)

    def step(self, step: tuple[Any, ...], tie: bool) -> None:
        kind = step[0]
        if kind == "open":
            log = step[1]
            entries = None if log is None else [{"vb_uuid": u, "seqno": s} for u, s in log]
            self.add("stream_request_response", status=0, opaque=VB, failover_log=entries)
        elif kind == "rollback":
            self.add("stream_request_response", status=0x23, opaque=VB, rollback_seqno=step[1])
        elif kind == "dropped":
            _, cid, later = step
            self.step(("snapshot", [("event", "drop_collection", cid, None, 1)]), tie)
            data = [("data", "mutation", c, 1, "rising") for c in later]
            self.step(("snapshot", data), tie)
        elif kind in ("snapshot", "unfinished"):
            items = step[1]
            self.step(("marker", len(items) + (kind == "unfinished") * 5, None, True), tie)
            for item in items:
                self.step(item, tie)
        elif kind == "marker":
            _, length, purge, known_end = step
            start, end = self.seqno + 1, self.seqno + length
            self.add(
                "snapshot_marker",
                start_seqno=start,
                end_seqno=end if known_end else None,
                purge_seqno=purge,
            )
        elif kind == "data":
            _, op, cid, delta, clock = step
            self.seqno = max(1, self.seqno + delta)
            self.cas += 1 << 16
            cas = {"rising": self.cas, "none": None, "zero": 0, "negative": -5}[clock]
            self.add(
                op,
                tie=tie,
                by_seqno=self.seqno,
                rev_seqno=self.seqno % 5 + 1,
                cas=cas,
                collection_id=cid,
                key=f"k{self.seqno % 6}".encode(),
                value=None if op != "mutation" else b'{"n": %d}' % self.seqno,
                is_json=op == "mutation",
                xattrs=[("_sync", "x"), ("user", str(self.seqno))] if self.seqno % 3 == 0 else None,
                flags=self.seqno % 2,
                expiration=0,
                in_vb_uuid=0xAA,
            )
        elif kind == "advance":
            self.add("seqno_advanced", by_seqno=self.seqno + step[1])
        elif kind == "event":
            _, event, cid, manifest, delta = step
            self.seqno = max(1, self.seqno + delta)
            self.add(
                "system_event",
                by_seqno=self.seqno,
                cas=0,
                event=event,
                collection_id=cid,
                manifest_uid=manifest,
                scope_id=0,
                name=f"c{cid}",
                max_ttl=None,
                history=False,
            )
        elif kind == "oso":
            self.add("oso_snapshot", oso_flags=step[1])
        elif kind == "end":
            self.add("stream_end", status=None)
        elif kind == "file":
            started, session_id, sequence = self.session
            self.session = (started, session_id, sequence + 1)
            self.offset = 0
        else:
            self.add(kind)


@st.composite
def streams(draw: st.DrawFn) -> list[dict[str, Any]]:
    """The frames of one vbucket over one to three sessions, in the order they were written."""
    writer = _Writer()
    for i in range(draw(st.integers(1, 3))):
        started = draw(st.sampled_from((None, "", "2026-01-01T00:00:00", "2026-01-02T00:00:00")))
        writer.start_session(started, f"s{draw(st.integers(0, 2))}-{i}")
        for step in draw(st.lists(steps, max_size=25)):
            writer.step(step, tie=draw(st.integers(0, 30)) == 0)
    return writer.frames


@st.composite
def saved_states(draw: st.DrawFn, frames: list[dict[str, Any]]) -> dict[str, Any]:
    """A state as an earlier run saved it: somewhere among ``frames`` or before them all."""
    position = None
    if frames and draw(st.booleans()):
        f = draw(st.sampled_from(frames))
        offset = f["offset"] - draw(st.integers(0, 1))
        position = [f["session_started_at"] or "", f["session_id"], f["file_sequence"], offset]
    cids = st.sampled_from((0, 8, 9))
    return {
        "vbucket": VB,
        "position": position,
        "consistent_seqno": draw(small),
        "last_applied_seqno": draw(small),
        "vb_uuid": draw(st.one_of(st.none(), st.sampled_from(UUIDS))),
        "failover_log": [list(e) for e in draw(st.lists(st.tuples(st.sampled_from(UUIDS), small)))],
        "manifest_uid": draw(small),
        "purge_seqno": draw(small),
        "known": {str(c): s for c, s in draw(st.dictionaries(cids, small)).items()},
        "dropped": {str(c): s for c, s in draw(st.dictionaries(cids, small)).items()},
        "open_snapshot": draw(st.one_of(st.none(), st.tuples(small, small).map(list))),
        "last_cas": draw(st.integers(0, 1 << 62)),
        "run_id": draw(st.one_of(st.none(), st.just("run-0"))),
        "position_version": 0,
        "seen_version": draw(st.integers(0, 3)),
    }


layouts = st.tuples(
    st.lists(st.integers(1, 40), min_size=1, max_size=4),
    st.sampled_from((0, 0, 1, 3)),
    st.sampled_from((None, 8, 1 << 62)),
)
"""How a group's table is laid out: record batch sizes, the arrays' offset into their
buffers, what integer columns hold under their nulls (``group_table``): pyarrow's 0, a
collection id, a seqno or CAS above all others."""


def _both(
    rows: list[dict[str, Any]], layout: tuple[list[int], int, int | None], eager: bool
) -> pa.Table:
    """Walk the group both ways; the row walk's table, once both are shown equal."""
    batch_rows, offset, garbage = layout
    table = group_table(rows, batch_rows, offset=offset, garbage=garbage)
    expected = walk_group_rows(table, OUT, eager)
    got = walk_group_columns(table, OUT, eager)
    assert got.schema == expected.schema
    assert got.to_pylist() == expected.to_pylist()
    assert got.equals(expected)
    return expected


@MANY
@given(streams(), st.data(), layouts, st.booleans())
def test_one_run_from_a_fresh_or_a_saved_state(
    frames: list[dict[str, Any]], data: st.DataObject, layout: Any, eager: bool
) -> None:
    frames = data.draw(st.permutations(frames)) if frames else frames
    saved = data.draw(st.one_of(st.none(), saved_states(frames)))
    text = None if saved is None else json.dumps(saved)
    late_after = data.draw(st.one_of(st.none(), st.integers(0, 2)))
    read_through = data.draw(st.one_of(st.none(), st.integers(1, 3)))
    rows = [
        {**f, "saved_state": text, "late_after": late_after, "read_through": read_through}
        for f in frames
    ]
    if rows:
        _both(rows, layout, eager)


@MANY
@given(streams(), st.data(), layouts, st.booleans())
def test_two_runs_the_second_from_the_state_the_first_saved(
    frames: list[dict[str, Any]], data: st.DataObject, layout: Any, eager: bool
) -> None:
    if not frames:
        return
    cut = data.draw(st.integers(1, len(frames)))
    first = group_table(frames[:cut])
    walked = walk_group_rows(first, OUT, eager)
    state = walked.filter(pa.compute.equal(walked["kind"], "state"))["state"][0].as_py()
    late_after = data.draw(st.one_of(st.none(), st.just(1)))
    second = [
        {**f, "ingest_run_id": "run-2", "run_version": 2, "saved_state": state}
        if i >= cut
        else {**f, "saved_state": state}
        for i, f in enumerate(frames)
    ]
    read_through = data.draw(st.one_of(st.none(), st.just(2)))
    second = [{**f, "late_after": late_after, "read_through": read_through} for f in second]
    _both(data.draw(st.permutations(second)), layout, eager)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[pa.Table]:
    out = tmp_path_factory.mktemp("walk") / "sim"
    result = simulate(out, scenario="mixed", seed=3, vbuckets=4, docs=200, ops=1500)
    return groups_from_captures(Path(result.out) / "landing")


@pytest.mark.parametrize("eager", [False, True])
def test_a_simulation_decoded_as_bronze_decodes_it(simulated: list[pa.Table], eager: bool) -> None:
    kinds: set[str] = set()
    for table in simulated:
        expected = walk_group_rows(table, OUT, eager)
        got = walk_group_columns(table, OUT, eager)
        assert got.to_pylist() == expected.to_pylist()
        assert got.equals(expected)
        kinds |= set(expected["kind"].to_pylist())
    assert {"change", "system_event", "rollback", "state"} <= kinds


def test_a_group_of_several_vbuckets_in_any_order_walks_each_as_its_own_group(
    simulated: list[pa.Table],
) -> None:
    """``walk_vbuckets`` (what silver's ``applyInArrow`` runs on a group of vbuckets, their
    frames interleaved): each vbucket's rows are those of its own group, summed up on its
    ``state`` row."""
    assert len(simulated) > 1
    together = pa.concat_tables(simulated)
    shuffled = together.take(np.random.default_rng(5).permutation(together.num_rows))
    got = walk_vbuckets(shuffled, OUT, False)
    expected = pa.concat_tables([summarize(walk_group(t, OUT, False)) for t in simulated])
    assert got.to_pylist() == expected.to_pylist()
    assert walk_vbuckets(together.slice(0, 0), OUT, False).num_rows == 0


@pytest.mark.parametrize("eager", [False, True])
def test_many_small_vbuckets_beside_large_ones_walk_as_each_alone(
    simulated: list[pa.Table], tmp_path: Path, eager: bool
) -> None:
    """``walk_vbuckets`` walks the vbuckets of fewer than SMALL_GROUP frames together (one
    table in, one out): with large vbuckets between them, each vbucket's rows are still those
    its own walk gives, in vbucket order."""
    result = simulate(tmp_path / "sim", scenario="mixed", seed=8, vbuckets=48, docs=60, ops=300)
    small = groups_from_captures(Path(result.out) / "landing")
    large = [  # the 4-vbucket simulation's groups, as vbuckets 100 and on
        t.set_column(
            t.schema.get_field_index("vb_key"),
            "vb_key",
            pa.array([100 + i] * t.num_rows, pa.int32()),
        )
        for i, t in enumerate(simulated)
    ]
    sizes = [t.num_rows for t in small + large]
    assert min(sizes) < SMALL_GROUP <= max(sizes), sizes
    groups = sorted(small + large, key=lambda t: t["vb_key"][0].as_py())
    together = pa.concat_tables([g.cast(groups[0].schema) for g in groups])
    shuffled = together.take(np.random.default_rng(9).permutation(together.num_rows))
    got = walk_vbuckets(shuffled, OUT, eager)
    expected = pa.concat_tables([summarize(walk_group(t, OUT, eager)) for t in groups])
    assert got.to_pylist() == expected.to_pylist()
    # large vbuckets between small ones: each run of large ones is built apart, in order
    between = [_with_vb(t, 10 * t["vb_key"][0].as_py()) for t in small]
    between += [_with_vb(t, 10 * i + 5) for i, t in enumerate(large)]
    groups = sorted(between, key=lambda t: t["vb_key"][0].as_py())
    together = pa.concat_tables([g.cast(groups[0].schema) for g in groups])
    got = walk_vbuckets(
        together.take(np.random.default_rng(3).permutation(len(together))), OUT, eager
    )
    expected = pa.concat_tables([summarize(walk_group(t, OUT, eager)) for t in groups])
    assert got.to_pylist() == expected.to_pylist()
    # every vbucket a small one
    alone = [summarize(walk_group(t, OUT, eager)) for t in small]
    only_small = pa.concat_tables([t.cast(small[0].schema) for t in small])
    assert walk_vbuckets(only_small, OUT, eager).to_pylist() == pa.concat_tables(alone).to_pylist()


def test_silver_walks_a_small_group_row_by_row_and_a_larger_one_by_columns(
    simulated: list[pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both walks give the same table; below SMALL_GROUP frames the row walk is the faster."""
    import pipelines.silver.walk_columns as walk_columns

    called: list[str] = []

    def spy(name: str, walker: Any) -> Any:
        def walked(*args: Any) -> pa.Table:
            called.append(name)
            return walker(*args)

        return walked

    monkeypatch.setattr(walk_columns, "walk_group_rows", spy("rows", walk_group_rows))
    monkeypatch.setattr(walk_columns, "walk_group_columns", spy("columns", walk_group_columns))
    table = simulated[0]
    assert table.num_rows > SMALL_GROUP
    walk_group(table.slice(0, SMALL_GROUP - 1), OUT, False)
    walk_group(table.slice(0, SMALL_GROUP), OUT, False)
    assert called == ["rows", "columns"]


def _late_flag(rows: list[dict[str, Any]], layout: Any = ([40], 0, None)) -> bool | None:
    walked = _both(rows, layout, eager=False)
    states = walked.filter(pa.compute.equal(walked["kind"], "state"))
    flags: list[bool | None] = states["late"].to_pylist()
    others = walked.filter(pa.compute.not_equal(walked["kind"], "state"))["late"]
    assert others.null_count == len(others)  # only the state row says it
    return flags[0]


@pytest.mark.parametrize(
    ("late_after", "late"),
    [(None, False), (1, True), (2, False)],
    ids=["not-checked", "run-2-is-late", "run-2-was-seen"],
)
def test_a_frame_of_a_later_run_at_or_before_the_saved_position_marks_its_vbucket_late(
    late_after: int | None, late: bool
) -> None:
    """A vbucket saved after a newer session's snapshot; run 2 (version 2) brings a snapshot
    of an older session (files that arrived late): it sorts before the saved position, so its
    vbucket is late when the walk checks runs after version 1, and not when run 2 was already
    seen (``late_after`` 2) or nothing is checked (state.late_vbuckets,
    pipelines/silver/state.py)."""
    w = _Writer()
    w.start_session("2026-01-02T00:00:00Z", "newer")
    w.step(("snapshot", [("data", "mutation", 0, 1, "rising")] * 2), tie=False)
    first = group_table(w.frames)
    walked = walk_group_rows(first, OUT, False)
    saved = walked.filter(pa.compute.equal(walked["kind"], "state"))["state"][0].as_py()
    assert json.loads(saved)["position"] is not None
    applied = len(w.frames)
    w.start_session("2026-01-01T00:00:00Z", "older")
    w.step(("snapshot", [("data", "mutation", 0, 1, "rising")]), tie=False)
    for f in w.frames[applied:]:
        f.update(ingest_run_id="run-2", run_version=2)
    rows = [{**f, "saved_state": saved, "late_after": late_after} for f in w.frames]
    assert _late_flag(rows) is late
    # the same frames in one run, without a saved position: nothing can be late
    fresh = [{**f, "saved_state": None, "late_after": late_after} for f in w.frames]
    assert _late_flag(fresh) is False


@pytest.mark.parametrize(
    ("seen", "late"), [(1, True), (2, False)], ids=["run-2-is-new-to-it", "it-saw-run-2"]
)
def test_a_vbucket_is_late_by_the_runs_it_saw_not_by_an_idle_one(seen: int, late: bool) -> None:
    """The apply's ``late_after`` is the oldest run any vbucket has seen (0 here: a vbucket
    idle since the first run). A frame read again from a run this vbucket saw (its state's
    ``seen_version``) is not late; one of a run after it is."""
    w = _Writer()
    w.start_session("2026-01-02T00:00:00Z", "newer")
    w.step(("snapshot", [("data", "mutation", 0, 1, "rising")] * 2), tie=False)
    walked = walk_group_rows(group_table(w.frames), OUT, False)
    saved = json.loads(walked.filter(pa.compute.equal(walked["kind"], "state"))["state"][0].as_py())
    applied = len(w.frames)
    w.start_session("2026-01-01T00:00:00Z", "older")
    w.step(("snapshot", [("data", "mutation", 0, 1, "rising")]), tie=False)
    for f in w.frames[applied:]:
        f.update(ingest_run_id="run-2", run_version=2)
    text = json.dumps({**saved, "seen_version": seen})
    rows = [{**f, "saved_state": text, "late_after": 0} for f in w.frames]
    assert _late_flag(rows) is late


def _saved_position(rows: list[dict[str, Any]]) -> tuple[str | None, int | None]:
    walked = _both(rows, ([40], 0, None), eager=False)
    state = json.loads(walked.filter(pa.compute.equal(walked["kind"], "state"))["state"][0].as_py())
    return state["run_id"], state["position_version"]


@pytest.mark.parametrize("read_through", [None, 3])
def test_the_next_read_starts_after_the_newest_run_read_once_every_frame_is_consumed(
    read_through: int | None,
) -> None:
    """Run 1 brings a whole snapshot, run 2 the marker and first change of another: the frame
    not consumed keeps the next apply's read at run 2, whatever was read after it. Once run 3
    brings the snapshot's end, every frame is consumed: the next read starts after the newest
    run the apply read (``read_through``), not at the run of the vbucket's last frame, which
    the next apply would read again (without it, as before)."""
    w = _Writer()
    w.start_session("2026-01-01T00:00:00Z", "s")
    w.step(("snapshot", [("data", "mutation", 0, 1, "rising")] * 2), tie=False)
    first = len(w.frames)
    w.step(("marker", 2, None, True), tie=False)
    w.step(("data", "mutation", 0, 1, "rising"), tie=False)
    second = len(w.frames)
    w.step(("data", "mutation", 0, 1, "rising"), tie=False)
    for f in w.frames[first:second]:
        f.update(ingest_run_id="run-2", run_version=2)
    for f in w.frames[second:]:
        f.update(ingest_run_id="run-3", run_version=3)
    extra = {"saved_state": None, "late_after": None, "read_through": read_through}
    open_snapshot = [{**f, **extra} for f in w.frames[:second]]
    assert _saved_position(open_snapshot) == ("run-2", 2)
    consumed = [{**f, **extra} for f in w.frames]
    assert _saved_position(consumed) == ("run-3", 4 if read_through else 3)


def _with_vb(table: pa.Table, vb: int) -> pa.Table:
    at = table.schema.get_field_index("vb_key")
    return table.set_column(at, "vb_key", pa.array([vb] * table.num_rows, pa.int32()))
