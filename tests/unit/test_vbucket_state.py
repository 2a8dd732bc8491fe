"""The placement's per-vbucket state machine, on its own: every cell of its table (each
allowed transition and each refused event), and the sequences a run's events make of it (a
stream end, a failover, a node loss, a move, the watch).

The expected table is written down here, not read from the module under test.
"""

from __future__ import annotations

import pickle

import pytest

from dcp_cdc.agent.vbucket_state import (
    DONE,
    FILTERED,
    IDLE,
    PLACING,
    SETTLING,
    STALLED,
    STREAMING,
    TRANSITIONS,
    VbEvent,
    VbStatus,
    VbucketStates,
)
from dcp_cdc.errors import AgentUsageError, DcpError, VbucketStateError

PLACE = VbEvent.PLACE
LET_GO = VbEvent.LET_GO
OPEN = VbEvent.OPEN
ROLLED_BACK = VbEvent.ROLLED_BACK
STREAM_END = VbEvent.STREAM_END
ENDED_OK = VbEvent.ENDED_OK
FILTER_EMPTY = VbEvent.FILTER_EMPTY
SETTLE = VbEvent.SETTLE
NODE_LOST = VbEvent.NODE_LOST
SETTLED = VbEvent.SETTLED
WATCHED = VbEvent.WATCHED

_ = None  # refused
COLUMNS = (
    PLACE, LET_GO, OPEN, ROLLED_BACK, STREAM_END, ENDED_OK, FILTER_EMPTY, SETTLE, NODE_LOST, SETTLED, WATCHED
)  # fmt: skip
TABLE: dict[VbStatus, tuple[VbStatus | None, ...]] = {
    #          PLACE    LET_GO    OPEN       ROLLED_BACK STREAM_END ENDED_OK FILTER_EMPTY SETTLE     NODE_LOST  SETTLED    WATCHED
    IDLE:      (PLACING, IDLE,     STREAMING, IDLE,      IDLE,      DONE,    FILTERED,    SETTLING,  SETTLING,  IDLE,      STALLED),
    STALLED:   (PLACING, STALLED,  STREAMING, STALLED,   STALLED,   DONE,    FILTERED,    SETTLING,  SETTLING,  STALLED,   _),
    PLACING:   (_,       IDLE,     STREAMING, PLACING,   PLACING,   DONE,    FILTERED,    PLACING,   PLACING,   PLACING,   _),
    STREAMING: (_,       STREAMING, STREAMING, STREAMING, IDLE,     DONE,    FILTERED,    STREAMING, SETTLING,  STREAMING, STALLED),
    SETTLING:  (PLACING, SETTLING, STREAMING, SETTLING,  SETTLING,  DONE,    FILTERED,    SETTLING,  SETTLING,  IDLE,      _),
    DONE:      (_,       DONE,     _,         DONE,      DONE,      DONE,    DONE,        DONE,      DONE,      DONE,      _),
    FILTERED:  (_,       FILTERED, _,         FILTERED,  FILTERED,  FILTERED, FILTERED,   FILTERED,  FILTERED,  FILTERED,  _),
}  # fmt: skip

REACH: dict[VbStatus, tuple[VbEvent, ...]] = {
    IDLE: (),
    STALLED: (WATCHED,),
    PLACING: (PLACE,),
    STREAMING: (OPEN,),
    SETTLING: (SETTLE,),
    DONE: (OPEN, ENDED_OK),
    FILTERED: (OPEN, FILTER_EMPTY),
}
"""A way from IDLE to each status."""

CELLS = [
    (status, event, row[i]) for status, row in TABLE.items() for i, event in enumerate(COLUMNS)
]


def _at(status: VbStatus, vb: int = 7) -> VbucketStates:
    states = VbucketStates([vb, vb + 1])
    for event in REACH[status]:
        states.handle(vb, event)
    assert states.status(vb) is status
    return states


def _walk(states: VbucketStates, vb: int, *steps: tuple[VbEvent, VbStatus]) -> None:
    for event, expected in steps:
        assert states.handle(vb, event) is expected, (event, expected)
        assert states.status(vb) is expected


def test_the_table_is_the_one_written_down() -> None:
    assert set(TABLE) == set(VbStatus) and set(COLUMNS) == set(VbEvent)
    written = {(s, e): to for s, e, to in CELLS if to is not None}
    assert written == TRANSITIONS


@pytest.mark.parametrize(
    ("status", "event", "to"),
    [c for c in CELLS if c[2] is not None],
    ids=lambda v: v.value if isinstance(v, VbStatus | VbEvent) else None,
)
def test_every_transition(status: VbStatus, event: VbEvent, to: VbStatus) -> None:
    states = _at(status)
    assert states.allows(7, event)
    assert states.handle(7, event) is to
    assert states.status(7) is to
    assert states.status(8) is IDLE, "another vbucket does not move"
    assert states.is_pending(7) == (to not in (DONE, FILTERED))


@pytest.mark.parametrize(
    ("status", "event"),
    [(s, e) for s, e, to in CELLS if to is None],
    ids=lambda v: v.value,
)
def test_every_refused_event_raises_and_leaves_the_status(status: VbStatus, event: VbEvent) -> None:
    states = _at(status)
    assert not states.allows(7, event)
    with pytest.raises(VbucketStateError) as info:
        states.handle(7, event)
    assert states.status(7) is status
    assert (info.value.vbucket, info.value.status, info.value.event) == (
        7,
        status.value,
        event.value,
    )
    assert str(info.value) == f"vbucket 7 is {status.value}: {event.value!r} is not allowed"


def test_a_vbucket_not_in_the_run() -> None:
    states = VbucketStates([1, 2])
    assert not states.allows(3, PLACE) and not states.is_pending(3)
    with pytest.raises(VbucketStateError, match="vbucket 3 is not in this run: 'place'"):
        states.handle(3, PLACE)
    with pytest.raises(VbucketStateError, match=r"^vbucket 3 is not in this run$"):
        states.status(3)


def test_the_error_is_a_usage_error_and_survives_pickling() -> None:
    err = VbucketStateError(4, "streaming", "place")
    assert isinstance(err, AgentUsageError) and isinstance(err, DcpError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.vbucket, copy.status, copy.event, str(copy)) == (
        4,
        "streaming",
        "place",
        "vbucket 4 is streaming: 'place' is not allowed",
    )


# --- the sequences a run makes ---


def test_until_now_a_stream_that_ends_ok() -> None:
    """place() holds it, open_many() asks for its stream, place() lets go, STREAM_END (OK)."""
    states = VbucketStates([0, 1])
    _walk(states, 0, (PLACE, PLACING), (OPEN, STREAMING), (LET_GO, STREAMING), (ENDED_OK, DONE))
    assert states.pending == {1}
    _walk(states, 0, (NODE_LOST, DONE), (SETTLED, DONE), (STREAM_END, DONE))  # late reports
    assert not states.allows(0, PLACE) and not states.allows(0, OPEN)


def test_a_stream_end_that_is_reopened() -> None:
    """STREAM_END (too slow, closed, refused for now): reopen() holds it for its backoff, lets
    go and asks again on the same connection."""
    states = VbucketStates([0])
    _walk(states, 0, (OPEN, STREAMING), (STREAM_END, IDLE))
    _walk(states, 0, (PLACE, PLACING), (LET_GO, IDLE), (OPEN, STREAMING))


def test_a_failover_in_until_now() -> None:
    """ROLLBACK: the connection asks again from the rollback point (still streaming); the
    lowered end closes the stream (reached()), which is asked for again and ends OK."""
    states = VbucketStates([0])
    _walk(
        states,
        0,
        (OPEN, STREAMING),
        (ROLLED_BACK, STREAMING),
        (ROLLED_BACK, STREAMING),
        (STREAM_END, IDLE),
        (PLACE, PLACING),
        (LET_GO, IDLE),
        (OPEN, STREAMING),
        (ENDED_OK, DONE),
    )
    assert states.pending == frozenset()


def test_a_node_loss() -> None:
    """node_lost(): its vbuckets settle while its session is made durable, then each is placed
    on a new connection; one whose reopen was waiting stays that placement's."""
    states = VbucketStates([0, 1, 2])
    _walk(states, 0, (OPEN, STREAMING))
    _walk(states, 1, (PLACE, PLACING))  # a reopen waits out its backoff on the lost node
    for vb in (0, 1, 2):
        states.handle(vb, NODE_LOST)
    assert [states.status(vb) for vb in (0, 1, 2)] == [SETTLING, PLACING, SETTLING]
    assert states.unheld(frozenset()) == []
    for vb in (0, 1, 2):
        states.handle(vb, SETTLED)
    assert [states.status(vb) for vb in (0, 1, 2)] == [IDLE, PLACING, IDLE]
    _walk(states, 0, (PLACE, PLACING), (OPEN, STREAMING), (LET_GO, STREAMING))
    _walk(states, 1, (LET_GO, IDLE), (PLACE, PLACING))  # the reopen stands down: place()


def test_a_move_not_my_vbucket_or_state_changed() -> None:
    """The node does not hold it active any more: move_away() settles it, then places it."""
    states = VbucketStates([0])
    _walk(
        states,
        0,
        (PLACE, PLACING),
        (OPEN, STREAMING),
        (LET_GO, STREAMING),
        (STREAM_END, IDLE),
        (SETTLE, SETTLING),
        (SETTLED, IDLE),
        (PLACE, PLACING),
        (OPEN, STREAMING),
    )


def test_a_move_and_a_node_loss_at_once() -> None:
    """Both settle it; the first to finish makes it idle, the other's end leaves it so."""
    states = VbucketStates([0])
    _walk(states, 0, (SETTLE, SETTLING), (NODE_LOST, SETTLING), (SETTLED, IDLE), (SETTLED, IDLE))


def test_a_placement_during_a_settle_takes_it() -> None:
    states = VbucketStates([0])
    _walk(states, 0, (SETTLE, SETTLING), (PLACE, PLACING), (SETTLED, PLACING), (LET_GO, IDLE))


def test_the_watch_places_a_vbucket_idle_at_two_watches() -> None:
    states = VbucketStates([0, 1, 2, 3])
    _walk(states, 1, (PLACE, PLACING))
    _walk(states, 2, (SETTLE, SETTLING))
    _walk(states, 3, (OPEN, STREAMING))
    assert states.unheld(frozenset({3})) == [0]
    assert states.unheld(frozenset()) == [0, 3], "a stream the wire no longer has"
    _walk(states, 0, (WATCHED, STALLED))
    _walk(states, 3, (WATCHED, STALLED))
    assert not states.allows(0, WATCHED), "the second watch places it instead"
    _walk(states, 3, (STREAM_END, STALLED))  # its end, read late
    _walk(states, 0, (PLACE, PLACING), (LET_GO, IDLE))
    assert states.having(STALLED) == {3}


def test_filter_empty_finishes_a_vbucket_in_follow() -> None:
    states = VbucketStates([0, 1])
    _walk(states, 0, (OPEN, STREAMING), (FILTER_EMPTY, FILTERED), (LET_GO, FILTERED))
    _walk(states, 1, (OPEN, STREAMING), (FILTER_EMPTY, FILTERED))
    assert states.pending == frozenset() and states.unheld(frozenset()) == []


def test_what_waiting_reports() -> None:
    states = VbucketStates([0, 1, 2, 3, 4])
    _walk(states, 1, (PLACE, PLACING))
    _walk(states, 2, (SETTLE, SETTLING))
    _walk(states, 3, (OPEN, STREAMING))
    _walk(states, 4, (WATCHED, STALLED))
    assert [states.activity(vb) for vb in range(5)] == [
        "idle",
        "placing",
        "settling",
        "idle",
        "idle",
    ]
    assert states.pending == {0, 1, 2, 3, 4} and states.having(PLACING) == {1}
