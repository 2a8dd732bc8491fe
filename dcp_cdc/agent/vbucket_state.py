"""Each vbucket's status in a capture run, and what moves it: the placement's lifecycle of a
vbucket as a small sans-I/O state machine (:class:`VbucketStates`), driven by
:class:`~dcp_cdc.agent.placement.Placement`. No asyncio, no I/O.

A vbucket starts :attr:`~VbStatus.IDLE`. A placement (finding its owner, connecting, or a
reopen's backoff) holds it :attr:`~VbStatus.PLACING`; its stream request makes it
:attr:`~VbStatus.STREAMING`, and the stream's end makes it idle again (a reopen or a move
follows), :attr:`~VbStatus.DONE` (``until-now``: ended OK) or :attr:`~VbStatus.FILTERED`
(ended FILTER_EMPTY). A move (state changed, NOT_MY_VBUCKET) and a lost connection first make
the session that streamed it durable: :attr:`~VbStatus.SETTLING`. The watch counts a vbucket
that nothing streams, places or settles: :attr:`~VbStatus.STALLED` at one watch, placed again
at the next. A failover shows as a rollback (the connection asks again from the rollback
point: still streaming) and, in ``until-now``, as an end the placement closes and asks for
again (docs/capture.md, *After a failover*).

Which streams are on the wire (requested, open, closing) is the connection's
(:class:`~dcp_cdc.agent.consumer.ConsumerConnection`); STREAMING is the placement's view: a
stream asked for whose end it has not been told yet. Reports reach the placement from several
tasks and some come late (a stream's end read after the next request went out, a connection
found dead while a placement waits), so a report is allowed in every status it can find, and
one that does not move the vbucket leaves it where it is (:data:`STAYS`). What the placement
decides itself, to place a vbucket, to open its stream, to count it idle, it asks about first
(:meth:`VbucketStates.allows`); doing it anyway raises
:class:`~dcp_cdc.errors.VbucketStateError`, a bug in the driver.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Set

from dcp_cdc.errors import VbucketStateError


class VbStatus(enum.Enum):
    """Where one vbucket is in the run."""

    IDLE = "idle"
    """Still to capture; nothing streams, places or settles it."""
    STALLED = "stalled"
    """Idle at one watch; the next watch places it again."""
    PLACING = "placing"
    """A placement holds it: its owner, a connection, a reopen's backoff."""
    STREAMING = "streaming"
    """Its stream was asked for; no end reported yet."""
    SETTLING = "settling"
    """The session that streamed it is being made durable before it moves on."""
    DONE = "done"
    """``until-now``: its stream ended OK."""
    FILTERED = "filtered"
    """Its stream ended FILTER_EMPTY: the collections captured are gone."""


class VbEvent(enum.Enum):
    """What the placement tells the machine about one vbucket."""

    PLACE = "place"
    """A placement or a reopen takes it."""
    LET_GO = "let go"
    """That placement or reopen ends (with a stream asked for, or not)."""
    OPEN = "open"
    """Its stream request goes out."""
    ROLLED_BACK = "rolled back"
    """The node answered ROLLBACK; the connection asks again from there."""
    STREAM_END = "stream end"
    """Its stream ended for another reason than OK or FILTER_EMPTY, or was refused, or the
    node does not hold it active (NOT_MY_VBUCKET): a reopen or a move follows."""
    ENDED_OK = "ended ok"
    """``until-now``: its stream ended OK."""
    FILTER_EMPTY = "filter empty"
    """Its stream ended FILTER_EMPTY."""
    SETTLE = "settle"
    """It moves off a node: that node's session is being made durable."""
    NODE_LOST = "node lost"
    """The connection it was owned or streamed on is gone: its session is being made durable."""
    SETTLED = "settled"
    """That session is durable."""
    WATCHED = "watched"
    """The watch found it idle: nothing streams, places or settles it."""


IDLE = VbStatus.IDLE
STALLED = VbStatus.STALLED
PLACING = VbStatus.PLACING
STREAMING = VbStatus.STREAMING
SETTLING = VbStatus.SETTLING
DONE = VbStatus.DONE
FILTERED = VbStatus.FILTERED
UNFINISHED = frozenset({IDLE, STALLED, PLACING, STREAMING, SETTLING})
FINISHED = frozenset({DONE, FILTERED})

MOVES: dict[tuple[VbStatus, VbEvent], VbStatus] = {
    (IDLE, VbEvent.PLACE): PLACING,
    (STALLED, VbEvent.PLACE): PLACING,
    (SETTLING, VbEvent.PLACE): PLACING,
    (PLACING, VbEvent.LET_GO): IDLE,
    (IDLE, VbEvent.OPEN): STREAMING,
    (STALLED, VbEvent.OPEN): STREAMING,
    (PLACING, VbEvent.OPEN): STREAMING,
    (SETTLING, VbEvent.OPEN): STREAMING,
    (STREAMING, VbEvent.STREAM_END): IDLE,
    **{(status, VbEvent.ENDED_OK): DONE for status in UNFINISHED},
    **{(status, VbEvent.FILTER_EMPTY): FILTERED for status in UNFINISHED},
    (IDLE, VbEvent.SETTLE): SETTLING,
    (STALLED, VbEvent.SETTLE): SETTLING,
    (IDLE, VbEvent.NODE_LOST): SETTLING,
    (STALLED, VbEvent.NODE_LOST): SETTLING,
    (STREAMING, VbEvent.NODE_LOST): SETTLING,
    (SETTLING, VbEvent.SETTLED): IDLE,
    (IDLE, VbEvent.WATCHED): STALLED,
    (STREAMING, VbEvent.WATCHED): STALLED,  # its stream is gone and nobody said so
}
"""The transitions that change a vbucket's status."""

STAYS: dict[VbEvent, frozenset[VbStatus]] = {
    # a placement that opened a stream, or one that an end, a loss or a watch moved on
    VbEvent.LET_GO: frozenset({IDLE, STALLED, STREAMING, SETTLING}),
    # a stream asked for before the end of the one before was reported
    VbEvent.OPEN: frozenset({STREAMING}),
    # streaming; elsewhere a rollback of a stream whose status a late report moved
    VbEvent.ROLLED_BACK: UNFINISHED,
    # a late end: a watch, a placement or a loss moved the vbucket on already
    VbEvent.STREAM_END: frozenset({IDLE, STALLED, PLACING, SETTLING}),
    # a move: a placement that holds it goes on; a stream stays (it is on another node, or
    # was asked for before the move began); a second settle joins the first
    VbEvent.SETTLE: frozenset({PLACING, STREAMING, SETTLING}),
    # a lost node: a placement that holds it goes on (and stands down at the dead node)
    VbEvent.NODE_LOST: frozenset({PLACING, SETTLING}),
    # the other settle of two (a move and a loss) ended first, or a placement took it
    VbEvent.SETTLED: frozenset({IDLE, STALLED, PLACING, STREAMING}),
}
"""The reports that leave a vbucket's status as it is: late ones, and those of a hold
that something else took over. A finished vbucket keeps its status whatever is reported."""

_DECIDED = frozenset({VbEvent.PLACE, VbEvent.OPEN, VbEvent.WATCHED})
"""What the placement decides itself, and asks :meth:`VbucketStates.allows` about first."""

TRANSITIONS: dict[tuple[VbStatus, VbEvent], VbStatus] = {
    **{(status, event): status for event, statuses in STAYS.items() for status in statuses},
    **{
        (status, event): status for status in FINISHED for event in VbEvent if event not in _DECIDED
    },
    **MOVES,
}
"""(status, event) → the next status; a pair not here raises :class:`VbucketStateError`."""


class VbucketStates:
    """The status of each vbucket of one run, moved by :data:`TRANSITIONS`."""

    def __init__(self, vbuckets: Iterable[int] = ()) -> None:
        self._status: dict[int, VbStatus] = dict.fromkeys(vbuckets, IDLE)
        self._pending: set[int] = set(self._status)

    def status(self, vb: int) -> VbStatus:
        try:
            return self._status[vb]
        except KeyError:
            raise VbucketStateError(vb, None) from None

    def handle(self, vb: int, event: VbEvent) -> VbStatus:
        """Move ``vb`` by ``event``; :class:`VbucketStateError` when its status does not
        allow it (the vbucket is left as it was)."""
        status = self._status.get(vb)
        new = None if status is None else TRANSITIONS.get((status, event))
        if new is None:
            raise VbucketStateError(vb, None if status is None else status.value, event.value)
        self._status[vb] = new
        if new in FINISHED:
            self._pending.discard(vb)
        return new

    def allows(self, vb: int, event: VbEvent) -> bool:
        """Whether ``vb``'s status allows ``event`` (False for a vbucket not in the run)."""
        status = self._status.get(vb)
        return status is not None and (status, event) in TRANSITIONS

    @property
    def pending(self) -> frozenset[int]:
        """The vbuckets not finished: ``until-now``'s not done, and not filtered out."""
        return frozenset(self._pending)

    def is_pending(self, vb: int) -> bool:
        return vb in self._pending

    def any_pending(self) -> bool:
        """Whether any vbucket is not finished (without the copy :attr:`pending` makes)."""
        return bool(self._pending)

    def having(self, status: VbStatus) -> frozenset[int]:
        return frozenset(vb for vb, s in self._status.items() if s is status)

    def unheld(self, streaming: Set[int]) -> list[int]:
        """The pending vbuckets, in order, that no placement or settle holds and that are
        not in ``streaming`` (the streams on the wire): what the watch looks at."""
        held = (PLACING, SETTLING)
        return [
            vb
            for vb in sorted(self._pending)
            if vb not in streaming and self._status[vb] not in held
        ]

    def activity(self, vb: int) -> str:
        """What holds ``vb`` apart from a stream: placing, settling, or idle."""
        status = self.status(vb)
        return status.value if status in (PLACING, SETTLING) else IDLE.value
