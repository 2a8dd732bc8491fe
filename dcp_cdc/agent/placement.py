"""The capture agent's placement: which vbucket streams on which node, who opens, re-opens and
moves its stream, and the run around it (:class:`Placement`).

Durability: before a vbucket is re-opened on another connection, the session that streamed
it closes its file and commits, so the new stream starts from a durable position; and a
connection whose session started before the session that last streamed the vbucket starts a
new session first, so bronze's order (session_started_at, session_id, file_sequence, offset)
stays the wire order of every vbucket.

Ends (``until-now``): a vbucket is done only when its stream ends OK. A position at or past
the end seqno is still asked for (the node either ends that stream at once or answers
ROLLBACK: a failover may have left a branch shorter than what we hold), and a stream whose
end a failover lowered is closed and asked for again up to the lowered end. A stream opener
checks, after its last wait and right before its request, that the vbucket still needs one
(:meth:`Placement.may_open`): one that wakes after the stream ended OK, or after a stop, does
nothing.

Stream ends: closed is ours (or :meth:`Placement.reached`'s, which asks again); state_changed
and NOT_MY_VBUCKET refresh the cluster map and re-open on the owner; FILTER_EMPTY stops the
vbucket and records it; every other reason re-opens from the position. A dead connection (2 ×
the noop interval of silence, a reset, EOF, or a send that fails, wherever it was sent from)
closes its session durably, then its vbuckets resume from their durable positions on a new
connection. A node that cannot be reached is tried again by every placement waiting for it on
one shared, jittered, exponential backoff (:class:`~dcp_cdc.agent.node.Backoff`), until
``reconnect_timeout_s`` has passed.

The end of a run: each session still connected records its node's high seqnos and the
failover logs of our vbuckets there (:meth:`Placement.record_cluster_state`) before its last
file closes.

Lag: every ``lag_poll_s`` (and when a node connects) each node is asked for its high seqnos
(:meth:`Placement.ask_high_seqnos`); against them a :class:`~dcp_cdc.agent.progress.LagTracker`
knows how far behind each vbucket is, and logs a vbucket that stays behind without moving for
``stall_after_s`` (what ``/readyz`` reports, :mod:`dcp_cdc.agent.progress`).

The sockets, the session files and the tasks around them are one :class:`~dcp_cdc.agent.node.Node`
each; each vbucket's status (idle, placing, streaming, settling, done, ...) and what moves it
are the sans-I/O state machine of :mod:`dcp_cdc.agent.vbucket_state`, which this module drives.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import ssl
import time
from collections.abc import Iterable, Set
from typing import Any

from dcp_cdc.agent.cluster import ClusterMap, collection_ids, parse_cluster_map
from dcp_cdc.agent.consumer_events import (
    AgentEvent,
    ClusterConfig,
    ClusterStateRecorded,
    CollectionsManifest,
    HighSeqnos,
    NotMyVbucket,
    StreamEnded,
    StreamRefused,
    StreamRolledBack,
)
from dcp_cdc.agent.landing_store import open_landing
from dcp_cdc.agent.node import Backoff, Node
from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.progress import LagTracker, watch_lag
from dcp_cdc.agent.settings import CaptureSettings, CaptureSummary, Mode
from dcp_cdc.agent.tls import client_context
from dcp_cdc.agent.vbucket_state import VbEvent, VbStatus, VbucketStates
from dcp_cdc.agent.writer import CheckpointStore, clear_staging, rfc3339
from dcp_cdc.config.capture import HostPort
from dcp_cdc.errors import (
    AuthenticationError,
    CaptureConnectionError,
    ConfigError,
    ConnectionLostError,
    ProtocolError,
    TlsError,
)
from dcp_cdc.protocol import NO_END_SEQNO, Status, StreamEndReason

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
"""How long a stop waits for STREAM_END (closed) before closing the sockets anyway."""
WATCH_S = 2.0
"""How often the run looks for vbuckets that nothing streams (:meth:`Placement.watch`)."""
WAITING_LOG_S = 60.0
"""``until-now`` with no vbucket done for this long logs what each one waits for."""
_END_REASONS = frozenset(StreamEndReason)


class Placement:
    """One capture run: which vbucket streams on which node, and what each event changes."""

    def __init__(self, settings: CaptureSettings, mode: Mode, stop: asyncio.Event) -> None:
        self.settings = settings
        self.mode = mode
        self.stop = stop
        cs = settings.cluster  # parsed once, by the configuration when it came from one
        self.seeds = cs.seeds
        self.tls = cs.tls
        self.scheme = cs.scheme
        self.ssl_context: ssl.SSLContext | None = client_context(settings) if cs.tls else None
        self.summary = CaptureSummary(mode)
        self.landing = open_landing(settings.landing, settings.s3)
        self.map: ClusterMap | None = None
        self.store: CheckpointStore | None = None
        self.durable: dict[int, VbPosition] = {}
        self.nodes: dict[HostPort, Node] = {}
        self.connecting: dict[HostPort, asyncio.Future[Node]] = {}
        self.vbs = VbucketStates()
        """Each vbucket's status: idle, placing, streaming, settling, done, ..."""
        self.waiting_since = time.monotonic()
        """When ``until-now`` last saw a vbucket done (or started): what :meth:`watch` reports."""
        self.node_index: dict[HostPort, int] = {}
        self.vbuckets: list[int] = []
        self.end_seqnos: dict[int, int] = {}
        self.last_session: dict[int, float] = {}
        self.collection_ids: tuple[int, ...] | None = None
        self.stopping = False
        self.failure: BaseException | None = None
        self.wake = asyncio.Event()
        self.manifest_ready = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self._last_start = 0.0
        self._counter = 0
        self.backoff = Backoff(settings)
        self.lag = LagTracker(settings.stall_after_s)
        self.last_commit = time.monotonic()
        """When the checkpoint was last committed, or the run started (monotonic)."""

    @property
    def pending(self) -> Set[int]:
        """vbuckets not done yet (``until-now``) / still to stream."""
        return self.vbs.pending

    @pending.setter
    def pending(self, vbuckets: Iterable[int]) -> None:
        self.vbs = VbucketStates(vbuckets)

    @property
    def placing(self) -> Set[int]:
        """vbuckets a placement or a reopen holds."""
        return self.vbs.having(VbStatus.PLACING)

    @placing.setter
    def placing(self, vbuckets: Set[int]) -> None:
        for vb in self.placing - vbuckets:
            self.vbs.handle(vb, VbEvent.LET_GO)
        for vb in vbuckets - self.placing:
            self.vbs.handle(vb, VbEvent.PLACE)

    # --- small services ---

    def session_start(self) -> float:
        """A session start time, strictly later than every earlier one of this agent."""
        now = max(time.time(), self._last_start + 1e-6)
        self._last_start = now
        return now

    def next_session_id(self, index: int, started: float | None = None) -> str:
        self._counter += 1
        stamp = dt.datetime.fromtimestamp(started or time.time(), dt.UTC)
        return (
            f"{self.settings.bucket}-{self.settings.agent_id}-"
            f"{stamp.strftime('%Y%m%dT%H%M%S.%fZ')}-{index}-{self._counter}"
        )

    def commit(self, positions: dict[int, VbPosition]) -> None:
        if not positions or self.store is None:
            return
        self.store.commit(positions, updated_at=rfc3339(time.time()))
        self.durable.update(positions)
        self.last_commit = time.monotonic()

    def fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self.wake.set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(self._guard(coro))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _guard(self, coro: Any) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.fail(exc)

    # --- bootstrap ---

    async def bootstrap(self) -> None:
        problems = []
        for seed in self.seeds:
            node = Node(self, seed, 0)
            try:
                ready = await node.connect()
            except (AuthenticationError, TlsError):
                await node.close()
                raise
            except CaptureConnectionError as exc:
                problems.append(str(exc))
                await node.close()
                continue
            await node.close()
            try:
                self.map = parse_cluster_map(ready.cluster_config, seed.host)
            except ProtocolError as exc:
                raise CaptureConnectionError(seed.label, str(exc)) from None
            break
        else:
            raise CaptureConnectionError(
                ",".join(s.label for s in self.seeds),
                "no seed node answered: " + "; ".join(problems),
            )
        cmap = self.map
        s = self.settings
        first, last = s.vbuckets if s.vbuckets is not None else (0, cmap.num_vbuckets - 1)
        self.vbuckets = [vb for vb in range(first, last + 1) if vb < cmap.num_vbuckets]
        if not self.vbuckets:
            raise ConfigError(
                f"vbuckets {first}-{last}: the bucket has {cmap.num_vbuckets} vbuckets"
            )
        self.summary.vbuckets = len(self.vbuckets)
        self.store = CheckpointStore(
            s.checkpoint_path,
            bucket=s.bucket,
            bucket_uuid=cmap.bucket_uuid,
            agent=s.agent_id,
            s3=s.s3,
        )
        stored = self.store.load()
        self.durable = {vb: stored[vb] for vb in self.vbuckets if vb in stored}
        self.vbs = VbucketStates(self.vbuckets)
        at_start = {vb: p.seqno for vb, p in self.durable.items()}
        self.lag.start({vb: at_start.get(vb, 0) for vb in self.vbuckets}, time.monotonic())

    def refresh_map(self, config: dict[str, Any], dialled: str) -> None:
        if not config:
            return
        fresh = parse_cluster_map(config, dialled)
        if self.map is None or fresh.version > self.map.version:
            self.map = fresh

    # --- nodes and streams ---

    async def node_for(self, endpoint: HostPort) -> Node:
        """The live connection to ``endpoint``, connecting once however many ask at once."""
        node = self.nodes.get(endpoint)
        if node is not None and not node.dead:
            return node
        pending = self.connecting.get(endpoint)
        if pending is None:
            pending = asyncio.ensure_future(self._connect_node(endpoint))
            self.connecting[endpoint] = pending
            pending.add_done_callback(lambda _: self.connecting.pop(endpoint, None))
        return await asyncio.shield(pending)

    async def _connect_node(self, endpoint: HostPort) -> Node:
        index = self.node_index.setdefault(endpoint, len(self.node_index))
        node = Node(self, endpoint, index)
        try:
            ready = await node.connect()
        except (AuthenticationError, TlsError):
            await node.close()
            raise
        except CaptureConnectionError as exc:
            await node.close()
            self.backoff.failed(endpoint, exc.cause)
            raise
        except BaseException:
            await node.close()
            raise
        self.backoff.reached(endpoint)
        self.nodes[endpoint] = node
        self.refresh_map(ready.cluster_config, endpoint.host)
        node.new_session()
        node.start()
        assert node.conn is not None
        if self.settings.collections is not None and self.collection_ids is None:
            node.conn.request_collections_manifest()
            await node.send()
            try:
                async with asyncio.timeout(self.settings.connect_timeout_s):
                    await self.manifest_ready.wait()
            except TimeoutError:
                raise CaptureConnectionError(
                    node.label, "no collections manifest within the connect timeout"
                ) from None
        # until-now: its vbuckets' ends; either mode: the lag's other side, from the start
        node.conn.request_high_seqnos()
        await node.send()
        return node

    def owner(self, vb: int) -> HostPort | None:
        assert self.map is not None
        return self.map.owner(vb, tls=self.tls)

    def place_many(self, vbuckets: Iterable[int]) -> None:
        """:meth:`place` for a run's vbuckets: one task per owner, not one per vbucket (a
        vbucket the map gives no owner goes :meth:`place`'s way)."""
        groups: dict[HostPort, list[int]] = {}
        for vb in vbuckets:
            if self.stopping or not self.vbs.allows(vb, VbEvent.PLACE):
                continue
            endpoint = self.owner(vb)
            if endpoint is None:
                self.spawn(self.place(vb))
                continue
            self.vbs.handle(vb, VbEvent.PLACE)  # held from now: the watch leaves them alone
            groups.setdefault(endpoint, []).append(vb)
        for endpoint, group in groups.items():
            self.spawn(self._place_on(endpoint, group))

    async def _place_on(self, endpoint: HostPort, vbuckets: list[int]) -> None:
        """``endpoint``'s vbuckets, held by :meth:`place_many`: one connection awaited, their
        streams asked for together; a node not reached is waited for as :meth:`place` does."""
        reached = False
        try:
            try:
                node = await self.node_for(endpoint)
            except (AuthenticationError, TlsError):
                raise
            except CaptureConnectionError:
                await self.backoff.wait(endpoint)
                await self.any_map_refresh()
            else:
                reached = True
                await self.open_many(node, vbuckets)
        finally:
            for vb in vbuckets:
                self.vbs.handle(vb, VbEvent.LET_GO)
        if not reached:
            self.place_many(vbuckets)

    async def place(self, vb: int, *, delay: float = 0.0) -> None:
        """Open ``vb``'s stream on its owner, from its durable position."""
        if delay:
            await asyncio.sleep(delay)
        if not self.vbs.allows(vb, VbEvent.PLACE):
            return  # a move and a lost connection may both ask; one placement is enough
        self.vbs.handle(vb, VbEvent.PLACE)
        try:
            await self._place(vb)
        finally:
            self.vbs.handle(vb, VbEvent.LET_GO)

    async def _place(self, vb: int) -> None:
        attempt = 0
        while not self.stopping and self.vbs.is_pending(vb):
            endpoint = self.owner(vb)
            if endpoint is None:
                attempt += 1
                await self.any_map_refresh()
                await asyncio.sleep(min(30.0, self.settings.backoff_s * 2**attempt))
                continue
            try:
                node = await self.node_for(endpoint)
            except (AuthenticationError, TlsError):
                raise
            except CaptureConnectionError:
                await self.backoff.wait(endpoint)
                await self.any_map_refresh()
                continue
            await self.open_many(node, (vb,))
            return

    def live_streams(self) -> set[int]:
        """The vbuckets with a stream (requested, open or closing) on a live connection."""
        return {
            vb
            for n in self.nodes.values()
            if n.conn is not None and not n.dead
            for vb in n.conn.streaming()
        }

    def may_open(self, node: Node, vbuckets: Iterable[int]) -> list[int]:
        """Those of ``vbuckets`` whose stream may be requested on ``node`` now. Asked again
        after every wait: a stream that ended OK (``until-now``: done) meanwhile, or a stop,
        or a connection lost, makes an opener that was waiting stand down."""
        if self.stopping or node.dead:
            return []
        live = [n.conn for n in self.nodes.values() if n.conn is not None and not n.dead]
        pending = self.vbs.is_pending
        return [vb for vb in vbuckets if pending(vb) and not any(c.is_streaming(vb) for c in live)]

    async def send_or_lose(self, node: Node) -> bool:
        """Send what ``node``'s core has queued; a lost connection is the node's loss (its
        vbuckets resume elsewhere, :meth:`node_lost`), not the run's failure."""
        try:
            await node.send()
        except ConnectionLostError as exc:
            self.lose(node, exc.cause)
            return False
        return True

    def lose(self, node: Node, cause: str) -> None:
        if not node.dead and not self.stopping:
            self.spawn(self.node_lost(node, cause))

    def resume_position(self, node: Node, vb: int) -> VbPosition | None:
        """Where ``vb`` resumes on ``node``: the connection's own position when this session
        is the last that streamed it (its frames are ahead in this session's queue, in wire
        order), else the durable one (the session that streamed it last was made durable
        before the vbucket moved: :meth:`move_away`, :meth:`node_lost`)."""
        assert node.conn is not None
        if self.last_session.get(vb) == node.session_started:
            mine = node.conn.positions().get(vb)
            if mine is not None:
                return mine
        return self.durable.get(vb)

    async def open_many(self, node: Node, vbuckets: Iterable[int]) -> None:
        """Ask ``node`` for the streams of ``vbuckets`` that still need one, in one write of
        their requests in order: flow control counts only what the node sends, and each reply
        finds its stream by its opaque (docs/protocol/dcp.md §7.6, §1.4)."""
        if node.dead or node.conn is None:
            for vb in vbuckets:
                if self.vbs.is_pending(vb) and not self.stopping:
                    self.spawn(self.place(vb, delay=self.settings.backoff_s))
            return
        wanted = self.may_open(node, vbuckets)
        asked = False
        if self.mode == "until-now":
            # a GET_ALL_VB_SEQNOS reply opens those without an end (until_now_ends, over the
            # vbuckets owned then); ask (again) unless a request is on its way, once per node
            unknown = [vb for vb in wanted if vb not in self.end_seqnos]
            if unknown:
                node.owned.update(unknown)
                wanted = [vb for vb in wanted if vb in self.end_seqnos]
                if not node.conn.asking_high_seqnos:
                    node.conn.request_high_seqnos()
                    asked = True
        if any(node.session_started < self.last_session.get(vb, 0.0) for vb in wanted):
            await node.flush(new_session=True)
            wanted = self.may_open(node, wanted)
        for vb in wanted:  # no await between the checks and the requests
            node.owned.add(vb)
            self.open_stream(node, vb, self.resume_position(node, vb))
        if wanted or asked:
            await self.send_or_lose(node)

    def open_stream(self, node: Node, vb: int, position: VbPosition | None) -> None:
        """The stream request itself (no await between the checks before it and this).

        ``until-now`` asks even when the position is at or past the end seqno: only the node
        can say whether that position is still on its branch (a failover may have lowered
        the high seqno below it); it ends such a stream at once, or answers ROLLBACK."""
        assert node.conn is not None
        self.last_session[vb] = node.session_started
        end = self.end_seqnos.get(vb, NO_END_SEQNO)
        self.vbs.handle(vb, VbEvent.OPEN)
        node.conn.open_stream(vb, position, end_seqno=end, collections=self.collection_ids)

    async def reached(self) -> None:
        """``until-now``: close the streams that reached an end a failover lowered. The server
        ends a stream at the end seqno asked for; after a failover lowered the high seqno
        (rollback), it would wait for seqnos the new branch may never reach. The stream
        closed (reason closed) is asked for again up to the lowered end (:meth:`reopen`),
        which the node ends with OK: the vbucket's last stream is a whole one."""
        if self.mode != "until-now":
            return
        for node in list(self.nodes.values()):
            if node.conn is None or node.dead or not node.conn.ready:
                continue
            positions = node.conn.positions()
            ended = []
            for vb in node.conn.streaming():
                end = self.end_seqnos.get(vb, NO_END_SEQNO)
                requested = node.conn.requested_end(vb)
                if (
                    self.vbs.is_pending(vb)
                    and vb in positions
                    and positions[vb].seqno >= end
                    and requested is not None
                    and requested > end
                ):
                    ended.append(vb)
            for vb in ended:
                node.conn.close_stream(vb)
            if ended:
                await self.send_or_lose(node)

    async def ask_high_seqnos(self) -> None:
        """The high seqnos again from every node: every ``lag_poll_s`` (the lag), and in
        ``until-now`` every :data:`WATCH_S` of a run still streaming, so that an end a
        failover made unreachable is lowered (a stream ended and reopened after a failover
        rolls back only when it was past the branch point)."""
        for node in list(self.nodes.values()):
            if node.conn is None or node.dead or not node.conn.ready:
                continue
            node.conn.request_high_seqnos()
            with contextlib.suppress(ConnectionLostError):
                await node.send()

    def watch(self) -> None:
        """Place anew every vbucket still to stream that no connection streams, nothing is
        placing and no old session is making durable: whatever path lost it (a reply that raced its placement, a move whose
        node went away), a vbucket must never stall silently."""
        streaming = self.live_streams()
        for vb in self.vbs.unheld(streaming):
            if self.vbs.status(vb) is VbStatus.STALLED:  # idle at two watches in a row
                log.info(
                    "capture: vbucket %d is not streaming; placing it again",
                    vb,
                    extra={"vbucket": vb},
                )
                self.spawn(self.place(vb))
            else:
                self.vbs.handle(vb, VbEvent.WATCHED)
        if self.mode == "until-now" and time.monotonic() - self.waiting_since > WAITING_LOG_S:
            self.waiting_since = time.monotonic()
            log.info("capture: still waiting for %s", self.waiting(streaming))

    async def poll_high_seqnos(self) -> None:
        """Every ``lag_poll_s``, the high seqnos of every node: the lag's other side."""
        while not self.stopping:
            await asyncio.sleep(self.settings.lag_poll_s)
            await self.ask_high_seqnos()

    def waiting(self, streaming: set[int]) -> str:
        """``until-now``: each vbucket not done yet, where it is and what it waits for."""
        positions: dict[int, VbPosition] = dict(self.durable)
        for node in self.nodes.values():
            if node.conn is not None and not node.dead:
                positions.update(node.conn.positions())
        parts = []
        for vb in sorted(self.pending):
            at = positions[vb].seqno if vb in positions else None
            end = self.end_seqnos.get(vb)
            how = "streaming" if vb in streaming else self.vbs.activity(vb)
            parts.append(f"vbucket {vb} at seqno {at} of end {end} ({how})")
        return "; ".join(parts)

    def vb_done(self, vb: int) -> None:
        if self.vbs.is_pending(vb):
            self.vbs.handle(vb, VbEvent.ENDED_OK)
            self.summary.done.append(vb)
            self.waiting_since = time.monotonic()
            if not self.vbs.any_pending():
                self.wake.set()

    async def any_map_refresh(self) -> None:
        for node in list(self.nodes.values()):
            if not node.dead and node.conn is not None:
                node.conn.request_cluster_config()
                with contextlib.suppress(ConnectionLostError):
                    await node.send()
                await asyncio.sleep(0.05)
                return

    async def move_away(self, node: Node, vb: int) -> None:
        """``vb`` left ``node``: make its frames durable there, then place it anew."""
        if node.dead:
            return  # node_lost flushes the node and places its vbuckets
        self.vbs.handle(vb, VbEvent.SETTLE)
        try:
            await node.flush()
        except CaptureConnectionError:
            if node.dead:
                return
            raise
        finally:
            self.vbs.handle(vb, VbEvent.SETTLED)
        node.owned.discard(vb)
        self.summary.moves += 1
        await self.any_map_refresh()
        await self.place(vb, delay=self.settings.backoff_s)

    async def node_lost(self, node: Node, why: str) -> None:
        if node.dead:
            return  # the read loop and a sender may both find the connection gone
        log.warning("capture: connection to %s lost (%s); resuming elsewhere", node.label, why)
        node.dead = True
        self.summary.reconnects += 1
        # what it owned, and the streams it had (a stream on another node is that node's)
        lost = node.owned | (node.conn.streaming() if node.conn is not None else frozenset())
        settling = sorted(lost - self.live_streams())
        for vb in settling:
            self.vbs.handle(vb, VbEvent.NODE_LOST)
        try:
            await node.flush(last=True)
            await node.close()
        finally:
            for vb in settling:
                self.vbs.handle(vb, VbEvent.SETTLED)
        if self.nodes.get(node.endpoint) is node:
            del self.nodes[node.endpoint]
        for vb in sorted(node.owned):
            self.spawn(self.place(vb, delay=self.settings.backoff_s))

    async def reopen(self, node: Node, vb: int) -> None:
        """Ask again, on the same connection, for a stream that ended (closed, too slow,
        refused for now): from this connection's position."""
        assert node.conn is not None
        if not self.vbs.allows(vb, VbEvent.PLACE):
            return
        self.vbs.handle(vb, VbEvent.PLACE)  # watch() leaves it alone while it waits
        try:
            await asyncio.sleep(self.settings.backoff_s)
        finally:
            self.vbs.handle(vb, VbEvent.LET_GO)
        if not self.may_open(node, (vb,)):
            if node.dead and self.vbs.is_pending(vb) and not self.stopping:
                self.spawn(self.place(vb, delay=self.settings.backoff_s))
            return
        position = node.conn.positions().get(vb, self.durable.get(vb))
        self.open_stream(node, vb, position)
        await self.send_or_lose(node)

    # --- events ---

    async def on_event(self, node: Node, event: AgentEvent) -> None:
        if isinstance(event, StreamEnded):
            await self.on_stream_end(node, event)
        elif isinstance(event, StreamRolledBack):
            self.summary.rollbacks += 1
            self.reported(node, event.vbucket, VbEvent.ROLLED_BACK)
            if self.mode == "until-now" and node.conn is not None:
                # a failover may have lost seqnos up to the end asked for: ask the high seqno
                # again (HighSeqnos lowers the end; reached() then ends the vbucket)
                node.conn.request_high_seqnos()
                await node.send()
        elif isinstance(event, ClusterStateRecorded):
            self.lag.cluster(event.high_seqnos)
            node.recorded.set()
        elif isinstance(event, NotMyVbucket):
            self.reported(node, event.vbucket, VbEvent.STREAM_END)
            self.spawn(self.move_away(node, event.vbucket))
        elif isinstance(event, StreamRefused):
            if event.status == Status.EACCESS:
                raise CaptureConnectionError(
                    node.label, f"no access to stream vbucket {event.vbucket} (eaccess)"
                )
            self.reported(node, event.vbucket, VbEvent.STREAM_END)
            self.spawn(self.reopen(node, event.vbucket))
        elif isinstance(event, ClusterConfig):
            self.refresh_map(event.config, node.endpoint.host)
        elif isinstance(event, HighSeqnos):
            self.lag.cluster(event.seqnos)
            if self.mode == "until-now":
                await self.until_now_ends(node, event)
        elif isinstance(event, CollectionsManifest):
            self.collection_ids = collection_ids(event.manifest, self.settings.collections or ())
            self.manifest_ready.set()

    async def until_now_ends(self, node: Node, event: HighSeqnos) -> None:
        """``until-now``: a node's high seqnos are the ends of its vbuckets (lowered by a
        failover, never raised), and open the streams that waited for them."""
        for vb, seqno in event.seqnos.items():
            # the end is the high seqno at the start; only a failover lowers it
            self.end_seqnos[vb] = min(self.end_seqnos.get(vb, seqno), seqno)
        await self.reached()
        streaming = node.conn.streaming() if node.conn else frozenset()
        opening = []
        for vb in sorted(node.owned):
            if self.vbs.is_pending(vb) and vb not in streaming:
                if vb in event.seqnos:
                    # stays owned here: its frames queued on this node are still to be
                    # committed, and an opener that finds it streaming already (a reopen
                    # won the race) stands down without giving it back
                    opening.append(vb)
                else:  # not active here any more: the map moved on
                    node.owned.discard(vb)
                    self.spawn(self.place(vb, delay=self.settings.backoff_s))
        if opening:
            self.spawn(self.open_many(node, opening))

    async def on_stream_end(self, node: Node, event: StreamEnded) -> None:
        vb, reason = event.vbucket, event.reason
        name = event.reason_name if reason in _END_REASONS else "unknown"  # bounded labels
        self.summary.stream_ends[name] = self.summary.stream_ends.get(name, 0) + 1
        if reason == StreamEndReason.OK and self.mode == "until-now":
            self.vb_done(vb)
        elif reason == StreamEndReason.CLOSED and self.stopping:
            pass
        elif reason == StreamEndReason.FILTER_EMPTY:
            self.summary.filter_empty.append(vb)
            self.vbs.handle(vb, VbEvent.FILTER_EMPTY)
            if not self.vbs.any_pending():
                self.wake.set()
        elif reason == StreamEndReason.STATE_CHANGED:
            self.reported(node, vb, VbEvent.STREAM_END)
            self.spawn(self.move_away(node, vb))
        else:
            self.reported(node, vb, VbEvent.STREAM_END)
            self.spawn(self.reopen(node, vb))

    def reported(self, node: Node, vb: int, event: VbEvent) -> None:
        """A stream's rollback or end, as ``node`` read it. A lost node's reports are left
        out: :meth:`node_lost` settled its streams, and the vbucket may stream elsewhere now."""
        if not node.dead:
            self.vbs.handle(vb, event)

    # --- the run ---

    async def run(self) -> CaptureSummary:
        s = self.settings
        clear_staging(s.staging, bucket=s.bucket, agent_id=s.agent_id)
        await asyncio.to_thread(self.landing.check)  # no store, bucket or credentials: fail now
        await self.bootstrap()
        # until-now: the end seqnos come from each node's GET_ALL_VB_SEQNOS (node_for)
        self.place_many(self.vbuckets)
        self.spawn(self.poll_high_seqnos())
        stop_wait = asyncio.create_task(self.stop.wait())
        try:
            while self.failure is None and not self.stop.is_set():
                if not self.vbs.any_pending():  # all done, or (follow) every filter emptied
                    break
                self.wake.clear()
                wake = asyncio.create_task(self.wake.wait())
                woken, _ = await asyncio.wait(
                    {wake, stop_wait}, timeout=WATCH_S, return_when=asyncio.FIRST_COMPLETED
                )
                wake.cancel()
                await self.reached()
                self.watch()
                watch_lag(self, time.monotonic())
                if not woken and self.mode == "until-now":
                    await self.ask_high_seqnos()
        finally:
            stop_wait.cancel()
            await self.shutdown()
        if self.failure is not None:
            raise self.failure
        self.summary.positions = dict(self.durable)
        return self.summary

    async def record_cluster_state(self, live: list[Node]) -> None:
        """The end of each session: its node's high seqnos and the failover logs of our
        vbuckets it holds, recorded in the capture (what the cluster's history is now, which
        the quality check ``on_cluster_branch`` holds silver against). Best effort: a node
        that does not answer within :data:`STOP_GRACE_S` leaves its session without them."""
        ours = frozenset(self.vbuckets)
        asked = []
        for node in live:
            if node.conn is None or node.dead or node.reader_ended:
                continue
            node.conn.record_cluster_state(ours)
            with contextlib.suppress(ConnectionLostError):
                await node.send()
                asked.append(node)
        waits = [asyncio.ensure_future(n.recorded.wait()) for n in asked]
        if waits:
            deadline = time.monotonic() + STOP_GRACE_S
            while not all(w.done() for w in waits) and time.monotonic() < deadline:
                if any(n.reader_ended for n in asked):
                    break
                await asyncio.sleep(0.01)
            for w in waits:
                w.cancel()
        missing = [n.label for n in asked if not n.recorded.is_set()]
        if missing:
            log.warning("capture: no cluster state recorded from %s", ", ".join(missing))

    async def shutdown(self) -> None:
        self.stopping = True
        for task in list(self.tasks):
            task.cancel()
        for pending in list(self.connecting.values()):
            pending.cancel()
        live = [n for n in self.nodes.values() if not n.dead and n.conn is not None]
        for node in live:
            assert node.conn is not None
            for vb in node.conn.streaming():
                node.conn.close_stream(vb)
            with contextlib.suppress(ConnectionLostError):
                await node.send()
        deadline = time.monotonic() + STOP_GRACE_S
        while any(n.conn is not None and n.conn.streaming() for n in live) and (
            time.monotonic() < deadline and not any(n.reader_ended for n in live)
        ):
            await asyncio.sleep(0.02)
        if self.failure is None:
            await self.record_cluster_state(live)
        for node in live:
            await node.stop_reader()
            if node.write_task is not None and not node.write_task.done():
                try:
                    async with asyncio.timeout(30.0):
                        await node.flush(last=True)
                except TimeoutError:
                    pass
                except CaptureConnectionError:
                    # a writer that failed while we stopped recorded why (fail()): that
                    # error is the run's, not "the capture writer stopped"
                    if self.failure is None:
                        raise
            await node.close()
