"""The per-vbucket walk of silver (pure Python): which changes commit, and when.

Frames are written by hand as the bronze columns the walk reads; spec sections as cited.
"""

from __future__ import annotations

from typing import Any

from pipelines.silver.walk import VbState, walk

VB = 7


class Stream:
    """Frames of one session for vbucket ``VB``, at increasing offsets."""

    def __init__(self, session: str = "s1", started: str = "2026-01-01T00:00:00") -> None:
        self.session, self.started, self.offset = session, started, 0
        self.frames: list[dict[str, Any]] = []

    def add(self, op: str, **fields: Any) -> Stream:
        self.offset += 100
        frame = dict.fromkeys(
            (
                "by_seqno",
                "rev_seqno",
                "collection_id",
                "start_seqno",
                "end_seqno",
                "purge_seqno",
                "oso_flags",
                "rollback_seqno",
                "failover_log",
                "event",
                "manifest_uid",
                "key",
                "cas",
            )
        )
        frame.update(
            op=op,
            session_started_at=self.started,
            session_id=self.session,
            file_sequence=0,
            offset=self.offset,
            vbucket=VB,
        )
        frame.update(fields)
        self.frames.append(frame)
        return self

    def opened(self, *log: tuple[int, int]) -> Stream:
        """A stream accepted with this failover log (newest entry first; docs/protocol/dcp.md §6.1)."""
        entries = [{"vb_uuid": u, "seqno": s} for u, s in (log or ((0xAA, 0),))]
        return self.add("stream_request_response", failover_log=entries)

    def marker(self, start: int, end: int) -> Stream:
        return self.add("snapshot_marker", start_seqno=start, end_seqno=end)

    def mutation(self, seqno: int, key: str = "k", cid: int = 0) -> Stream:
        return self.add(
            "mutation", by_seqno=seqno, rev_seqno=1, key=key, collection_id=cid, cas=cas_of(seqno)
        )

    def deletion(self, seqno: int, key: str = "k", cid: int = 0) -> Stream:
        return self.add(
            "deletion", by_seqno=seqno, rev_seqno=2, key=key, collection_id=cid, cas=cas_of(seqno)
        )


def cas_of(seqno: int) -> int:
    """The CAS the test streams give the change at ``seqno`` (a clock rising with it)."""
    return 0x17A8B0D8E6F40000 + (seqno << 16)


def seqnos(changes: list[dict[str, Any]]) -> list[int]:
    return [c["by_seqno"] for c in changes]


def test_a_snapshot_commits_when_its_end_seqno_arrives() -> None:
    """docs/protocol/dcp.md §6.3: an item at the marker's end seqno completes the snapshot."""
    s = Stream().opened().marker(1, 3).mutation(1, "a").mutation(3, "b")
    result = walk(s.frames, VbState(VB))
    assert seqnos(result.changes) == [1, 3]
    assert result.state.consistent_seqno == 3
    assert result.state.open_snapshot is None
    assert result.state.position == ("2026-01-01T00:00:00", "s1", 0, 400)


def test_the_tail_of_an_unfinished_snapshot_waits_for_a_later_run() -> None:
    s = Stream().opened().marker(1, 2).mutation(1).mutation(2).marker(3, 9).mutation(4, "x")
    result = walk(s.frames, VbState(VB))
    assert seqnos(result.changes) == [1, 2]
    assert result.state.consistent_seqno == 2
    assert result.state.open_snapshot == (3, 9)
    # the next run starts just before the open snapshot's marker
    assert result.state.position == ("2026-01-01T00:00:00", "s1", 0, 500 - 1)


def test_eager_apply_takes_the_tail_without_moving_the_consistent_point() -> None:
    s = Stream().opened().marker(1, 2).mutation(1).mutation(2).marker(3, 9).mutation(4, "x")
    result = walk(s.frames, VbState(VB), eager=True)
    assert seqnos(result.changes) == [1, 2, 4]
    assert result.state.consistent_seqno == 2
    assert result.state.last_applied_seqno == 4  # a rollback below 4 must retract it
    assert result.state.position == ("2026-01-01T00:00:00", "s1", 0, 499)


def test_eager_apply_leaves_a_collection_created_inside_the_tail_for_later() -> None:
    s = (
        Stream()
        .opened()
        .marker(1, 9)
        .add("system_event", event="create_collection", collection_id=8, by_seqno=1, manifest_uid=2)
        .mutation(2, "new", cid=8)
        .mutation(3, "old", cid=0)
    )
    result = walk(s.frames, VbState(VB), eager=True)
    assert [c["key"] for c in result.changes] == ["old"]
    assert result.system_events == []


def test_seqno_advanced_completes_a_snapshot() -> None:
    """docs/protocol/dcp.md §6.3/§6.8: a seqno-advanced to the end seqno closes the snapshot."""
    s = Stream().opened().marker(1, 5).mutation(2).add("seqno_advanced", by_seqno=5)
    result = walk(s.frames, VbState(VB))
    assert seqnos(result.changes) == [2]
    assert result.state.consistent_seqno == 5


def test_an_oso_backfill_commits_only_at_its_end_marker() -> None:
    """docs/protocol/dcp.md §6.9: OSO items arrive in key order; nothing is consistent before the end."""
    start = Stream().opened().add("oso_snapshot", oso_flags=0x01).mutation(9, "a").mutation(4, "b")
    assert walk(start.frames, VbState(VB)).changes == []
    done = Stream().opened().add("oso_snapshot", oso_flags=0x01).mutation(9, "a")
    done.mutation(4, "b").add("oso_snapshot", oso_flags=0x02)
    result = walk(done.frames, VbState(VB))
    assert seqnos(result.changes) == [9, 4]
    assert result.state.consistent_seqno == 9


def test_a_rollback_response_retracts_what_came_after_its_seqno() -> None:
    """docs/protocol/dcp.md §7.5: status 0x23 carries the seqno to roll back to."""
    first = Stream().opened().marker(1, 4).mutation(2).mutation(4)
    state = walk(first.frames, VbState(VB)).state
    second = Stream("s2", "2026-01-02T00:00:00").add("stream_request_response", rollback_seqno=2)
    second.opened((0xBB, 2), (0xAA, 0)).marker(3, 3).mutation(3, "c")
    result = walk(second.frames, state)
    assert result.rollbacks == [2]
    assert seqnos(result.changes) == [3]
    assert result.state.vb_uuid == 0xBB
    assert result.state.consistent_seqno == 3


def test_a_new_failover_branch_below_what_was_applied_is_a_rollback() -> None:
    """docs/protocol/dcp.md §7.4: the new log's entry after our uuid starts the branch we did not see."""
    first = Stream().opened().marker(1, 6).mutation(3).mutation(6)
    state = walk(first.frames, VbState(VB)).state
    second = Stream("s2", "2026-01-02T00:00:00").opened((0xBB, 4), (0xAA, 0))
    result = walk(second.frames, state)
    assert result.rollbacks == [4]
    assert result.state.last_applied_seqno == 4


def test_a_drop_removes_earlier_changes_and_ignores_later_ones() -> None:
    """docs/protocol/dcp.md §6.7: after the drop at seqno 3, collection 8 no longer exists in this vbucket."""
    s = (
        Stream()
        .opened()
        .marker(1, 5)
        .mutation(1, "a", cid=8)
        .add("system_event", event="drop_collection", collection_id=8, by_seqno=3, manifest_uid=3)
        .mutation(4, "b", cid=8)
        .mutation(5, "c", cid=0)
    )
    result = walk(s.frames, VbState(VB))
    assert [c["key"] for c in result.changes] == ["c"]
    assert result.ignored == 1
    assert result.state.dropped == {8: 3}
    # the change the drop removed is still a version (history tables keep it), and the drop
    # carries the time of the vbucket's last change before it: DCP gives it CAS 0 (§1.5)
    assert [c["key"] for c in result.ended] == ["a"]
    assert [e["cas"] for e in result.system_events] == [cas_of(1)]


def test_a_repeated_create_is_a_flush() -> None:
    """docs/protocol/dcp.md §6.7: a create of a known collection at a newer seqno flushes it."""
    s = (
        Stream()
        .opened()
        .marker(1, 4)
        .add("system_event", event="create_collection", collection_id=8, by_seqno=1)
        .mutation(2, "a", cid=8)
        .add("system_event", event="create_collection", collection_id=8, by_seqno=3)
        .mutation(4, "b", cid=8)
    )
    result = walk(s.frames, VbState(VB))
    assert [c["key"] for c in result.changes] == ["b"]
    assert [c["key"] for c in result.ended] == ["a"]
    assert [e["kind"] for e in result.system_events] == ["create_collection", "flush_collection"]
    assert [e["cas"] for e in result.system_events] == [0, cas_of(2)]


def test_an_event_carries_the_clock_of_earlier_snapshots_and_runs() -> None:
    """The last CAS of a vbucket is kept in its state: an event at the start of a snapshot, or
    of the next run, has the time of the change before it; a rollback keeps its versions out of
    the history it retracts."""
    first = Stream().opened().marker(1, 2).mutation(1, "a", cid=8).mutation(2, "b", cid=8)
    state = walk(first.frames, VbState(VB)).state
    assert state.last_cas == cas_of(2)
    state = VbState.from_json(state.to_json())
    s = Stream("s2", "2026-01-02T00:00:00").marker(3, 4)
    s.add("system_event", event="flush_collection", collection_id=8, by_seqno=3).mutation(4, "c")
    s.add("stream_request_response", rollback_seqno=3)
    result = walk(s.frames, state)
    assert [e["cas"] for e in result.system_events] == [cas_of(2)]
    assert result.state.last_cas == cas_of(4) and result.changes == result.ended == []


def test_state_survives_its_json_round_trip() -> None:
    s = Stream().opened().marker(1, 2).mutation(1).mutation(2).marker(3, 9).mutation(4)
    state = walk(s.frames, VbState(VB)).state
    assert VbState.from_json(state.to_json()) == state
